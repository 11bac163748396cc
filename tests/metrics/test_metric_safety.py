"""Infinite and huge values never crash the metrics: ±inf scores are ranked exactly (−inf last, +inf first, ties
pessimistic), NaN is refused by name, huge embeddings do not overflow the evaluator, and bad evaluator options
(``num_bins``, ``device``, ``level_weights``) are named."""

from __future__ import annotations

import math

import pytest
import torch
from _metrics_naive import column, isclose, naive_metrics

from pml_suprank.metrics import HierarchicalAccuracyCalculator, RetrievalEvaluator, compute_embeddings
from pml_suprank.metrics import functional as F

INF = float("inf")


def _with_infinities(seed: int, dtype: torch.dtype, Q: int = 6, N: int = 40, L: int = 2):
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randint(0, 4, (Q, N), generator=g).to(dtype) - 1.5) / 2
    pick = torch.rand(Q, N, generator=g)
    scores = scores.masked_fill(pick < 0.2, -INF).masked_fill(pick > 0.85, INF)
    levels = torch.randint(0, L + 1, (Q, N), generator=g)
    mask = torch.rand(Q, N, generator=g) > 0.1
    return scores, levels, mask


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("counting", ["auto", "search", "histogram"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_infinite_scores_are_ranked_exactly(seed, counting, dtype):
    L = 2
    scores, levels, mask = _with_infinities(seed, dtype, L=L)
    ranks = F.retrieval_ranks(scores, levels, mask, num_levels=L, counting=counting)
    ref = naive_metrics(scores.double().numpy(), levels.numpy(), mask.numpy(), L)
    for m in range(1, L + 1):
        assert isclose(F.ap_from_ranks(ranks, m), column(ref, f"ap{m}"))
        assert isclose(F.map_at_r_from_ranks(ranks, m), column(ref, f"mapr{m}"))
        for k in (1, 2, 4):
            assert isclose(F.precision_at_k_from_ranks(ranks, k, m), column(ref, f"p@{k}_{m}"))
    assert isclose(F.hap_from_ranks(ranks), column(ref, "hap"))
    assert isclose(F.ndcg_from_ranks(ranks), column(ref, "ndcg"))


def _ap(row: list[float], relevant: list[bool]) -> float:
    return float(F.average_precision(torch.tensor([row]), torch.tensor([relevant]))[0])


def test_infinity_hand_computed():
    rel = [True, False, True]
    assert _ap([-INF, 0.0, 1.0], rel) == pytest.approx((1 + 2 / 3) / 2)  # the crash: -inf ranks last
    # a negative tied at -inf with a relevant item ranks before it (pessimistic) ...
    assert _ap([-INF, -INF, 1.0], rel) == pytest.approx((1 + 2 / 3) / 2)
    assert _ap([INF, INF, 1.0], rel) == pytest.approx((1 / 2 + 2 / 3) / 2)  # ... and at +inf too
    assert _ap([INF, INF, 1.0], [True, True, False]) == 1.0  # equal relevance tied at +inf: no penalty


def test_infinity_next_to_the_largest_finite_score():
    # a finite score at finfo.max must stay strictly below +inf: float32 is widened exactly to float64
    big = torch.finfo(torch.float32).max
    scores = torch.tensor([[INF, big, -big, -INF]])
    levels = torch.tensor([[0, 1, 0, 1]])
    ref = naive_metrics(scores.double().numpy(), levels.numpy(), None, 1)
    for counting in ("search", "histogram"):
        ranks = F.retrieval_ranks(scores, levels, counting=counting)
        assert isclose(F.ap_from_ranks(ranks), column(ref, "ap1"))
    # float64 cannot be widened: refused by name
    big64 = torch.finfo(torch.float64).max
    with pytest.raises(ValueError, match=r"scores holds ±inf together with a finite"):
        F.average_precision(torch.tensor([[INF, big64, 0.0]], dtype=torch.float64), torch.tensor([[1, 0, 1]]))


def test_nan_scores_are_refused_by_name():
    with pytest.raises(ValueError, match=r"scores contains NaN values \(in 1 of 2 rows\)"):
        F.average_precision(torch.tensor([[float("nan"), 0.0], [1.0, 0.0]]), torch.tensor([[1, 0], [1, 0]]))


@pytest.mark.parametrize("dtype, factor", [(torch.float32, 1e36), (torch.float32, 2.0**120), (torch.float64, 1e300)])
def test_evaluator_huge_embeddings_do_not_overflow(dtype, factor):
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(60, 16, generator=g, dtype=dtype)
    labels = torch.stack([torch.arange(60) % 6, torch.arange(60) % 6 // 3], 1)
    evaluator = RetrievalEvaluator(k_values=(1, 4))
    expected = evaluator.evaluate(emb, labels)
    huge = emb * factor
    assert torch.isfinite(huge).all()
    assert not torch.isfinite(huge @ huge.T).all()  # the plain score matrix overflows
    got = evaluator.evaluate(huge, labels)
    assert got == expected
    # queries and gallery of very different magnitudes
    got = evaluator.evaluate(huge[:20], labels[:20], emb, labels)
    assert got == evaluator.evaluate(emb[:20], labels[:20], emb, labels)
    # a gallery near the dtype's maximum against unit-scale queries: the large side takes the scaling, the queries
    # keep their precision
    top = emb * 2.0 ** math.floor(math.log2(torch.finfo(dtype).max / 2 / float(emb.abs().max())))
    assert torch.isfinite(top).all() and not torch.isfinite(emb[:20] @ top.T).all()
    got = evaluator.evaluate(emb[:20], labels[:20], top, labels)
    assert got == evaluator.evaluate(emb[:20], labels[:20], emb, labels)


@pytest.mark.parametrize("num_bins", [0, -1])
def test_evaluator_num_bins_must_be_positive(num_bins):
    with pytest.raises(ValueError, match=rf"num_bins must be an int >= 1; got {num_bins}"):
        RetrievalEvaluator(num_bins=num_bins)
    with pytest.raises(TypeError, match="num_bins must be None or an int"):
        RetrievalEvaluator(num_bins=2.5)
    assert RetrievalEvaluator(num_bins=None).num_bins is None
    with pytest.raises(ValueError, match="num_bins must be an int >= 1"):
        F.retrieval_ranks(torch.rand(2, 3), torch.ones(2, 3, dtype=torch.long), num_bins=num_bins)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_evaluator_cuda_device_without_cuda(device):
    with pytest.raises(ValueError, match=r"device=.*cuda.*CUDA is not available"):
        RetrievalEvaluator(device=device)


def test_device_strings_are_checked():
    with pytest.raises(ValueError, match="device must be a valid torch device string"):
        RetrievalEvaluator(device="gpu0")
    with pytest.raises(TypeError, match="device must be None, a str or a torch.device"):
        RetrievalEvaluator(device=0.5)
    assert RetrievalEvaluator(device="cpu").device == torch.device("cpu")
    with pytest.raises(ValueError, match="device must be a valid torch device string"):
        HierarchicalAccuracyCalculator(device="gpu0")
    with pytest.raises(ValueError, match="level_weights must not be all zero"):
        HierarchicalAccuracyCalculator(level_weights=[0.0, 0.0])
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="device must be a valid torch device string"):
        compute_embeddings(model, [(torch.randn(3, 4), torch.zeros(3))], device="gpu0")


@pytest.mark.parametrize(
    "weights, match",
    [
        ([float("nan"), 1.0], "finite"),
        ([float("inf"), 1.0], "finite"),
        ([0.0, 0.0], "all zero"),
        ([-1, 2], "non-negative"),
    ],
)
def test_level_weights_checked_like_the_losses(weights, match):
    with pytest.raises(ValueError, match=f"level_weights must .*{match}"):
        RetrievalEvaluator(level_weights=weights)
    s = torch.rand(2, 3)
    with pytest.raises(ValueError, match=f"weights must .*{match}"):
        F.weighted_sum_ap(s, torch.tensor([[2, 1, 0], [1, 2, 0]]), weights=weights)


def test_level_weights_length_checked_at_evaluation():
    emb = torch.randn(12, 4)
    labels = torch.stack([torch.arange(12) % 4, torch.arange(12) % 4 // 2], 1)
    with pytest.raises(ValueError, match="level_weights must be 2 weights"):
        RetrievalEvaluator(k_values=(1,), level_weights=[1.0, 1.0, 1.0]).evaluate(emb, labels)
