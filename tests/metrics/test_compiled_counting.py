"""Counting the negatives: the compiled (numba) kernel and the sync-free dense search give exactly the positions of the
torch histogram / search counters (ties, ±inf, masks, several levels, float32 and float64)."""

from __future__ import annotations

import pytest
import torch

from pml_suprank.metrics import RetrievalEvaluator
from pml_suprank.metrics import ranks as R
from pml_suprank.metrics.ranks import COUNTING_METHODS, rank_relevant_items, retrieval_ranks

TORCH_COUNTERS = ("histogram", "search", "dense")


def _counters() -> list:
    compiled = pytest.param("compiled", marks=pytest.mark.skipif(not R._compiled_available(), reason="no numba"))
    return [*TORCH_COUNTERS, compiled]


def _scores(
    seed: int, dtype: torch.dtype, Q: int = 13, N: int = 150
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rounded scores (many exact ties), some ±inf, 3 levels, a mask removing ~10 % of the items."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(Q, N, generator=g, dtype=torch.float64).round(decimals=1).to(dtype)
    scores[scores > 2.0] = float("inf")
    scores[scores < -2.0] = float("-inf")
    levels = torch.randint(0, 4, (Q, N), generator=g)
    levels[0] = 0  # a query without relevant items
    levels[1, :3] = 3  # a query with few relevant items
    levels[1, 3:] = 0
    mask = torch.rand(Q, N, generator=g) > 0.1
    return scores, levels, mask


@pytest.mark.parametrize("counting", _counters())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counters_give_identical_positions(counting, dtype, seed):
    scores, levels, mask = _scores(seed, dtype)
    ref = retrieval_ranks(scores, levels, mask, counting="histogram")
    got = retrieval_ranks(scores, levels, mask, counting=counting)
    assert torch.equal(got.positions, ref.positions)
    assert torch.equal(got.levels, ref.levels)
    assert torch.equal(got.counts, ref.counts)
    assert int(ref.positions.max()) > 0


@pytest.mark.parametrize("num_bins", [None, 1, 2, 5, 10_000])
def test_compiled_kernel_is_exact_for_any_bin_count(num_bins):
    pytest.importorskip("numba")
    from pml_suprank.metrics._compiled_rank_counts import count_negatives_compiled

    g = torch.Generator().manual_seed(3)
    C, N, P = 9, 400, 30
    neg = torch.randn(C, N, generator=g).round(decimals=1)
    neg[:, :40] = float("-inf")  # removed items
    rs = torch.randn(C, P, generator=g).round(decimals=1).sort(1, descending=True).values
    rs[2] = 0.5  # every relevant item tied (zero-width range: one bin)
    neg[2, 40:60] = 0.5  # negatives tied with them
    n_rel = torch.randint(0, P + 1, (C,), generator=g)
    n_rel[2] = P
    vs = torch.arange(P) < n_rel[:, None]
    rs = rs.masked_fill(~vs, float("-inf"))
    got = count_negatives_compiled(neg, rs, n_rel, num_bins)
    expected = ((neg[:, None, :] >= rs[:, :, None]).sum(2)).masked_fill(~vs, 0)
    assert torch.equal(got, expected)


def test_compiled_kernel_on_huge_float64_range():
    pytest.importorskip("numba")
    from pml_suprank.metrics._compiled_rank_counts import count_negatives_compiled

    big = torch.finfo(torch.float64).max
    rs = torch.tensor([[big, 1.0, 0.0, -big]], dtype=torch.float64)  # width overflows to inf
    neg = torch.tensor([[big, big / 2, 1.0, 0.5, -1.0, -big, float("-inf")]], dtype=torch.float64)
    got = count_negatives_compiled(neg, rs, torch.tensor([4]))
    assert torch.equal(got, (neg[:, None, :] >= rs[:, :, None]).sum(2))


def test_compiled_kernel_refuses_other_devices_and_dtypes():
    pytest.importorskip("numba")
    from pml_suprank.metrics._compiled_rank_counts import count_negatives_compiled

    with pytest.raises(ValueError, match="neg_scores"):
        count_negatives_compiled(torch.zeros(2, 3, dtype=torch.float16), torch.zeros(2, 1), torch.ones(2).long())
    with pytest.raises(ValueError, match="compiled"):
        rank_relevant_items(
            torch.zeros(2, 3, dtype=torch.bfloat16),
            torch.ones(2, 1, dtype=torch.bfloat16),
            torch.ones(2, 1, dtype=torch.long),
            counting="compiled",
        )


def test_counting_values_are_validated():
    assert set(COUNTING_METHODS) == {"auto", "search", "histogram", "compiled", "dense"}
    with pytest.raises(ValueError, match="counting"):
        retrieval_ranks(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.long), counting="numba")


def test_auto_falls_back_to_the_torch_counters_without_numba(monkeypatch):
    scores, levels, mask = _scores(4, torch.float32)
    ref = retrieval_ranks(scores, levels, mask, counting="histogram")
    monkeypatch.setattr(R, "_compiled_available", lambda: False)
    lo = torch.zeros(scores.shape[0])
    assert R._auto_counting(scores, scores, lo) in ("search", "histogram")
    got = retrieval_ranks(scores, levels, mask, counting="auto")
    assert torch.equal(got.positions, ref.positions)
    with pytest.raises(ImportError, match="numba"):
        retrieval_ranks(scores, levels, mask, counting="compiled")


def test_auto_picks_compiled_on_the_cpu_when_numba_is_installed():
    pytest.importorskip("numba")
    scores = torch.zeros(2, 3)
    assert R._auto_counting(scores, scores, torch.zeros(2)) == "compiled"
    assert R._auto_counting(scores.half(), scores.half(), torch.zeros(2)) in ("search", "histogram")


def _hierarchical_data(n: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, 3, (n,), generator=g)
    fine = coarse * 5 + torch.randint(0, 5, (n,), generator=g)
    emb = torch.randint(-1, 2, (n, 6), generator=g).float()  # small integers: exact, many tied dot products
    return emb, torch.stack([fine, coarse], 1)


@pytest.mark.parametrize("counting", _counters())
def test_evaluator_counters_agree_exactly(counting):
    emb, labels = _hierarchical_data()
    ref = RetrievalEvaluator(k_values=(1, 5), chunk_size=11, counting="histogram").evaluate(
        emb, labels, return_per_query=True
    )
    out = RetrievalEvaluator(k_values=(1, 5), chunk_size=11, counting=counting).evaluate(
        emb, labels, return_per_query=True
    )
    for key, value in ref["per_query"].items():
        assert torch.equal(out["per_query"][key].isnan(), value.isnan()), key
        assert torch.equal(out["per_query"][key].nan_to_num(), value.nan_to_num()), key
