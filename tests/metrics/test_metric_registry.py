"""The metric registry: the evaluator's engine (metrics_from_ranks) and the public *_from_ranks views are the same
implementation, so they give bit-identical numbers; result order and group validation."""

from __future__ import annotations

import pytest
import torch

from pml_suprank.metrics import functional as F
from pml_suprank.metrics.registry import METRIC_GROUPS, METRICS, TOP_K_GROUPS, metrics_from_ranks


def _ranks(seed=0, Q=9, N=50, L=3):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 6, (Q, N), generator=g).float() / 5  # many exact ties
    levels = torch.randint(0, L + 1, (Q, N), generator=g)
    levels[0] = 0  # a query without relevant items
    mask = torch.rand(Q, N, generator=g) > 0.1
    return F.retrieval_ranks(scores, levels, mask, num_levels=L)


def _same(a, b):
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))


@pytest.mark.parametrize("seed", range(3))
def test_engine_and_views_are_bit_identical(seed):
    ranks = _ranks(seed)
    L = ranks.num_levels
    w = [0.2, 0.3, 0.5]
    out = metrics_from_ranks(ranks, k_values=(1, 3, 7), groups=tuple(METRIC_GROUPS), alpha=0.5, level_weights=w)
    views = {
        "ap": F.ap_from_ranks(ranks),
        "map_at_r": F.map_at_r_from_ranks(ranks),
        "r_precision": F.r_precision_from_ranks(ranks),
        "precision_at_1": F.precision_at_k_from_ranks(ranks, 1),
        "h_ap": F.hap_from_ranks(ranks, alpha=0.5),
        "ndcg": F.ndcg_from_ranks(ranks),
        "asi": F.asi_from_ranks(ranks),
        "sum_w_ap": F.weighted_sum_ap_from_ranks(ranks, w),
        "mean_label_ap": F.ap_from_ranks(ranks),  # its one-label reduction: the fine AP
    }
    for k in (1, 3, 7):
        views[f"recall_at_{k}"] = F.recall_at_k_from_ranks(ranks, k)
        views[f"precision_at_{k}"] = F.precision_at_k_from_ranks(ranks, k)
        views[f"true_recall_at_{k}"] = F.true_recall_at_k_from_ranks(ranks, k)
        views[f"map_at_{k}"] = F.map_at_k_from_ranks(ranks, k)
    for h in range(L):
        views[f"ap_level{h}"] = F.ap_from_ranks(ranks, L - h)
        views[f"map_at_r_level{h}"] = F.map_at_r_from_ranks(ranks, L - h)
        for k in (1, 3, 7):
            views[f"recall_at_{k}_level{h}"] = F.recall_at_k_from_ranks(ranks, k, L - h)
    assert set(out) == set(views)
    for key, value in views.items():
        assert _same(out[key], value), key
    # the Property-1 H-AP is ΣwAP (SupRank supplementary B-B3), up to rounding
    assert torch.allclose(F.property1_hap(ranks, w), out["sum_w_ap"], atol=1e-12, equal_nan=True)


def test_result_order_and_validation():
    ranks = _ranks(L=2)
    out = metrics_from_ranks(ranks, k_values=(5, 1), groups=("asi", "recall_at_k_level", "map_at_k", "ap", "ap_level"))
    assert list(out) == [
        "ap", "map_at_1", "map_at_5",  # fine level: cutoff-free first, then by increasing k
        "ap_level0", "recall_at_1_level0", "recall_at_5_level0",  # each hierarchy level
        "ap_level1", "recall_at_1_level1", "recall_at_5_level1",
        "asi",  # hierarchical metrics last
    ]  # fmt: skip
    assert metrics_from_ranks(ranks) == {}
    with pytest.raises(ValueError, match="unknown metric name"):
        metrics_from_ranks(ranks, groups=("mAP",))


def test_top_k_groups_and_flags():
    assert TOP_K_GROUPS == ("precision_at_1", "recall_at_k", "precision_at_k", "recall_at_k_level")
    assert [s.name for s in METRICS.values() if s.hierarchical] == ["h_ap", "ndcg", "asi", "sum_w_ap"]
    assert METRICS["recall_at_k_level"].format_key(10, 1) == "recall_at_10_level1"
    assert METRICS["ap_level"].report_key == "ap_level" and METRICS["recall_at_k"].report_key == "recall_at_1"
    assert dict(METRICS["map_at_r"].pml_names) == {"map_at_r": "mean_average_precision_at_r"}


def test_empty_query_set():
    scores, levels = torch.zeros(0, 5), torch.zeros(0, 5, dtype=torch.long)
    for fn in (F.average_precision, F.ndcg, F.asi, F.hierarchical_average_precision, F.weighted_sum_ap):
        assert fn(scores, levels, num_levels=2).shape == (0,)
