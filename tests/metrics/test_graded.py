"""Graded metrics (graded H-AP, graded NDCG) against a naive full sort, today's level metrics and hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from pml_suprank.metrics import functional as F
from pml_suprank.metrics.graded import graded_levels, mean_label_average_precision
from pml_suprank.relevance import level_counts, level_matrix, multilabel_relevance, pop_relevance


def _naive_order(scores, rel, keep):
    """Kept items sorted by score descending, then relevance ascending (pessimistic), then index."""
    items = [k for k in range(len(scores)) if keep[k]]
    return sorted(items, key=lambda k: (-scores[k], rel[k], k))


def naive_hap(scores: torch.Tensor, rel: torch.Tensor, mask=None) -> torch.Tensor:
    out = []
    for q in range(scores.shape[0]):
        s, r = scores[q].tolist(), rel[q].double().tolist()
        keep = [True] * len(s) if mask is None else mask[q].tolist()
        order = _naive_order(s, r, keep)
        num, seen = 0.0, []
        for i, k in enumerate(order, start=1):
            if r[k] > 0:
                num += (r[k] + sum(min(r[j], r[k]) for j in seen)) / i
                seen.append(k)
        den = sum(r[k] for k in order)
        out.append(num / den if den > 0 else float("nan"))
    return torch.tensor(out, dtype=torch.float64)


def naive_ndcg(scores, rel, mask=None, gain=lambda r: 2.0**r - 1.0) -> torch.Tensor:
    out = []
    for q in range(scores.shape[0]):
        s, r = scores[q].tolist(), rel[q].double().tolist()
        keep = [True] * len(s) if mask is None else mask[q].tolist()
        order = _naive_order(s, r, keep)
        dcg = sum(gain(r[k]) / math.log2(1 + i) for i, k in enumerate(order, start=1))
        ideal = sorted((gain(r[k]) for k in order), reverse=True)
        idcg = sum(g / math.log2(1 + i) for i, g in enumerate(ideal, start=1))
        out.append(dcg / idcg if any(r[k] > 0 for k in order) else float("nan"))
    return torch.tensor(out, dtype=torch.float64)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-9) -> bool:
    return torch.allclose(a.cpu().double(), b.cpu().double(), rtol=0, atol=tol, equal_nan=True)


def _multilabel_problem(seed: int, Q=7, N=30, ties=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    table = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 2, 1], [5, 3, 1]])
    labels = torch.randint(0, 6, (Q + N, 3), generator=g)
    labels[:, 1:] = labels[:, 1:].masked_fill(torch.rand(Q + N, 2, generator=g) < 0.5, -1)
    rel = multilabel_relevance(labels[:Q], labels[Q:], table)
    if ties:
        scores = (torch.randint(0, 6, (Q, N), generator=g) / 5).to(dtype)
    else:
        scores = torch.randn(Q, N, generator=g, dtype=dtype)
    mask = torch.rand(Q, N, generator=g) > 0.15
    return scores, rel, mask


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ties", [True, False])
def test_equals_naive_full_sort_on_multilabel_relevance(seed, ties, dtype):
    scores, rel, mask = _multilabel_problem(seed, ties=ties, dtype=dtype)
    for m in (None, mask):
        assert _close(F.graded_average_precision(scores, rel, m), naive_hap(scores, rel, m), 1e-6)
        assert _close(F.graded_ndcg(scores, rel, m), naive_ndcg(scores, rel, m), 1e-6)
        lin = F.graded_ndcg(scores, rel, m, gain="linear")
        assert _close(lin, naive_ndcg(scores, rel, m, gain=lambda r: r), 1e-6)


def test_many_distinct_values_and_generic_sort_path():
    # continuous relevance: every relevant item is its own level (K > 64 uses the engine's generic sort)
    g = torch.Generator().manual_seed(7)
    rel = torch.rand(3, 150, generator=g, dtype=torch.float64)
    rel = rel.masked_fill(rel < 0.3, 0.0)
    for dtype in (torch.float32, torch.float64):
        scores = (torch.randint(0, 4, (3, 150), generator=g) / 3).to(dtype)
        assert _close(F.graded_average_precision(scores, rel), naive_hap(scores, rel), 1e-9)
        assert _close(F.graded_ndcg(scores, rel), naive_ndcg(scores, rel), 1e-9)


def test_one_label_per_item_equals_hierarchical_average_precision():
    g = torch.Generator().manual_seed(11)
    table = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 2, 1]])
    q_fine, r_fine = torch.randint(0, 5, (8,), generator=g), torch.randint(0, 5, (60,), generator=g)
    levels = level_matrix(table[q_fine], table[r_fine])
    mask = torch.rand(8, 60, generator=g) > 0.1
    # default pop relevance (SupRank Eq. 20, counted on the kept gallery), distinct scores
    scores = torch.randn(8, 60, generator=g)
    pop = pop_relevance(level_counts(levels, 3, mask), dtype=torch.float64)
    pairs = pop.gather(1, levels)
    expected = F.hierarchical_average_precision(scores, levels, mask, num_levels=3)
    assert _close(F.graded_average_precision(scores, pairs, mask), expected, 1e-12)
    # Algorithm 1 with one label each is rel = level / L; tied scores, same increasing table in both
    tied = (torch.randint(0, 4, (8, 60), generator=g) / 3).float()
    rel = multilabel_relevance(q_fine, r_fine, table, dtype=torch.float64)
    assert torch.equal(rel, levels.double() / 3)
    table_l = torch.arange(4, dtype=torch.float64) / 3
    expected = F.hierarchical_average_precision(tied, levels, mask, num_levels=3, relevance=table_l)
    assert _close(F.graded_average_precision(tied, rel, mask), expected, 1e-12)
    # integer levels fed as relevance with exponential gains: today's NDCG
    assert _close(F.graded_ndcg(tied, levels.double(), mask), F.ndcg(tied, levels, mask, num_levels=3), 1e-12)


def test_binary_relevance_is_average_precision():
    g = torch.Generator().manual_seed(2)
    scores = (torch.randint(0, 5, (5, 40), generator=g) / 4).float()
    positive = torch.rand(5, 40, generator=g) < 0.3
    expected = F.average_precision(scores, positive)
    assert _close(F.graded_average_precision(scores, positive), expected, 1e-12)
    assert _close(F.graded_average_precision(scores, positive.long()), expected, 1e-12)


def test_hand_computed_case():
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6], [1.0, 1.0, 0.0, 0.0]])
    rel = torch.tensor([[0.5, 0.0, 1.0, 0.25], [1.0, 0.5, 0.0, 0.0]])
    # row 0: H-ranks 0.5 (pos 1), 1 + 0.5 (pos 3), 0.25 + 0.25 + 0.25 (pos 4); Σ rel = 1.75
    # row 1: tie, less relevant first: 0.5 (pos 1), 1 + 0.5 (pos 2); Σ rel = 1.5
    expected = torch.tensor([(0.5 / 1 + 1.5 / 3 + 0.75 / 4) / 1.75, (0.5 / 1 + 1.5 / 2) / 1.5], dtype=torch.float64)
    assert _close(F.graded_average_precision(scores, rel), expected, 1e-12)
    dcg = 0.5 + 1.0 / math.log2(4) + 0.25 / math.log2(5)
    idcg = 1.0 + 0.5 / math.log2(3) + 0.25 / math.log2(4)
    assert math.isclose(float(F.graded_ndcg(scores, rel, gain="linear")[0]), dcg / idcg, rel_tol=1e-12)
    perfect = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    assert float(F.graded_average_precision(perfect, rel[:1].flip(1).sort(1, descending=True).values)) == 1.0


def test_queries_without_relevant_items_are_nan_and_blocks_do_not_matter():
    scores, rel, mask = _multilabel_problem(5, Q=6, N=25)
    rel[2] = 0.0
    mask[4] = False
    full = F.graded_average_precision(scores, rel, mask)
    assert math.isnan(float(full[2])) and math.isnan(float(full[4]))
    assert full.dtype == torch.float64 and full.shape == (6,)
    assert _close(F.graded_average_precision(scores, rel, mask, block_elements=1), full, 0.0)
    assert _close(F.graded_ndcg(scores, rel, mask, block_elements=30), F.graded_ndcg(scores, rel, mask), 1e-12)
    empty = F.graded_average_precision(scores, torch.zeros_like(rel))
    assert bool(empty.isnan().all())
    assert F.graded_ndcg(scores[:0], rel[:0]).shape == (0,)


def test_graded_levels():
    rel = torch.tensor([[0.5, 0.0, 0.25, 0.5, 1.0], [0.0, 0.3, 0.0, 0.3, 0.0]], dtype=torch.float64)
    levels, values = graded_levels(rel, torch.tensor([[True] * 4 + [False], [True] * 5]))
    assert levels.tolist() == [[2, 0, 1, 2, 0], [0, 1, 0, 1, 0]]
    assert torch.equal(values, torch.tensor([[0.0, 0.25, 0.5], [0.0, 0.3, 0.3]], dtype=torch.float64))


def test_device(device):
    scores, rel, mask = _multilabel_problem(9)
    got = F.graded_average_precision(scores.to(device), rel.to(device), mask.to(device))
    assert got.device.type == device.type
    assert _close(got, naive_hap(scores, rel, mask), 1e-6)


def test_validation():
    scores = torch.rand(2, 3)
    rel = torch.rand(2, 3)
    with pytest.raises(TypeError, match="scores"):
        F.graded_average_precision([[0.0]], rel)
    with pytest.raises(TypeError, match="scores must be a floating"):
        F.graded_ndcg(torch.ones(2, 3, dtype=torch.long), rel)
    with pytest.raises(ValueError, match="scores must have shape"):
        F.graded_average_precision(torch.rand(3), rel)
    with pytest.raises(TypeError, match="relevance must be a torch.Tensor"):
        F.graded_average_precision(scores, [[1.0]])
    with pytest.raises(TypeError, match="relevance must be real"):
        F.graded_average_precision(scores, rel.to(torch.complex64))
    with pytest.raises(ValueError, match=r"relevance must have the shape of scores \(2, 3\)"):
        F.graded_average_precision(scores, rel[:, :2])
    with pytest.raises(ValueError, match="relevance must be finite and non-negative"):
        F.graded_average_precision(scores, -rel)
    with pytest.raises(ValueError, match="relevance must be finite"):
        F.graded_ndcg(scores, rel.masked_fill(rel > 0.5, float("inf")))
    with pytest.raises(TypeError, match="mask must be a bool"):
        F.graded_average_precision(scores, rel, mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask must have the shape"):
        F.graded_average_precision(scores, rel, mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_elements"):
        F.graded_average_precision(scores, rel, block_elements=0)
    with pytest.raises(ValueError, match="gain must be one of"):
        F.graded_ndcg(scores, rel, gain="log")
    with pytest.raises(ValueError, match="NaN"):
        F.graded_average_precision(scores.masked_fill(scores > 0.5, float("nan")), rel)


def naive_mean_label_ap(scores, query_labels, ref_labels, mask=None) -> torch.Tensor:
    refs = [{v for v in row if v >= 0} for row in ref_labels.tolist()]
    out = []
    for q, row in enumerate(query_labels.tolist()):
        aps = []
        for y in sorted({v for v in row if v >= 0}):
            pos = [1.0 if y in refs[k] else 0.0 for k in range(len(refs))]
            keep = [True] * len(refs) if mask is None else mask[q].tolist()
            order = _naive_order(scores[q].tolist(), pos, keep)
            hits, total = 0, 0.0
            for i, k in enumerate(order, start=1):
                if pos[k]:
                    hits += 1
                    total += hits / i
            if hits:
                aps.append(total / hits)
        out.append(sum(aps) / len(aps) if aps else float("nan"))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(3))
def test_mean_label_average_precision_equals_naive(seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 6, (40, 3), generator=g)
    labels[:, 1:] = labels[:, 1:].masked_fill(torch.rand(40, 2, generator=g) < 0.5, -1)
    q, r = labels[:8], labels[8:]
    scores = (torch.randint(0, 5, (8, 32), generator=g) / 4).float()
    mask = torch.rand(8, 32, generator=g) > 0.2
    for m in (None, mask):
        got = mean_label_average_precision(scores, q, r, m)
        assert _close(got, naive_mean_label_ap(scores, q, r, m), 1e-12)
        assert _close(mean_label_average_precision(scores, q, r, m, block_elements=1), got, 0.0)


def test_mean_label_average_precision_one_label_is_ap_and_hand_case():
    g = torch.Generator().manual_seed(1)
    q, r = torch.randint(0, 4, (6,), generator=g), torch.randint(0, 4, (30,), generator=g)
    scores = torch.randn(6, 30, generator=g)
    expected = F.average_precision(scores, q[:, None] == r[None, :])
    assert _close(mean_label_average_precision(scores, q, r), expected, 1e-12)
    # query {0, 1}: label 0 -> positives items 0, 2 at ranks 1, 3: AP 5/6; label 1 -> item 1 at rank 2: AP 1/2
    got = mean_label_average_precision(
        torch.tensor([[0.9, 0.8, 0.7, 0.6]]), torch.tensor([[0, 1, 1]]), torch.tensor([[0, -1], [1, 5], [0, 5], [7, 8]])
    )
    assert math.isclose(float(got[0]), (5 / 6 + 1 / 2) / 2, rel_tol=1e-12)
    none = mean_label_average_precision(torch.rand(1, 2), torch.tensor([3]), torch.tensor([0, 1]))
    assert math.isnan(float(none[0]))


def test_mean_label_average_precision_validation():
    q, r = torch.tensor([[0, 1]]), torch.tensor([[0], [1], [2]])
    with pytest.raises(ValueError, match=r"scores must have shape \(query_labels.shape\[0\], ref_labels.shape\[0\]\)"):
        mean_label_average_precision(torch.rand(1, 2), q, r)
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        mean_label_average_precision([[0.0]], q, r)
    with pytest.raises(TypeError, match="ref_labels must have an integer dtype"):
        mean_label_average_precision(torch.rand(1, 3), q, r.float())
    with pytest.raises(ValueError, match="query_labels row 0 has no label"):
        mean_label_average_precision(torch.rand(1, 3), -torch.ones(1, 2, dtype=torch.long), r)
    with pytest.raises(TypeError, match="mask must be a bool"):
        mean_label_average_precision(torch.rand(1, 3), q, r, mask=torch.ones(1, 3))
