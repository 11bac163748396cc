"""The sorted hierarchical kernels in blocks of queries (bounded extra memory: the per-query scores keep each
block's Jacobian from forward, the per-item ranks recompute one block at a time in backward): dense ≡ sorted
(float64, values and gradients) with very large coarse classes whose windows cross the window chunks and whose
queries cross the query blocks, blocks ≡ one block, the block arithmetic and the byte budget per device."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pml_suprank.ranking.query_blocks as qb
from pml_suprank import losses
from pml_suprank.ranking import SupRankStep
from pml_suprank.ranking.dense_hierarchical import dense_sup_hap_scores, dense_sup_ndcg_scores
from pml_suprank.ranking.hierarchical import hierarchical_ranks, sup_hap_scores, sup_ndcg_scores
from pml_suprank.ranking.query_blocks import BLOCK_BYTES_CPU, BYTES_PER_ELEMENT, block_budget_bytes, query_block_rows
from pml_suprank.ranking.steps import HRankParams
from pml_suprank.relevance import level_counts, pop_relevance

STEP = SupRankStep(tau=0.01, rho=100.0, delta=0.05, start=0.5, offset=1.44)
HRANK = HRankParams(nu=25.0, mu=0.5, gamma=10.0)


def _coarse_heavy(seed: int, B: int = 7, N: int = 400, L: int = 2, spread: float = 0.2):
    """Scores within ±spread (every pair inside the sigmoid window for spread ≈ 2τ·50), ~75% of the items in the
    coarsest positive level (a huge super-class), a few at finer levels, exact ties, some invalid items."""
    g = torch.Generator().manual_seed(seed)
    scores = (torch.rand(B, N, generator=g, dtype=torch.float64) * 2 - 1) * spread
    scores[:, 10:20] = scores[:, 0:1]  # ties
    u = torch.rand(B, N, generator=g)
    levels = torch.where(u < 0.75, 1, 0)
    for lv in range(2, L + 1):
        levels = torch.where(u > 1 - 0.04 * lv, lv, levels)
    valid = torch.rand(B, N, generator=g) > 0.05
    rel = pop_relevance(level_counts(levels, L, mask=valid), 1.0, dtype=torch.float64)
    return scores, levels, valid, rel


def _value_and_grad(fn, scores):
    s = scores.clone().requires_grad_(True)
    value, has = fn(s)
    w = torch.linspace(0.5, 1.5, value.numel(), dtype=value.dtype)
    (value * w).sum().backward()
    return value.detach(), s.grad, has


@pytest.mark.parametrize("spread", [0.2, 2.0])  # all pairs in the window / a trained-like spread (series tail)
@pytest.mark.parametrize("with_hrank", [False, True])
def test_hap_blocks_equal_dense_with_a_huge_coarse_class(spread, with_hrank):
    scores, levels, valid, rel = _coarse_heavy(0, spread=spread)
    hrank = HRANK if with_hrank else None
    n, num_levels = scores.shape[1], 2
    blocks = 2 * (num_levels + 1) * n  # 2 queries per block: 4 blocks for 7 queries
    assert query_block_rows(n, num_levels, blocks, 7) == 2
    dense = _value_and_grad(lambda s: dense_sup_hap_scores(s, levels, rel, valid, STEP, hrank), scores)
    ours = _value_and_grad(
        lambda s: sup_hap_scores(s, levels, rel, num_levels, valid, STEP, hrank, chunk_size=257, block_elements=blocks),
        scores,
    )
    assert torch.equal(dense[2], ours[2])
    torch.testing.assert_close(ours[0], dense[0], rtol=0, atol=1e-9)
    torch.testing.assert_close(ours[1], dense[1], rtol=0, atol=1e-9)
    assert dense[1].abs().sum() > 0


@pytest.mark.parametrize("spread", [0.2, 2.0])
@pytest.mark.parametrize("num_levels", [2, 3])
def test_ndcg_blocks_equal_dense_with_a_huge_coarse_class(spread, num_levels):
    scores, levels, valid, _ = _coarse_heavy(1, L=num_levels, spread=spread)
    blocks = 3 * (num_levels + 1) * scores.shape[1]  # 3 queries per block, the last one shorter
    dense = _value_and_grad(lambda s: dense_sup_ndcg_scores(s, levels, num_levels, valid, STEP), scores)
    ours = _value_and_grad(
        lambda s: sup_ndcg_scores(s, levels, num_levels, valid, STEP, chunk_size=300, block_elements=blocks), scores
    )
    torch.testing.assert_close(ours[0], dense[0], rtol=0, atol=1e-9)
    torch.testing.assert_close(ours[1], dense[1], rtol=0, atol=1e-9)


def test_blocks_equal_one_block_ranks_and_rank_plus():
    """Per-query work is independent: blocks of 1 query give the one-block ranks (sum order aside)."""
    scores, levels, valid, rel = _coarse_heavy(2, B=5, N=300)
    out = []
    for blocks in (None, 1):  # default (one block here) / one query per block
        s = scores.clone().requires_grad_(True)
        rank, plus = hierarchical_ranks(s, levels, rel, 2, valid, STEP, HRANK, chunk_size=500, block_elements=blocks)
        (rank.sum() + 0.3 * plus.sum()).backward()
        out.append((rank.detach(), plus.detach(), s.grad))
    assert query_block_rows(300, 2, None, 5) == 5 and query_block_rows(300, 2, 1, 5) == 1
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-12)  # ranks up to ~300: a few ulp


def test_blocked_forward_without_grad_and_relevance_gradient():
    """Without autograd the blocks are evaluated directly; a differentiable relevance table gets its gradient."""
    scores, levels, valid, rel = _coarse_heavy(3, B=4, N=120)
    blocks = 3 * 120
    with torch.no_grad():
        r0, p0 = hierarchical_ranks(scores, levels, rel, 2, valid, STEP, None, block_elements=blocks)
    r1, p1 = hierarchical_ranks(scores, levels, rel, 2, valid, STEP, None, block_elements=None)
    torch.testing.assert_close(r0, r1, rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(p0, p1, rtol=1e-13, atol=1e-12)
    grads = []
    for blocks in (None, 3 * 120):
        r = rel.clone().requires_grad_(True)
        _, plus = hierarchical_ranks(scores, levels, r, 2, valid, STEP, None, block_elements=blocks)
        plus.sum().backward()
        grads.append(r.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-13, atol=1e-12)
    assert grads[0].abs().sum() > 0


def test_query_block_rows_bounds_the_block():
    budget = BLOCK_BYTES_CPU // BYTES_PER_ELEMENT  # (query, list, item) elements of one block on the CPU
    assert query_block_rows(60_000, 2) == budget // (3 * 60_000)
    assert query_block_rows(10**9, 2) == 1  # at least one query, whatever N
    assert query_block_rows(100, 1, 1_000) == 5
    # a problem of at most ONE_BLOCK_FACTOR blocks stays one block
    assert query_block_rows(100, 1, 1_000, 10) == 10 and query_block_rows(100, 1, 1_000, 11) == 5
    assert query_block_rows(4096, 2, None, 256) == 256  # B = 256 vs 4,096 items, 2 levels: one block
    rows = query_block_rows(60_000, 2, None, 256)  # vs 60,000 items: a few blocks of tens of queries
    assert 32 <= rows < 256 and rows * 3 * 60_000 * BYTES_PER_ELEMENT <= BLOCK_BYTES_CPU


def test_block_budget_is_in_bytes_for_the_device(monkeypatch):
    """CPU: a fixed budget; CUDA: a quarter of the free memory (a driver query, no device sync), capped."""
    assert block_budget_bytes("cpu") == BLOCK_BYTES_CPU
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 << 30, 80 << 30))
    assert block_budget_bytes("cuda") == 8 << 30  # 10 GB capped at BLOCK_BYTES_MAX
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 << 30, 80 << 30))
    assert block_budget_bytes("cuda:0") == 2 << 30
    assert query_block_rows(60_000, 2, None, 256, "cuda:0") == 256  # one block on a large accelerator
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 20, 80 << 30))
    assert block_budget_bytes("cuda") == BLOCK_BYTES_CPU  # never below the CPU budget


def test_jacobian_blocks_relevance_gradient_and_no_grad():
    """Several blocks of the per-query H-AP: the level-relevance gradient and the no-grad values equal one block's."""
    scores, levels, valid, rel = _coarse_heavy(4, B=6, N=150)
    out = []
    for blocks in (None, 2 * 3 * 150):  # one block / 3 blocks of 2 queries
        s, r = scores.clone().requires_grad_(True), rel.clone().requires_grad_(True)
        value, _ = sup_hap_scores(s, levels, r, 2, valid, STEP, HRANK, block_elements=blocks)
        (value * torch.arange(1.0, 7.0, dtype=value.dtype)).sum().backward()
        with torch.no_grad():
            plain, _ = sup_hap_scores(scores, levels, rel, 2, valid, STEP, HRANK, block_elements=blocks)
        out.append((value.detach(), plain, s.grad, r.grad))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert out[0][3].abs().sum() > 0


_HIER_LOSSES = {
    "SupHAP": lambda kernel: losses.SupHAPLoss(kernel=kernel),
    "HAPPIER": lambda kernel: losses.HAPPIERLoss(num_classes=30, embedding_size=8, kernel=kernel),
    "SupNDCG": lambda kernel: losses.SupNDCGLoss(kernel=kernel),
}


@pytest.mark.parametrize("name", list(_HIER_LOSSES))
def test_losses_with_a_memory_in_blocks_equal_dense(name, monkeypatch):
    """Through the losses (memory of 250 items, 12 queries in blocks of 2): dense ≡ sorted in float64."""
    g = torch.Generator().manual_seed(7)
    emb = F.normalize(torch.randn(12, 8, generator=g, dtype=torch.float64), dim=1)
    ref = F.normalize(torch.randn(250, 8, generator=g, dtype=torch.float64), dim=1)
    fine, ref_fine = torch.randint(0, 30, (12,), generator=g), torch.randint(0, 30, (250,), generator=g)
    labels, ref_labels = torch.stack([fine, fine % 2], 1), torch.stack([ref_fine, ref_fine % 2], 1)
    monkeypatch.setattr(qb, "BLOCK_BYTES_CPU", 2 * 3 * 250 * BYTES_PER_ELEMENT)  # blocks of 2 queries
    assert query_block_rows(250, 2, None, 12) == 2
    out = []
    for kernel in ("dense", "sorted"):
        torch.manual_seed(0)  # HAPPIER's proxies
        loss_fn = _HIER_LOSSES[name](kernel).to(torch.float64)
        e, r = emb.clone().requires_grad_(True), ref.clone().requires_grad_(True)
        loss = loss_fn(e, labels, ref_emb=r, ref_labels=ref_labels)
        loss.backward()
        out.append((loss.detach(), e.grad, r.grad))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)
    assert out[0][1].abs().sum() > 0
