"""The evaluator's fused CPU ranking kernel (``_compiled_rank_counts.block_ranks_compiled``) gives exactly the
positions of the torch counters and of the two-pass route (keys of the slice in torch, a row sort, the compiled row
counter of ``counting="compiled"``): heavy ties, ``±0.0``, ``-inf``, NaN, far
outliers, crowded bins, rows without relevant items or with only relevant items, any bin count."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

from unittest import mock  # noqa: E402

from pml_suprank.metrics import eval_blocks  # noqa: E402
from pml_suprank.metrics._compiled_rank_counts import block_ranks_compiled  # noqa: E402
from pml_suprank.metrics.eval_blocks import chunk_ranks, label_blocks  # noqa: E402


def _block(seed: int, n: int = 300, levels: int = 2, decimals: int | None = 1, classes: int = 4):
    """A score block in label-path order: ``(scores (n, n), starts, ends, self_col)`` for every item as a query."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, classes, (n,), generator=g)
    cols = [coarse * 3 + torch.randint(0, 3, (n,), generator=g), coarse]
    if levels == 3:
        cols = [cols[0] * 2 + torch.randint(0, 2, (n,), generator=g), *cols]
    labels = torch.stack(cols, 1)
    perm, starts, ends = label_blocks(labels, labels)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    scores = torch.randn(n, n, generator=g)
    if decimals is not None:
        scores = scores.round(decimals=decimals)  # many exact ties
    return scores, starts, ends, inv


def _two_pass(scores, starts, ends, self_col, num_bins=None):
    """The two-pass route: torch keys of the slice, a row sort, then the compiled row counter (``counting="compiled"``
    with the fused kernel turned off); the query's own column is never a negative, inside its slice or not."""
    sc = scores.clone()
    rows = torch.nonzero(self_col >= 0)[:, 0]
    sc[rows, self_col[rows]] = float("-inf")
    with mock.patch.object(eval_blocks, "_fused_applies", lambda *a: False):
        ranks = chunk_ranks(sc, starts, ends, self_col, num_bins, counting="compiled")
    return ranks.levels, ranks.positions


def _torch(scores, starts, ends, self_col):
    ranks = chunk_ranks(scores.clone(), starts, ends, self_col, None, counting="histogram")
    return ranks.levels, ranks.positions


def _check(scores, starts, ends, self_col, num_bins=None, reference=_torch):
    before = scores.clone()
    levels, positions = block_ranks_compiled(scores, starts, ends, self_col, num_bins)
    assert torch.equal(scores.view(torch.int32), before.view(torch.int32))  # read, never modified (bitwise)
    ref_levels, ref_positions = reference(scores, starts, ends, self_col)
    assert torch.equal(levels, ref_levels)
    assert torch.equal(positions, ref_positions)
    return positions


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("levels", [2, 3])
@pytest.mark.parametrize("num_bins", [None, 1, 3, 10_000])
def test_fused_kernel_equals_the_torch_counters_with_heavy_ties(seed, levels, num_bins):
    scores, starts, ends, self_col = _block(seed, levels=levels)
    positions = _check(scores, starts, ends, self_col, num_bins)
    assert int(positions.max()) > 100


@pytest.mark.parametrize("decimals", [None, 0, 3])
def test_fused_kernel_continuous_and_coarse_scores(decimals):
    scores, starts, ends, self_col = _block(2, n=400, decimals=decimals)
    _check(scores, starts, ends, self_col)


def test_signed_zeros_minus_inf_and_far_outliers():
    scores, starts, ends, self_col = _block(3, decimals=0)
    n = scores.shape[0]
    zeros = scores == 0
    scores[zeros & (torch.arange(n)[None, :] % 2 == 0)] = -0.0  # -0.0 ties with +0.0, relevant or not
    scores[:, ::7] = float("-inf")  # removed columns never count
    scores[5] = float("-inf")  # a row scoring -inf everywhere: finite check fails, general path
    scores[:40, 11] = 1e6  # far outliers (near-duplicates): the grid's upper tail segment
    scores[:40, 13] = -1e6  # and its lower one
    scores[40:60, 17] = 3.0e38  # the grid's width overflows float32
    scores[40:60, 19] = -3.0e38
    _check(scores, starts, ends, self_col)
    assert bool((scores == 0).any()) and bool(torch.signbit(scores[scores == 0]).any())


def test_nan_and_inf_scores_are_ranked_as_by_the_two_pass_kernels():
    scores, starts, ends, self_col = _block(4)
    g = torch.Generator().manual_seed(4)
    scores[torch.rand(scores.shape, generator=g) < 0.02] = float("nan")
    scores[torch.rand(scores.shape, generator=g) < 0.02] = float("inf")
    scores[torch.rand(scores.shape, generator=g) < 0.02] = -float("nan")  # the sign bit set
    _check(scores, starts, ends, self_col, reference=_two_pass)
    _check(scores, starts, ends, self_col, num_bins=2, reference=_two_pass)


def test_rows_without_relevant_items_with_only_relevant_items_and_outside_queries():
    scores, starts, ends, self_col = _block(5)
    n = scores.shape[0]
    starts, ends, self_col = starts.clone(), ends.clone(), self_col.clone()
    starts[:10], ends[:10], self_col[:10] = 0, 0, -1  # no relevant item (a query outside the gallery)
    starts[10:20, 0], ends[10:20, 0] = 0, n  # every item relevant at level 1 (no negative at all)
    starts[10:20, 1], ends[10:20, 1] = 0, n // 2
    self_col[20:40] = -1  # queries not in the gallery
    self_col[40:50] = (starts[40:50, 0] - 1) % n  # the query's own column outside its slice: never counted
    starts[50], ends[50], self_col[50] = starts[50, 0] + 1, starts[50, 0] + 2, starts[50, 0] + 1  # only itself
    positions = _check(scores, starts, ends, self_col, reference=_two_pass)
    assert int(positions[:10].abs().sum()) == 0 and int(positions[50].abs().sum()) == 0
    assert torch.equal(positions[10, : n - 1], torch.arange(1, n))  # all relevant but the query: 1..n - 1
    _check(scores[:40], starts[:40], ends[:40], self_col[:40])


def test_crowded_bins_take_the_binary_search_and_the_full_sort():
    """Many distinct relevant scores in one bin (one bin per row): negatives inside it are binary-searched, and the
    insertion sort of the keys gives way to a full sort."""
    scores, starts, ends, self_col = _block(6, n=500, decimals=None, classes=2)
    for num_bins in (1, 2):
        _check(scores, starts, ends, self_col, num_bins)
    narrow = scores * 1e-3 + 0.5  # a narrow cluster: many items per bin at the default bin count too
    narrow[:, :50] = 5.0
    _check(narrow, starts, ends, self_col)


def test_chunk_ranks_compiled_reads_the_score_block_only():
    scores, starts, ends, self_col = _block(7)
    before = scores.clone()
    ranks = chunk_ranks(scores, starts, ends, self_col, None, counting="compiled")
    assert torch.equal(scores, before)
    ref = chunk_ranks(scores.clone(), starts, ends, self_col, None, counting="histogram")
    assert torch.equal(ranks.positions, ref.positions) and torch.equal(ranks.counts, ref.counts)


def test_rows_with_more_relevant_items_than_a_16_bit_table_holds():
    g = torch.Generator().manual_seed(8)
    N, n = 70_000, 66_000
    scores = torch.randn(2, N, generator=g).round(decimals=2)
    starts = torch.tensor([[1_000, 2_000], [0, 0]])
    ends = torch.tensor([[1_000 + n, 40_000], [N, N]])  # row 1: every column relevant (no negative)
    self_col = torch.tensor([1_500, -1])
    positions = _check(scores, starts, ends, self_col)
    assert int(positions[0].max()) > n and torch.equal(positions[1], torch.arange(1, N + 1))


def test_fused_kernel_refuses_other_dtypes_devices_and_shapes():
    scores, starts, ends, self_col = _block(9, n=20)
    with pytest.raises(ValueError, match="scores must be a 2-D float32 CPU tensor"):
        block_ranks_compiled(scores.double(), starts, ends, self_col)
    with pytest.raises(ValueError, match="starts must be an int64 CPU tensor"):
        block_ranks_compiled(scores, starts.int(), ends, self_col)
    with pytest.raises(ValueError, match="self_col .* one row per score row"):
        block_ranks_compiled(scores, starts, ends, self_col[:5])


def test_rows_whose_negatives_mostly_score_below_every_relevant_item():
    """Relevant items on top (a well-trained model): whole tiles of pruned negatives are skipped, the few hard
    negatives elsewhere still count."""
    scores, starts, ends, self_col = _block(10, n=3_000, decimals=2, classes=20)
    scores, starts, ends, self_col = scores[:30].clone(), starts[:30], ends[:30], self_col[:30]
    cols = torch.arange(scores.shape[1])
    relevant = (cols[None, :] >= starts[:, :1]) & (cols[None, :] < ends[:, :1])
    scores[relevant] += 10.0
    g = torch.Generator().manual_seed(10)
    hard = torch.rand(scores.shape, generator=g) < 0.002
    scores[hard & ~relevant] = 10.0 + torch.randn(int((hard & ~relevant).sum()), generator=g).round(decimals=1)
    scores[:5, 1_500:] = 12.0  # and a few rows where half the negatives score among the relevant items
    positions = _check(scores, starts, ends, self_col)
    assert int(positions[5:].max()) < int(positions[:5].max())
