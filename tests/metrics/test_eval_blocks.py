"""Exact evaluation near the score-matrix floor: the CPU row kernels (fused ranking, compiled prefix sums, ASI walk)
give the metrics of a naive full sort per query, with ties and across row-block boundaries; chunks are sized in
bytes per device."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _metrics_naive import naive_query_metrics

import pml_suprank.metrics.from_ranks as FR
from pml_suprank.metrics import RetrievalEvaluator
from pml_suprank.metrics import eval_blocks as EV
from pml_suprank.metrics import ranks as R
from pml_suprank.metrics.ranks import retrieval_ranks
from pml_suprank.metrics.registry import METRICS, metrics_from_ranks
from pml_suprank.relevance import level_matrix

needs_numba = pytest.mark.skipif(not R._compiled_available(), reason="no numba")


def _tied_data(n: int = 90, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """3-level labels; embeddings on a coarse grid, so many scores tie exactly (also across levels)."""
    g = torch.Generator().manual_seed(seed)
    fine = torch.randint(0, 18, (n,), generator=g)
    labels = torch.stack([fine, fine % 6, fine % 2], 1)
    emb = torch.randint(-2, 3, (n, 4), generator=g).float() / 2
    emb[::7] = emb[0]  # identical embeddings: equal scores at every level
    return emb, labels


def _naive(emb: torch.Tensor, labels: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-query metrics of a full pessimistic sort (query removed by index), from the definitions."""
    L = labels.shape[1]
    scores = (emb @ emb.T).double().numpy()
    levels = level_matrix(labels, labels).numpy()
    rows = []
    for q in range(len(emb)):
        keep = np.arange(len(emb)) != q
        rows.append(naive_query_metrics(scores[q, keep], levels[q, keep], L, k_values=(1, 5)))
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def _close(a: torch.Tensor, b: np.ndarray) -> bool:
    a = a.numpy()
    return bool(
        np.array_equal(np.isnan(a), np.isnan(b)) and np.allclose(np.nan_to_num(a), np.nan_to_num(b), atol=1e-12)
    )


@needs_numba
@pytest.mark.parametrize("chunk_size", [1, 7, 40, None])
@pytest.mark.slow
def test_fused_cpu_path_equals_a_full_sort_with_ties_across_blocks(chunk_size):
    emb, labels = _tied_data()
    out = RetrievalEvaluator(k_values=(1, 5), chunk_size=chunk_size).evaluate(emb, labels, return_per_query=True)
    pq, ref = out["per_query"], _naive(emb, labels)
    L = labels.shape[1]
    assert _close(pq["ap"], ref[f"ap{L}"]) and _close(pq["map_at_r"], ref[f"mapr{L}"])
    assert _close(pq["recall_at_5"], ref[f"r@5_{L}"]) and _close(pq["map_at_5"], ref[f"map@5_{L}"])
    for h in range(L):
        assert _close(pq[f"ap_level{h}"], ref[f"ap{L - h}"]), h
        assert _close(pq[f"map_at_r_level{h}"], ref[f"mapr{L - h}"]), h
        assert _close(pq[f"recall_at_1_level{h}"], ref[f"r@1_{L - h}"]), h
    for key, naive in (("h_ap", "hap"), ("ndcg", "ndcg"), ("asi", "asi")):
        assert _close(pq[key], ref[naive]), key


@needs_numba
def test_fused_cpu_path_equals_the_torch_path_per_query():
    emb, labels = _tied_data(120, seed=3)
    fused = RetrievalEvaluator(k_values=(1, 5), chunk_size=13).evaluate(emb, labels, return_per_query=True)
    torch_path = RetrievalEvaluator(k_values=(1, 5), chunk_size=13, counting="histogram").evaluate(
        emb, labels, return_per_query=True
    )
    for key, value in torch_path["per_query"].items():
        got = fused["per_query"][key]
        assert torch.equal(got.isnan(), value.isnan()), key
        assert torch.allclose(got.nan_to_num(), value.nan_to_num(), rtol=0, atol=1e-13), key


@needs_numba
def test_fused_ranks_with_a_separate_gallery_that_contains_the_queries():
    emb, labels = _tied_data(60, seed=5)
    a = RetrievalEvaluator(k_values=(1,), chunk_size=9).evaluate(
        emb[:25], labels[:25], emb, labels, True, ref_includes_query=True
    )
    b = RetrievalEvaluator(k_values=(1,), chunk_size=9, counting="search").evaluate(
        emb[:25], labels[:25], emb, labels, True, ref_includes_query=True
    )
    for key in ("ap", "h_ap", "ndcg", "asi", "map_at_r"):
        assert torch.allclose(a["per_query"][key], b["per_query"][key], rtol=0, atol=1e-13, equal_nan=True), key


def _stats_pair(monkeypatch, ranks, k_values=()):
    compiled = FR.RankStats(ranks, k_values=k_values)
    assert compiled._compiled
    monkeypatch.setattr(FR, "_compiled_available", lambda: False)
    reference = FR.RankStats(ranks)
    monkeypatch.undo()
    return compiled, reference


@needs_numba
@pytest.mark.parametrize("L", [1, 2, 3, 5])
def test_compiled_rank_stats_equal_the_torch_prefix_sums(monkeypatch, L):
    g = torch.Generator().manual_seed(L)
    scores = torch.randint(-4, 5, (30, 150), generator=g).float()  # many ties
    levels = torch.randint(0, L + 1, (30, 150), generator=g) * (torch.rand(30, 150, generator=g) < 0.4)
    levels[0] = 0  # a query without relevant items
    ranks = retrieval_ranks(scores, levels, torch.rand(30, 150, generator=g) > 0.1, num_levels=L)
    fast, ref = _stats_pair(monkeypatch, ranks, k_values=(1, 4))
    # thresholds named at construction, others (one more walk each), R of every level and the whole ranking
    thresholds = [FR.ALL, *(("r", m) for m in range(1, L + 1)), *(("k", k) for k in (1, 3, 4, 10, 149, 150, 10**6))]
    for m in range(1, L + 1):  # bitwise: same operations in the same order
        for at in thresholds:
            assert torch.equal(fast.count_at(m, at), ref.count_at(m, at)), (m, at)
            assert torch.equal(fast.precision_sum_at(m, at), ref.precision_sum_at(m, at)), (m, at)
        # the full prefix sums stay available (torch) and end at the whole-ranking values
        assert torch.equal(fast.cum_precision(m)[:, -1], fast.precision_sum_at(m, FR.ALL))
    assert torch.allclose(fast.level_sums(), ref.level_sums(), rtol=1e-14, atol=0)
    assert torch.allclose(fast.level_discounts(), ref.level_discounts(), rtol=1e-14, atol=0)
    assert torch.equal(fast.level_slots(), ref.level_slots())
    for metric in (FR.hap_from_ranks, FR.ndcg_from_ranks, FR.asi_from_ranks):
        a, b = metric(fast), metric(ref)
        assert torch.equal(a.isnan(), b.isnan()) and bool(a.isnan()[0])
        assert torch.allclose(a.nan_to_num(), b.nan_to_num(), rtol=0, atol=1e-14)


@needs_numba
def test_compiled_rank_stats_write_no_slot_arrays(monkeypatch):
    """The compiled path answers every metric from per-row values: no (Q, P) float64 prefix sum is built."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(20, 300, generator=g)
    levels = torch.randint(0, 3, (20, 300), generator=g)
    ranks = retrieval_ranks(scores, levels, torch.ones(20, 300, dtype=torch.bool), num_levels=2)
    built = []
    monkeypatch.setattr(FR.RankStats, "cum_ge", lambda self, m: built.append(m))
    out = metrics_from_ranks(ranks, k_values=(1, 5), groups=tuple(METRICS))
    assert not built and set(out) >= {"ap", "map_at_r", "recall_at_5", "h_ap", "ndcg", "asi", "sum_w_ap"}


def test_h_ap_ndcg_asi_by_hand():
    # one query, ranking [level 2, negative, level 1, level 2] (positions 1, 3, 4), gallery counts (1, 1, 2)
    ranks = R.RetrievalRanks(
        torch.tensor([[2, 1, 2]]), torch.tensor([[1, 3, 4]]), torch.tensor([[1, 1, 2]]), num_levels=2
    )
    rel = torch.tensor([[0.0, 0.5, 1.0]], dtype=torch.float64)
    # H-rank: item 1 -> 1; item 3 (rel .5) -> .5 + .5 = 1; item 4 -> 1 + .5 + 1 = 2.5; H-AP = (1 + 1/3 + 2.5/4) / 2.5
    assert math.isclose(float(FR.hap_from_ranks(ranks, relevance=rel)), (1 + 1 / 3 + 2.5 / 4) / 2.5, rel_tol=1e-15)
    dcg = 3 / math.log2(2) + 1 / math.log2(4) + 3 / math.log2(5)
    idcg = 3 / math.log2(2) + 3 / math.log2(3) + 1 / math.log2(4)
    assert math.isclose(float(FR.ndcg_from_ranks(ranks)), dcg / idcg, rel_tol=1e-15)
    # ASI over n = 1..3: {2} vs {2}: 1; {2, neg} vs {2, 2}: 1/2; {2, neg, 1} vs {2, 2, 1}: 2/3
    assert math.isclose(float(FR.asi_from_ranks(ranks)), (1 + 1 / 2 + 2 / 3) / 3, rel_tol=1e-15)


def test_chunks_are_sized_in_bytes_for_the_device(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(EV, "_compiled_available", lambda: False)  # the torch kernels: slots cost bytes per level
    rows, width = EV.block_shape(60502, 5042, cpu, 2)
    per_row = 60502 * EV._ENTRY_BYTES["cpu"] + 5042 * EV._SLOT_BYTES["cpu"] * 2
    assert rows * per_row <= EV.CPU_CHUNK_BYTES and rows >= 16 and width == 60502  # whole rows while they fit
    assert EV.block_shape(10, 2, cpu)[0] == EV.CPU_CHUNK_BYTES // (10 * 4 + 2 * 48 * 2 + 1)
    assert EV.block_shape(10**9, 10**6, cpu)[0] == 16  # never fewer than 16 queries
    assert EV.block_shape(60502, 5042, cpu, 2, chunk_size=5) == (5, 60502)
    # the compiled kernels keep three int64 per slot at any number of levels
    monkeypatch.setattr(EV, "_compiled_available", lambda: True)
    assert EV.block_shape(10, 2, cpu)[0] == EV.CPU_CHUNK_BYTES // (10 * 4 + 2 * 24 + 1)
    assert EV.block_shape(10, 2, cpu, levels=5) == EV.block_shape(10, 2, cpu, levels=2)


@needs_numba
def test_cpu_blocks_take_the_fused_kernels(monkeypatch):
    # float32 on the CPU with numba: the row kernels rank every block (no (C, N) gather / scatter / torch counting)
    def unused(*args, **kwargs):
        raise AssertionError("the torch counting path ran")

    emb, labels = _tied_data(50)
    expected = RetrievalEvaluator(k_values=(1,), chunk_size=8).evaluate(emb, labels)
    monkeypatch.setattr(EV, "rank_relevant_items", unused)
    got = RetrievalEvaluator(k_values=(1,), chunk_size=8).evaluate(emb, labels)
    assert got == expected
    with pytest.raises(AssertionError, match="torch counting"):  # the other counters keep the torch path
        RetrievalEvaluator(k_values=(1,), chunk_size=8, counting="histogram").evaluate(emb, labels)


def test_rank_stats_thresholds_are_checked():
    ranks = R.RetrievalRanks(torch.tensor([[2, 1]]), torch.tensor([[1, 3]]), torch.tensor([[1, 1, 1]]), num_levels=2)
    st = FR.RankStats(ranks, k_values=(1, 5))
    assert float(st.count_at(1, ("k", 2))) == 1.0 and float(st.count_at(1, FR.ALL)) == 2.0
    assert float(st.precision_sum_at(1, FR.ALL)) == pytest.approx(1 / 1 + 2 / 3)
    for m, at in ((0, FR.ALL), (3, FR.ALL), (1, ("k", 0)), (1, ("r", 3)), (1, ("x", 1)), (1, "all"), (1, ("k", True))):
        with pytest.raises(ValueError, match="min_level|at must be"):
            st.count_at(m, at)
    with pytest.raises(ValueError, match="k must be a positive int"):
        FR.RankStats(ranks, k_values=(0,))
