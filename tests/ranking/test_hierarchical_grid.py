"""The hierarchical kernel on a grid of ties at the sigmoid's branch boundaries (``±2τ``, ``δ``), at small τ, in
float32 and under gradcheck; the flat window kernel's inclusive upper bound."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_dense import dense_ranks

from pml_suprank.ranking import SupRankStep
from pml_suprank.ranking.hierarchical import hierarchical_ranks
from pml_suprank.ranking.steps import HRankParams
from pml_suprank.relevance import level_counts, pop_relevance


def _hier_problem(seed, ties, B=6, N=70, L=3, spread=0.08):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, N, generator=g, dtype=torch.float64) * spread
    if ties:
        scores = torch.round(scores / 0.005) * 0.005  # many ties, gaps exactly at 2τ = cτ and at δ
    levels = torch.randint(0, L + 1, (B, N), generator=g)
    valid = torch.rand(B, N, generator=g) > 0.1
    return scores, levels, valid


def _ranks(scores, levels, valid, L, rel, hrank=None, step=None, chunk_size=900):
    x = scores.clone().requires_grad_(True)
    rank, rank_plus = hierarchical_ranks(x, levels, rel, L, valid, step or SupRankStep(), hrank, chunk_size=chunk_size)
    return x, rank, rank_plus


def _dense_grad(scores, levels, rel, valid, step, hrank, w):
    x = scores.clone().requires_grad_(True)
    d_rank, _ = dense_ranks(x, levels, rel, valid, step, hrank)
    pos = valid & (levels > 0)
    (d_rank * w)[pos].sum().backward()
    return d_rank.detach(), x.grad


@pytest.mark.parametrize("seed, ties", [(0, False), (1, False), (2, True), (3, True)])
def test_hierarchical_ranks_on_a_grid_match_dense(seed, ties):
    """Many exact ties and score gaps exactly at δ (a coarse grid): the branches of H⁻ are chosen as the dense
    definition chooses them (``t = s_j − s_i`` compared with 0 and δ), values and gradients."""
    L = 3
    scores, levels, valid = _hier_problem(seed, ties)
    rel = pop_relevance(level_counts(levels, L, mask=valid), 1.0, dtype=torch.float64)
    x1, r1, p1 = _ranks(scores, levels, valid, L, rel, HRankParams())
    x2, r2, p2 = _ranks(scores, levels, valid, L, rel, HRankParams(), chunk_size=1)  # one window row a chunk
    pos = valid & (levels > 0)
    torch.testing.assert_close(r1[pos], r2[pos], rtol=0, atol=1e-12)
    torch.testing.assert_close(p1[pos], p2[pos], rtol=0, atol=0)
    w = torch.rand(r1.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    d_rank, d_grad = _dense_grad(scores, levels, rel, valid, dict(offset=None), dict(nu=25.0, mu=0.5, gamma=10.0), w)
    torch.testing.assert_close(r1[pos], d_rank[pos], rtol=0, atol=1e-12)
    (r1 * w)[pos].sum().backward()
    torch.testing.assert_close(x1.grad, d_grad, rtol=0, atol=1e-9)


@pytest.mark.parametrize("tau, delta", [(0.001, 0.04), (0.001, 0.1), (0.0002, 0.01)])
def test_hierarchical_small_tau_gradient_finite(tau, delta):
    """Small τ (``δ > 50τ``: the sigmoid saturates inside the window): values and gradients stay finite and match
    the dense definition (whose clamped sigmoid differs by < 2e-22 per pair)."""
    L = 2
    scores, levels, valid = _hier_problem(6, False, B=8, N=120, L=L, spread=0.2)
    step = SupRankStep(tau=tau, delta=delta)
    x1, r1, _ = _ranks(scores, levels, valid, L, None, step=step)
    pos = valid & (levels > 0)
    w = torch.rand(r1.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rel = pop_relevance(level_counts(levels, L, mask=valid), 1.0, dtype=torch.float64)  # rank only: any relevance
    d_rank, d_grad = _dense_grad(scores, levels, rel, valid, dict(tau=tau, delta=delta), None, w)
    torch.testing.assert_close(r1[pos], d_rank[pos], rtol=0, atol=1e-11)
    (r1 * w)[pos].sum().backward()
    assert torch.isfinite(x1.grad).all()
    torch.testing.assert_close(x1.grad, d_grad, rtol=0, atol=1e-9 * float(d_grad.abs().max()))


def test_hierarchical_float32_close():
    scores, levels, valid = _hier_problem(4, False)
    rel = pop_relevance(level_counts(levels, 3, mask=valid), 1.0, dtype=torch.float32)
    _, r1, _ = _ranks(scores.float(), levels, valid, 3, rel)
    _, r2, _ = _ranks(scores, levels, valid, 3, rel.double())
    pos = valid & (levels > 0)
    torch.testing.assert_close(r1[pos].double(), r2[pos], rtol=2e-6, atol=1e-5)


def test_hierarchical_gradcheck():
    scores, levels, valid = _hier_problem(5, False, B=2, N=16, L=2, spread=0.05)
    rel = pop_relevance(level_counts(levels, 2, mask=valid), 1.0, dtype=torch.float64)
    step = SupRankStep(tau=0.01, rho=100.0, delta=0.05, start=0.5)

    def fn(s):
        rank, rank_plus = hierarchical_ranks(s, levels, rel, 2, valid, step)
        pos = valid & (levels > 0)
        return torch.where(pos, rank_plus / rank, 0.0).sum(1)

    assert torch.autograd.gradcheck(fn, (scores.clone().requires_grad_(True),), eps=1e-7, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flat_window_upper_bound_is_inclusive(dtype):
    """The flat window kernel keeps ``t == upper`` exactly and drops the next representable ``t`` (and ``-inf``)."""
    from pml_suprank.ranking.flat import sigmoid_window_sum

    upper = 5.0
    above = float(torch.nextafter(torch.tensor(upper, dtype=dtype), torch.tensor(float("inf"), dtype=dtype)))
    Z = torch.tensor([[upper, above, float("-inf"), 4.0, -3.0], [upper, 0.5, above, 1.0, 2.0]], dtype=dtype)
    Z = Z.requires_grad_(True)
    z_item = torch.tensor([0.0, 0.0, -1.0], dtype=dtype, requires_grad=True)
    q = torch.tensor([0, 1, 1])
    out = sigmoid_window_sum(Z, q, z_item, upper)
    t = Z[q] - z_item[:, None]
    expected = torch.where(t <= upper, torch.sigmoid(t), 0.0).sum(1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    g1 = torch.autograd.grad(out.sum(), (Z, z_item))
    g2 = torch.autograd.grad(expected.sum(), (Z, z_item))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=1e-7)
