"""Tests of the sorted-score hierarchical rank kernels (pml_suprank.ranking.hierarchical, .levels)."""

from __future__ import annotations

import math

import pytest
import torch
from _hierarchical_dense import dense_hap, dense_ndcg, dense_ranks

from pml_suprank.ranking import SupRankStep
from pml_suprank.ranking.hierarchical import hierarchical_ranks, sup_hap_scores, sup_ndcg_scores
from pml_suprank.ranking.steps import HRankParams
from pml_suprank.relevance import ideal_dcg, level_counts, level_matrix, pop_relevance

SOP_STEP = dict(tau=0.01, rho=100.0, delta=0.05, start=0.5, offset=1.44)
HRANK = dict(nu=25.0, mu=0.5, gamma=10.0)


def _golden(ranking_golden, case_id):
    case = next(c for c in ranking_golden["loss_cases"] if c["id"] == case_id)
    return case, ranking_golden["inputs"][case_id.split("/")[0]]


def _golden_setup(inp, dtype, device="cpu"):
    emb = torch.tensor(inp["embeddings"], dtype=dtype, device=device, requires_grad=True)
    labels = torch.tensor(inp["labels"], device=device)
    if "ref_embeddings" in inp:
        ref = torch.tensor(inp["ref_embeddings"], dtype=dtype, device=device)
        ref_labels = torch.tensor(inp["ref_labels"], device=device)
    else:
        ref, ref_labels = emb, labels
    levels = level_matrix(labels, ref_labels)
    return emb, emb @ ref.T, levels, labels.shape[1]


@pytest.mark.parametrize("inp_id", ["A_b12_L2", "C_b12_L2_ties", "D_b8_mem32_L2"])
def test_ranks_match_reference_rank_tables(ranking_golden, inp_id):
    """rank, H-rank⁺ and the normalisation of the reference (float64), at every relevant item."""
    case, inp = _golden(ranking_golden, f"{inp_id}/SupHAP_alpha1")
    res = case["results"]["float64"]
    _, scores, levels, L = _golden_setup(inp, torch.float64)
    rel = pop_relevance(level_counts(levels, L), 1.0, dtype=torch.float64)
    rank, rank_plus = hierarchical_ranks(scores, levels, rel, L, step=SupRankStep(**SOP_STEP))
    pos = levels > 0
    scale = L / (L - 1)  # the reference weights levels by (l / (L - 1))^α instead of (l / L)^α
    torch.testing.assert_close(rank[pos], torch.tensor(res["rank"], dtype=torch.float64)[pos], rtol=0, atol=1e-10)
    expected_plus = torch.tensor(res["rank_plus"], dtype=torch.float64)[pos]
    torch.testing.assert_close(rank_plus[pos] * scale, expected_plus, rtol=0, atol=1e-7)
    norm = torch.gather(rel, 1, levels).sum(1) * scale
    torch.testing.assert_close(norm, torch.tensor(res["normalize_factor"], dtype=torch.float64), rtol=0, atol=1e-7)


@pytest.mark.parametrize("inp_id", ["A_b12_L2", "B_b16_L3_singletons", "C_b12_L2_ties", "D_b8_mem32_L2"])
@pytest.mark.parametrize("variant", ["SupHAP_alpha1", "SupHAP_alpha5", "SupHAP_withhrank_alpha1", "SupNDCG"])
def test_per_query_scores_match_reference(ranking_golden, dtype, device, inp_id, variant):
    case, inp = _golden(ranking_golden, f"{inp_id}/{variant}")
    res = case["results"]["float64" if dtype == torch.float64 else "float32"]
    emb, scores, levels, L = _golden_setup(inp, dtype, device)
    step = SupRankStep(**SOP_STEP)
    if variant == "SupNDCG":
        score, has_pos = sup_ndcg_scores(scores, levels, L, step=step)
    else:
        alpha = 5.0 if "alpha5" in variant else 1.0
        rel = pop_relevance(level_counts(levels, L), alpha, dtype=dtype)
        hrank = HRankParams(**HRANK) if "withhrank" in variant else None
        score, has_pos = sup_hap_scores(scores, levels, rel, L, step=step, hrank=hrank)
    assert bool(has_pos.all())
    tol = 1e-7 if dtype == torch.float64 else 1e-5
    expected = torch.tensor(res["per_query_score"], dtype=dtype, device=device)
    torch.testing.assert_close(score, expected, rtol=0, atol=tol)
    (1 - score).mean().backward()
    expected_grad = torch.tensor(res["grad_embeddings"], dtype=dtype, device=device)
    torch.testing.assert_close(emb.grad, expected_grad, rtol=0, atol=tol)


def _random_problem(seed, B=7, N=40, L=3, ties=True, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(B, N, generator=g, dtype=dtype) * 0.6 - 0.1
    if ties:  # exact ties, and gaps straddling the sigmoid window / δ
        scores[:, 5] = scores[:, 3]
        scores[:, 9] = scores[:, 2]
        scores[:, 11] = scores[:, 4] + 0.05
    levels = torch.randint(0, L + 1, (B, N), generator=g)
    valid = torch.rand(B, N, generator=g) > 0.15
    return scores, levels, valid


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_hrank", [False, True])
def test_kernel_matches_dense_definition(seed, with_hrank):
    scores, levels, valid = _random_problem(seed)
    L = 3
    rel = pop_relevance(level_counts(levels, L, mask=valid), 1.0, dtype=torch.float64)
    step = dict(tau=0.01, rho=100.0, delta=0.05, start=0.5, offset=None)
    hr = HRANK if with_hrank else None
    s1 = scores.clone().requires_grad_(True)
    s2 = scores.clone().requires_grad_(True)
    rank, rank_plus = hierarchical_ranks(
        s1, levels, rel, L, valid, SupRankStep(**step), HRankParams(**hr) if hr else None, chunk_size=700
    )
    d_rank, d_plus = dense_ranks(s2, levels, rel, valid, step, hr)
    pos = valid & (levels > 0)
    torch.testing.assert_close(rank[pos], d_rank[pos], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rank_plus[pos], d_plus[pos], rtol=1e-12, atol=1e-12)
    w1, w2 = torch.rand_like(rank), torch.rand_like(rank)
    ((rank * w1)[pos].sum() + (rank_plus * w2)[pos].sum()).backward()
    ((d_rank * w1)[pos].sum() + (d_plus * w2)[pos].sum()).backward()
    torch.testing.assert_close(s1.grad, s2.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("offset, tau", [(None, 0.02), (1.44, 0.02), (1.0, 0.02), (None, 0.001)])
def test_hap_and_ndcg_match_dense(offset, tau):
    """Includes δ > 50τ (τ = 0.001), where the sigmoid clamp acts inside the window (generic window path)."""
    scores, levels, valid = _random_problem(5, B=5, N=30, L=2)
    step = dict(tau=tau, rho=50.0, delta=0.03, start=0.5 if offset != 1.0 else 0.0, offset=offset)
    rel = pop_relevance(level_counts(levels, 2, mask=valid), 2.0, dtype=torch.float64)
    hap, has = sup_hap_scores(scores, levels, rel, 2, valid, SupRankStep(**step))
    torch.testing.assert_close(hap[has], dense_hap(scores, levels, rel, valid, step)[has], rtol=1e-12, atol=1e-12)
    ndcg, has = sup_ndcg_scores(scores, levels, 2, valid, SupRankStep(**step))
    torch.testing.assert_close(ndcg[has], dense_ndcg(scores, levels, 2, valid, step)[has], rtol=1e-12, atol=1e-12)


def test_gradcheck_float64():
    scores, levels, valid = _random_problem(3, B=2, N=12, L=2, ties=False)
    rel = pop_relevance(level_counts(levels, 2, mask=valid), 1.0, dtype=torch.float64)
    s = scores.clone().requires_grad_(True)
    step = SupRankStep(tau=0.05, rho=10.0, delta=0.05, start=0.5)

    def f(x):
        hap, _ = sup_hap_scores(x, levels, rel, 2, valid, step, HRankParams(**HRANK), chunk_size=40)
        ndcg, _ = sup_ndcg_scores(x, levels, 2, valid, step)
        return hap, ndcg

    assert torch.autograd.gradcheck(f, (s,), eps=1e-7, atol=1e-6)


def test_hand_computed_single_query():
    """One query, references a (level 2), b (level 1, scored 0.02 above a), c (negative far below)."""
    scores = torch.tensor([[0.90, 0.92, 0.10]], dtype=torch.float64)
    levels = torch.tensor([[2, 1, 0]])
    rel = pop_relevance(level_counts(levels, 2), 1.0, dtype=torch.float64)  # rel(2) = 1, rel(1) = 0.5
    torch.testing.assert_close(rel, torch.tensor([[0.0, 0.5, 1.0]], dtype=torch.float64))
    rank, rank_plus = hierarchical_ranks(scores, levels, rel, 2, step=SupRankStep())
    sig2 = 1 / (1 + math.exp(-2.0))  # H⁻(0.02) = 0.5 + σ(0.02 / 0.01)
    assert rank[0, 0].item() == pytest.approx(1 + 0.5 + sig2, abs=1e-12)  # c is 0.8 below: σ(−50) ≈ 2e−22
    assert rank_plus[0, 0].item() == pytest.approx(1 + 0.5, abs=1e-15)  # rel(a) + min(1, 0.5)·H(0.02)
    assert rank[0, 1].item() == pytest.approx(1.0, abs=1e-15)
    assert rank_plus[0, 1].item() == pytest.approx(0.5, abs=1e-15)
    hap, _ = sup_hap_scores(scores, levels, rel, 2, step=SupRankStep())
    assert hap.item() == pytest.approx((1.5 / (1.5 + sig2) + 0.5 / 1.0) / 1.5, abs=1e-12)
    # H_s^>: for b, a is 0.02 lower -> γ·(−0.02) = −0.2 weighted by min(0.5, 1)
    _, rp = hierarchical_ranks(scores, levels, rel, 2, step=SupRankStep(), hrank=HRankParams())
    assert rp[0, 1].item() == pytest.approx(0.5 + 0.5 * 10 * (-0.02), abs=1e-12)
    # NDCG: gains 3 (a), 1 (b); ideal 3/log2(2) + 1/log2(3)
    ndcg, _ = sup_ndcg_scores(scores, levels, 2, step=SupRankStep())
    expected = (3 / math.log2(2.5 + sig2) + 1 / math.log2(2)) / (3 + 1 / math.log2(3))
    assert ndcg.item() == pytest.approx(expected, abs=1e-12)


def test_ideal_dcg_from_counts():
    counts = torch.tensor([[4, 1, 2]])  # 2 items at level 2, 1 at level 1, 4 negatives
    gains = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)
    expected = 3 / math.log2(2) + 3 / math.log2(3) + 1 / math.log2(4)
    assert ideal_dcg(counts, gains).item() == pytest.approx(expected, abs=1e-12)


def test_queries_without_relevant_items_are_flagged():
    scores = torch.rand(2, 5, dtype=torch.float64)
    levels = torch.tensor([[0, 0, 0, 0, 0], [0, 1, 0, 2, 0]])
    rel = pop_relevance(level_counts(levels, 2), 1.0, dtype=torch.float64)
    hap, has = sup_hap_scores(scores, levels, rel, 2)
    assert has.tolist() == [False, True] and hap[0].item() == 0.0
    ndcg, has = sup_ndcg_scores(scores, levels, 2)
    assert has.tolist() == [False, True] and ndcg[0].item() == 0.0


def test_window_truncation_is_below_machine_precision():
    """Pairs far below the sigmoid window are skipped; the result equals the dense value to ~eps."""
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(2, 300, generator=g, dtype=torch.float64) * 2 - 1  # wide spread: most pairs skipped
    levels = torch.randint(0, 3, (2, 300), generator=g)
    rel = pop_relevance(level_counts(levels, 2), 1.0, dtype=torch.float64)
    rank, _ = hierarchical_ranks(scores, levels, rel, 2)
    d_rank, _ = dense_ranks(scores, levels, rel, step=dict(offset=None))
    pos = levels > 0
    torch.testing.assert_close(rank[pos], d_rank[pos], rtol=1e-13, atol=0)


def test_sorted_levels_counts_and_sums_match_brute_force():
    """SortedLevels: positions from one search in A_{L+1} give the per-level counts and prefix sums of A_l."""
    from pml_suprank.ranking.levels import sort_levels

    g = torch.Generator().manual_seed(0)
    bsz, n, L = 4, 30, 3
    scores = torch.round(torch.randn(bsz, n, generator=g, dtype=torch.float64) * 10) / 10  # ties
    levels = torch.randint(0, L + 1, (bsz, n), generator=g)
    valid = torch.rand(bsz, n, generator=g) > 0.2
    sl = sort_levels(scores, levels, valid, L)
    assert sl.num_levels == L and len(sl.keys) == L + 1
    x = scores + 0.05 * torch.randn(bsz, n, generator=g, dtype=torch.float64)
    x[:, :5] = scores[:, :5]  # thresholds equal to scores
    for right in (False, True):
        pos = sl.search(x, right)
        for l in range(1, L + 2):
            member = valid & (levels < l)
            before = sl.members_before(l, pos)
            c, s = sl.count_and_sum(l, None, before)
            assert torch.equal(c, before.double())
            for b in range(bsz):
                m_scores = scores[b][member[b]][None, :]
                below = (m_scores <= x[b, :, None]) if right else (m_scores < x[b, :, None])
                assert torch.equal(before[b], below.sum(1))
                torch.testing.assert_close(s[b], torch.where(below, m_scores, 0.0).sum(1), rtol=0, atol=1e-12)
            c_hi, _ = sl.count_and_sum(l, before, None)
            assert torch.equal(c_hi + c, sl.counts[l - 1].double().expand_as(c))
