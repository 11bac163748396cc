"""Tests of the separable sigmoid series (pml_suprank.ranking.tail), and of the hierarchical kernel where the
series used to serve it (ties on a grid at the branch boundaries, small τ, float32, gradcheck)."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_dense import dense_ranks

from pml_suprank.ranking import SupRankStep
from pml_suprank.ranking.hierarchical import HRankParams, hierarchical_ranks
from pml_suprank.ranking.tail import CUT, SigmoidTail, bands, num_terms_for
from pml_suprank.relevance import level_counts, pop_relevance

TAU, DELTA = 0.01, 0.05


def _problem(seed, spread, ties, num_rows=4, n=60, m=50):
    """Sorted lists (``+inf`` past a random number of members), items, and the ranges the caller's contract
    allows: lower tail ``x < s − cτ``, upper part ``s + cτ < x <= s + δ``."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(num_rows, n, generator=g, dtype=torch.float64) * spread
    s = torch.randn(m, generator=g, dtype=torch.float64) * spread
    if ties:  # a coarse grid: many exact ties among list items, items and list items, and at ±cτ / δ
        keys = torch.round(keys / TAU) * TAU
        s = torch.round(s / TAU) * TAU
    keys = keys.sort(1).values
    members = torch.randint(n // 2, n + 1, (num_rows,), generator=g)
    keys = torch.where(torch.arange(n)[None, :] < members[:, None], keys, float("inf"))
    rows = torch.randint(0, num_rows, (m,), generator=g)
    cut = CUT * TAU
    lists = keys[rows].contiguous()
    lo_end = torch.searchsorted(lists, (s - cut)[:, None].contiguous()).squeeze(1)  # x < s − cτ
    hi = torch.searchsorted(lists, (s + DELTA)[:, None].contiguous(), right=True).squeeze(1)
    up_begin = torch.searchsorted(lists, (s + cut)[:, None].contiguous(), right=True).squeeze(1)  # x > s + cτ
    up_begin = torch.minimum(torch.maximum(up_begin, lo_end), hi)
    finite = torch.isfinite(keys)
    row_min = torch.where(finite, keys, float("inf")).amin(1)
    row_max = torch.where(finite, keys, float("-inf")).amax(1)
    anchors, band = bands(row_min, row_max, s, rows, TAU, num_terms_for(torch.float64))
    return keys, s, rows, lo_end, up_begin, hi, anchors, band


def _elementwise(keys, s, rows, lo_end, up_begin, up_end):
    t = (keys[rows] - s[:, None]) / TAU
    p = torch.arange(keys.shape[1])[None, :]
    inside = (p < lo_end[:, None]) | ((p >= up_begin[:, None]) & (p < up_end[:, None]))
    return torch.where(inside, torch.sigmoid(torch.where(inside, t, 0.0)), 0.0).sum(1)


def _tail(keys, s, rows, lo_end, up_begin, up_end, anchors, band, chunk_size=1 << 21):
    k = num_terms_for(torch.float64)
    return SigmoidTail.apply(keys, s, rows, lo_end, up_begin, up_end, anchors, band, TAU, k, chunk_size)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("spread, ties", [(0.05, False), (0.6, False), (0.05, True), (0.6, True)])
def test_series_matches_elementwise_sum(seed, spread, ties):
    """Value and gradient agree with the elementwise sigmoid sum to 1e-12 (spread 0.6: several score bands)."""
    keys, s, rows, lo_end, up_begin, hi, anchors, band = _problem(seed, spread, ties)
    if spread > 0.5:
        assert anchors.shape[0] > 1
    assert bool((lo_end > 0).any()) and bool((up_begin < hi).any())
    k1, s1 = keys.clone().requires_grad_(True), s.clone().requires_grad_(True)
    k2, s2 = keys.clone().requires_grad_(True), s.clone().requires_grad_(True)
    out = _tail(k1, s1, rows, lo_end, up_begin, hi, anchors, band)
    ref = _elementwise(k2, s2, rows, lo_end, up_begin, hi)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    w = torch.rand(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) - 0.5
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(s1.grad, s2.grad, rtol=0, atol=1e-12)
    finite = torch.isfinite(keys)
    torch.testing.assert_close(k1.grad[finite], k2.grad[finite], rtol=0, atol=1e-12)


def test_series_gradcheck():
    keys, s, rows, lo_end, up_begin, hi, anchors, band = _problem(3, 0.3, False, num_rows=2, n=14, m=9)
    # keep the perturbed keys inside their contract ranges: no key within 1e-5 of a range boundary
    assert bool((lo_end > 0).any())

    def fn(k, x):
        return _tail(k, x, rows, lo_end, up_begin, hi, anchors, band)

    keys = keys.requires_grad_(True)
    s = s.requires_grad_(True)
    assert torch.autograd.gradcheck(fn, (keys, s), eps=1e-7, atol=1e-7)


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


def test_series_in_row_blocks_matches():
    """Tables built a few rows at a time (bounded memory) give the same values and gradients."""
    keys, s, rows, lo_end, up_begin, hi, anchors, band = _problem(4, 0.6, True, num_rows=7)
    k1, s1 = keys.clone().requires_grad_(True), s.clone().requires_grad_(True)
    out = _tail(k1, s1, rows, lo_end, up_begin, hi, anchors, band)
    (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64)).sum().backward()
    k2, s2 = keys.clone().requires_grad_(True), s.clone().requires_grad_(True)
    out2 = _tail(k2, s2, rows, lo_end, up_begin, hi, anchors, band, chunk_size=2 * keys.shape[1])  # 2 rows a block
    (out2 * torch.linspace(-1, 1, out.numel(), dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-13)
    torch.testing.assert_close(s2.grad, s1.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(k2.grad, k1.grad, rtol=0, atol=1e-12)
