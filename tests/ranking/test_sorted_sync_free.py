"""The sorted flat kernels read their sizes from the device once per call: pair grouping (group_pairs,
positive_pair_groups), the sort-based Heaviside count, the host-side window threshold, and host-sync counts (torch
profiler on the CPU) that do not grow with the number of references, chunks or positives."""

import math

import pytest
import torch
from _helpers import profiled_ops

from pml_suprank import ranking as R
from pml_suprank.ranking.flat import group_pairs, positive_pair_groups
from pml_suprank.ranking.window import next_below


def _problem(b: int, n: int, seed: int = 0, ties: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=torch.float64) * 0.1
    if ties:
        scores = torch.round(scores * 40) / 40
    labels, ref_labels = torch.randint(0, 3, (b,), generator=g), torch.randint(0, 3, (n,), generator=g)
    valid = torch.rand(b, n, generator=g) > 0.1
    pos = valid & (labels[:, None] == ref_labels[None, :])
    pos[0] = False  # a query without positives
    return scores, valid, pos, valid & ~pos


def test_group_pairs_sizes_and_order_check():
    q = torch.tensor([0, 0, 0, 2, 3, 3])
    groups = group_pairs(q, 5)
    assert groups.counts.tolist() == [3, 0, 1, 2, 0]
    assert groups.pos.tolist() == [0, 1, 2, 0, 0, 1]
    assert groups.widths == (3, 2, 1, 0, 0) and groups.width == 3
    assert groups.order.tolist() == [0, 3, 2, 1, 4]  # decreasing count, stable
    assert groups.kept_rows().tolist() == [0, 2, 3]
    empty = group_pairs(q[:0], 3)
    assert empty.width == 0 and empty.kept_rows().shape == (0,)
    with pytest.raises(ValueError, match="grouped"):
        group_pairs(q.flip(0), 5)


def test_positive_pair_groups_equal_nonzero_and_group_pairs():
    _, _, pos, _ = _problem(7, 23)
    q, i, groups = positive_pair_groups(pos)
    q0, i0 = torch.nonzero(pos, as_tuple=True)
    assert torch.equal(q, q0) and torch.equal(i, i0)
    ref = group_pairs(q0, 7)
    assert torch.equal(groups.counts, ref.counts) and torch.equal(groups.pos, ref.pos)
    assert torch.equal(groups.order, ref.order) and groups.widths == ref.widths
    assert torch.equal(groups.kept_rows(), torch.nonzero(ref.counts > 0)[:, 0])
    q, i, groups = positive_pair_groups(torch.zeros(3, 4, dtype=torch.bool))
    assert q.shape == i.shape == (0,) and groups.width == 0


def test_heaviside_count_by_sorting_any_order_with_ties():
    """``#{j ∈ P_q, j ≠ i : s_j >= s_i}`` for pairs in any order, with exact ties and signed zeros."""
    scores, _, pos, _ = _problem(6, 30, seed=2, ties=True)
    scores[1, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0], dtype=torch.float64)
    pos[1, :4] = True
    q, i = torch.nonzero(pos, as_tuple=True)
    perm = torch.randperm(len(q), generator=torch.Generator().manual_seed(0))
    q, i = q[perm], i[perm]
    got = R.flat.heaviside_positive_count(scores, q, i)
    s = scores[q, i]
    expected = [(pos[q[k]] & (scores[q[k]] >= s[k])).sum().item() - 1 for k in range(len(q))]
    assert got.tolist() == expected
    assert R.flat.heaviside_positive_count(scores, q[:0], i[:0]).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_next_below_matches_torch_nextafter(dtype):
    values = [5.0, -5.0, 0.5, -0.5, 1.0, -2.0, 0.1, -0.1, -4.99, 3.0000001, -1.9565429576271605, 6.103515625e-05]
    values += [0.0, -0.0, 1e-45, 1e39, -math.inf, math.inf, 1.0 + 2.0**-24, -(1.0 + 3 * 2.0**-12)]
    inf = torch.tensor(-math.inf, dtype=dtype)
    for x in values:
        assert next_below(x, dtype) == float(torch.nextafter(torch.tensor(x, dtype=dtype), inf)), x


def _count_syncs(fn) -> int:
    """Host-synchronising aten ops (outermost) plus host reads (``.tolist()``, ...) of one ``fn()``, fwd and bwd."""
    return len(profiled_ops(fn, host_reads=True, warm_up=False)[1])


def _supap_kernel(scores, pos, neg, chunk, groups_given):
    step = R.SupRankStep(offset=1.44)  # an explicit offset: no CPU scalar read for the default one
    pairs = positive_pair_groups(pos) if groups_given else (*torch.nonzero(pos, as_tuple=True), None)
    s = scores.clone().requires_grad_(True)

    def fn():
        q, i, groups = pairs
        rank_plus = 1.0 + R.flat.heaviside_positive_count(s, q, i)
        rank = rank_plus + R.flat.suprank_negative_sum(s, q, i, neg, step, chunk_elements=chunk, groups=groups)
        (rank_plus / rank).sum().backward()

    return fn


def _smooth_ap_kernel(scores, pos, valid, chunk, groups_given):
    pairs = positive_pair_groups(pos) if groups_given else (*torch.nonzero(pos, as_tuple=True), None)
    s = scores.clone().requires_grad_(True)

    def fn():
        q, i, groups = pairs
        a, b = R.flat.sigmoid_rank_sums(s, q, i, valid, 0.05, chunk_elements=chunk, groups=groups)
        ((1 + a) / (1 + b)).sum().backward()

    return fn


@pytest.mark.parametrize("groups_given", [False, True])
@pytest.mark.slow
def test_sorted_kernel_syncs_do_not_grow_with_references_chunks_or_positives(groups_given):
    """One host read per kernel call (none with ``groups=``), whether 1 chunk or ~50, 10 or 120 references."""
    counts = []
    for b, n, chunk in [(6, 10, 1 << 21), (6, 120, 1 << 21), (10, 120, 7)]:
        scores, valid, pos, neg = _problem(b, n)
        counts.append(
            (
                _count_syncs(_supap_kernel(scores, pos, neg, chunk, groups_given)),
                _count_syncs(_smooth_ap_kernel(scores, pos, valid, chunk, groups_given)),
            )
        )
    assert counts == [(0, 0) if groups_given else (1, 1)] * len(counts)
