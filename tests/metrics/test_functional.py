"""Exact functional metrics: naive full-sort reference, hand-computed cases, ties, properties, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _metrics_naive import column, isclose, naive_metrics

from pml_suprank.metrics import functional as F
from pml_suprank.metrics import ranks as R
from pml_suprank.relevance import level_counts, property1_relevance


def _problem(seed, Q=6, N=40, L=3, ties=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    if ties:
        scores = torch.randint(0, 5, (Q, N), generator=g).to(dtype) / 4
    else:
        scores = torch.randn(Q, N, generator=g, dtype=dtype)
    levels = torch.randint(0, L + 1, (Q, N), generator=g)
    mask = torch.rand(Q, N, generator=g) > 0.15
    return scores, levels, mask


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "num_bins, counting", [(None, "auto"), (1, "histogram"), (7, "histogram"), (None, "histogram"), (None, "search")]
)
@pytest.mark.slow
def test_all_metrics_match_naive_full_sort(seed, num_bins, counting, dtype):
    L = 3
    scores, levels, mask = _problem(seed, ties=seed % 2 == 0, dtype=dtype)
    ranks = F.retrieval_ranks(scores, levels, mask, num_levels=L, num_bins=num_bins, counting=counting)
    ref = naive_metrics(scores.double().numpy(), levels.numpy(), mask.numpy(), L)
    for m in range(1, L + 1):
        assert isclose(F.ap_from_ranks(ranks, m), column(ref, f"ap{m}"))
        assert isclose(F.map_at_r_from_ranks(ranks, m), column(ref, f"mapr{m}"))
        assert isclose(F.r_precision_from_ranks(ranks, m), column(ref, f"rprec{m}"))
        for k in (1, 2, 4):
            assert isclose(F.recall_at_k_from_ranks(ranks, k, m), column(ref, f"r@{k}_{m}"))
            assert isclose(F.precision_at_k_from_ranks(ranks, k, m), column(ref, f"p@{k}_{m}"))
            assert isclose(F.true_recall_at_k_from_ranks(ranks, k, m), column(ref, f"tr@{k}_{m}"))
            assert isclose(F.map_at_k_from_ranks(ranks, k, m), column(ref, f"map@{k}_{m}"))
    assert isclose(F.hap_from_ranks(ranks), column(ref, "hap"))
    assert isclose(F.ndcg_from_ranks(ranks), column(ref, "ndcg"))
    assert isclose(F.asi_from_ranks(ranks), column(ref, "asi"))
    assert isclose(F.weighted_sum_ap_from_ranks(ranks), column(ref, "swap"))
    # the combined evaluator path gives the same numbers
    groups = (
        "ap",
        "map_at_r",
        "r_precision",
        "precision_at_1",
        "recall_at_k",
        "precision_at_k",
        "true_recall_at_k",
        "map_at_k",
        "h_ap",
        "ndcg",
        "asi",
        "sum_w_ap",
        "ap_level",
        "map_at_r_level",
        "recall_at_k_level",
    )
    out = F.metrics_from_ranks(ranks, k_values=(1, 2, 4), groups=groups)
    assert isclose(out["ap"], column(ref, f"ap{L}"))
    assert isclose(out["map_at_r_level2"], column(ref, "mapr1"))
    assert isclose(out["r_precision"], column(ref, f"rprec{L}"))
    assert isclose(out["precision_at_1"], column(ref, f"p@1_{L}"))
    assert isclose(out["map_at_4"], column(ref, f"map@4_{L}"))
    assert isclose(out["true_recall_at_2"], column(ref, f"tr@2_{L}"))
    assert isclose(out["recall_at_4_level1"], column(ref, "r@4_2"))
    assert isclose(out["h_ap"], column(ref, "hap"))
    assert isclose(out["sum_w_ap"], column(ref, "swap"))
    assert isclose(out["ndcg"], column(ref, "ndcg"))
    assert isclose(out["asi"], column(ref, "asi"))


@pytest.mark.parametrize("counting", ["search", "histogram"])
def test_signed_zero_negative_scores_and_cross_level_ties(counting, dtype):
    # scores drawn from {-1, -0.5, -0.0, 0.0, 0.5}: -0.0 == 0.0 must tie (the search path compares integer images of
    # the floats), negatives tie with relevant items of every level, and relevant items tie across levels
    g = torch.Generator().manual_seed(11)
    values = torch.tensor([-1.0, -0.5, -0.0, 0.0, 0.5], dtype=dtype)
    scores = values[torch.randint(0, 5, (8, 60), generator=g)]
    levels = torch.randint(0, 4, (8, 60), generator=g)
    mask = torch.rand(8, 60, generator=g) > 0.1
    ranks = F.retrieval_ranks(scores, levels, mask, num_levels=3, counting=counting)
    ref = naive_metrics(scores.double().numpy(), levels.numpy(), mask.numpy(), 3)
    for m in (1, 2, 3):
        assert isclose(F.ap_from_ranks(ranks, m), column(ref, f"ap{m}"))
    assert isclose(F.hap_from_ranks(ranks), column(ref, "hap"))
    assert isclose(F.ndcg_from_ranks(ranks), column(ref, "ndcg"))
    assert isclose(F.asi_from_ranks(ranks), column(ref, "asi"))
    # only the lowest relevant score matters for pruning: negatives far below it change nothing
    low = scores.masked_fill(levels == 0, -1e30)
    lowered = F.retrieval_ranks(low, levels, mask, num_levels=3, counting=counting)
    expected = F.retrieval_ranks(
        scores.masked_fill(levels == 0, -1e30), levels, mask, num_levels=3, counting="histogram"
    )
    assert torch.equal(lowered.positions, expected.positions)
    with pytest.raises(ValueError, match="counting"):
        F.retrieval_ranks(scores, levels, counting="sort")


def test_search_counting_compares_mixed_dtypes_exactly():
    # float64 negatives against float32 relevant scores: no rounding of the negatives to float32
    rel = torch.tensor([[0.5, 0.25, 0.125]], dtype=torch.float32)
    lev = torch.tensor([[1, 2, 1]])
    eps = 1e-12  # invisible in float32: 0.5 - eps rounds to 0.5
    neg = torch.tensor([[0.5 - eps, 0.5, 0.25 + eps, 0.0, float("-inf")]], dtype=torch.float64)
    levels, positions = F.rank_relevant_items(neg, rel, lev, counting="search")
    # ranking: 0.5 (neg, tie first), 0.5 (rel), 0.5 - eps, 0.25 + eps, 0.25 (rel), 0.125 (rel), 0.0, -inf
    assert levels.tolist() == [[1, 2, 1]]
    assert positions.tolist() == [[2, 5, 6]]


def test_key_encoding_sort_and_decode():
    # int64 keys: score descending, then level ascending, padding last; the row sort (numpy in place on contiguous
    # CPU tensors, torch.sort otherwise) and the decoding of the scores are exact
    scores = torch.tensor([[0.5, -0.0, 0.0, -1.5, 0.5, 3.0], [1e-38, -1e-38, 2.0, 2.0, 0.25, 0.0]])
    levels = torch.tensor([[2, 1, 3, 1, 1, 0], [1, 2, 2, 1, 0, 3]])
    keys = R._pessimistic_keys(scores, levels)
    fast = R._sort_rows(keys.clone())
    slow = R._sort_rows(keys.clone().T.contiguous().T)  # non-contiguous: torch.sort
    assert torch.equal(fast, slow)
    assert (fast & 63).tolist() == [[1, 2, 1, 3, 1, 0], [1, 2, 1, 3, 2, 0]]
    valid = (fast & 63) > 0
    decoded = R._decode_key(fast)[valid]
    expected = [0.5, 0.5, 0.0, 0.0, -1.5, 2.0, 2.0, 1e-38, 0.0, -1e-38]  # -0.0 decodes as +0.0 (equal)
    assert torch.equal(decoded, torch.tensor(expected))


def test_hand_computed_binary_case():
    # ranking (by score): neg(0.9), pos(0.8), neg(0.5), pos(0.3), pos(0.1)
    scores = torch.tensor([[0.8, 0.9, 0.3, 0.5, 0.1]])
    levels = torch.tensor([[1, 0, 1, 0, 1]])
    ap = F.average_precision(scores, levels)
    assert ap.item() == pytest.approx((1 / 2 + 2 / 4 + 3 / 5) / 3, abs=1e-12)
    assert F.map_at_r(scores, levels).item() == pytest.approx((1 / 2) / 3, abs=1e-12)
    assert F.recall_at_k(scores, levels, 1).item() == 0.0
    assert F.recall_at_k(scores, levels, 2).item() == 1.0
    assert F.precision_at_k(scores, levels, 4).item() == pytest.approx(0.5)
    assert F.true_recall_at_k(scores, levels, 4).item() == pytest.approx(2 / 3)
    assert F.r_precision(scores, levels).item() == pytest.approx(1 / 3)
    assert F.map_at_k(scores, levels, 2).item() == pytest.approx((1 / 2) / 2)


def test_hand_computed_hierarchical_case():
    # L = 2; ranking: level 1 (0.9), level 2 (0.8), negative (0.7), level 2 (0.6)
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6]])
    levels = torch.tensor([[1, 2, 0, 2]])
    # pop relevance: rel(2) = 1/2 per item, rel(1) = (1/2)/1
    r1, r2 = 0.5, 0.5
    h_rank = [r1, min(r2, r1) + r2, min(r2, r1) + r2 + r2]
    expected = (h_rank[0] / 1 + h_rank[1] / 2 + h_rank[2] / 4) / (r1 + 2 * r2)
    assert F.hierarchical_average_precision(scores, levels).item() == pytest.approx(expected, abs=1e-12)
    dcg = (2**1 - 1) / math.log2(2) + (2**2 - 1) / math.log2(3) + (2**2 - 1) / math.log2(5)
    idcg = 3 / math.log2(2) + 3 / math.log2(3) + 1 / math.log2(4)
    assert F.ndcg(scores, levels).item() == pytest.approx(dcg / idcg, abs=1e-12)
    # ASI: N+ = 3, ideal [2, 2, 1]; SI(1) = 0, SI(2) = |{1,2} ∩ {2,2}|/2 = 1/2, SI(3) = |{1,2,0} ∩ {2,2,1}|/3 = 2/3
    assert F.asi(scores, levels).item() == pytest.approx((0 + 1 / 2 + 2 / 3) / 3, abs=1e-12)


def test_ties_are_pessimistic_and_equal_relevance_ties_are_free():
    # a negative tied with a positive ranks first
    scores = torch.tensor([[0.5, 0.5, 0.1]])
    assert F.average_precision(scores, torch.tensor([[1, 0, 1]])).item() == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert F.average_precision(scores, torch.tensor([[0, 1, 1]])).item() == pytest.approx((1 / 2 + 2 / 3) / 2)
    # tied positives do not penalise each other
    assert F.average_precision(torch.tensor([[0.5, 0.5, 0.1]]), torch.tensor([[1, 1, 0]])).item() == 1.0
    # ... but a tied negative still comes first
    assert F.average_precision(torch.tensor([[0.5, 0.5, 0.5]]), torch.tensor([[1, 1, 0]])).item() == pytest.approx(
        (1 / 2 + 2 / 3) / 2
    )
    # hierarchical: the less relevant of two tied items ranks first
    s = torch.tensor([[0.7, 0.7]])
    worst = F.ndcg(torch.tensor([[0.8, 0.7]]), torch.tensor([[1, 2]]))
    assert F.ndcg(s, torch.tensor([[2, 1]])).item() == pytest.approx(worst.item())
    assert F.ndcg(s, torch.tensor([[1, 2]])).item() == pytest.approx(worst.item())
    # many exactly tied relevant items (exercises the batched binary-search path)
    scores = torch.cat([torch.full((1, 40), 0.25), torch.linspace(0, 1, 30)[None]], 1)
    levels = torch.cat(
        [
            torch.randint(1, 3, (1, 40), generator=torch.Generator().manual_seed(0)),
            torch.zeros(1, 30, dtype=torch.long),
        ],
        1,
    )
    ranks = F.retrieval_ranks(scores, levels, num_levels=2, num_bins=3)
    ref = naive_metrics(scores.double().numpy(), levels.numpy(), None, 2)
    assert isclose(F.ap_from_ranks(ranks, 1), column(ref, "ap1"))
    assert isclose(F.hap_from_ranks(ranks), column(ref, "hap"))


def test_invariant_to_gallery_permutation():
    scores, levels, mask = _problem(3, ties=True)
    perm = torch.randperm(scores.shape[1], generator=torch.Generator().manual_seed(1))
    for fn in (F.average_precision, F.hierarchical_average_precision, F.ndcg, F.asi, F.map_at_r):
        a = fn(scores, levels, mask, num_levels=3)
        b = fn(scores[:, perm], levels[:, perm], mask[:, perm], num_levels=3)
        assert isclose(a, b, 1e-12)


def test_hap_equals_ap_with_one_level():
    scores, levels, mask = _problem(4, L=1, ties=True)
    assert isclose(
        F.hierarchical_average_precision(scores, levels, mask, num_levels=1),
        F.average_precision(scores, levels, mask, num_levels=1),
        1e-12,
    )
    # a bool relevance is the binary case
    assert isclose(F.average_precision(scores, levels > 0, mask), F.average_precision(scores, levels, mask), 0)


def test_sum_w_ap_equals_property1_hap():
    scores, levels, mask = _problem(5, L=3, ties=True)
    w = [0.2, 0.3, 0.5]
    ranks = F.retrieval_ranks(scores, levels, mask, num_levels=3)
    table = property1_relevance(level_counts(levels, 3, mask), w, dtype=torch.float64)
    assert isclose(F.hap_from_ranks(ranks, relevance=table), F.weighted_sum_ap_from_ranks(ranks, w), 1e-12)
    assert isclose(F.property1_hap(ranks, w), F.weighted_sum_ap(scores, levels, mask, weights=w), 1e-12)


def test_queries_without_positives_are_nan():
    scores = torch.tensor([[0.3, 0.2], [0.1, 0.4]])
    levels = torch.tensor([[0, 0], [1, 0]])
    ap = F.average_precision(scores, levels)
    assert math.isnan(ap[0].item()) and ap[1].item() == 0.5
    assert math.isnan(F.ndcg(scores, levels)[0].item())
    assert math.isnan(F.hierarchical_average_precision(scores, levels)[0].item())


def test_mask_removes_items():
    scores = torch.tensor([[0.9, 0.8, 0.1]])
    levels = torch.tensor([[0, 1, 1]])
    mask = torch.tensor([[False, True, True]])
    assert F.average_precision(scores, levels, mask).item() == 1.0


def test_bad_input():
    s = torch.rand(2, 3)
    with pytest.raises(ValueError, match="levels must have the shape"):
        F.average_precision(s, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer or bool"):
        F.average_precision(s, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        F.average_precision(torch.tensor([[float("nan"), 0.0]]), torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match=r"levels must lie in \[0, num_levels=1\]"):
        F.average_precision(s, torch.full((2, 3), 2), num_levels=1)
    with pytest.raises(ValueError, match="min_level"):
        F.average_precision(s, torch.ones(2, 3, dtype=torch.long), min_level=2)
    with pytest.raises(ValueError, match="k must be a positive int"):
        F.recall_at_k(s, torch.ones(2, 3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="relevance must have shape"):
        F.hierarchical_average_precision(s, torch.ones(2, 3, dtype=torch.long), relevance=torch.ones(2, 5))
    with pytest.raises(TypeError, match="mask must be a bool"):
        F.average_precision(s, torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3))
    with pytest.raises(ValueError, match="weights must be 1"):
        F.weighted_sum_ap(s, torch.ones(2, 3, dtype=torch.long), weights=[1.0, 2.0])


def test_device_and_dtype(device, dtype):
    scores, levels, mask = _problem(7, dtype=dtype)
    cpu = F.ndcg(scores, levels, mask)
    out = F.ndcg(scores.to(device), levels.to(device), mask.to(device))
    assert out.device.type == device.type
    assert np.allclose(out.cpu().numpy(), cpu.numpy(), equal_nan=True)
