"""Rank kernels of the flat losses (SupAP / ROADMAP, Smooth-AP, Sup-R@k): sorted thresholds plus sigmoid windows.

For a query ``q`` and a positive item ``i`` of a ``(B, N)`` score matrix the flat surrogates need
``Σ_j m[q, j] · step(s_{q j} − s_{q i})`` over a set of reference items (SupRank, Ramzi et al., TPAMI 2025, Eqs. 9-11;
Smooth-AP, Brown et al., ECCV 2020, Eq. 6): Heaviside and linear branches from sorted thresholds and suffix sums
(:func:`count_above`), only the sigmoid window per element, chunked (:func:`sigmoid_window_sum`).

Pairs are ``query_idx`` / ``item_idx`` ``(K,)`` long tensors grouped by query (non-decreasing ``query_idx``, as from
``torch.nonzero``). One host synchronisation per call, in :func:`group_pairs`; pass its :class:`PairGroups` as
``groups=`` to share that read between kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .steps import SupRankStep
from .window import CHUNK_SIZE, window_sum

__all__ = [
    "ACCELERATOR_CHUNK_SIZE",
    "PairGroups",
    "count_above",
    "default_chunk_elements",
    "group_pairs",
    "heaviside_positive_count",
    "positive_pair_groups",
    "sigmoid_rank_sums",
    "sigmoid_window_sum",
    "suprank_negative_sum",
]


ACCELERATOR_CHUNK_SIZE = 1 << 23
"""Elements of one window block of the flat kernels on an accelerator: 4× :data:`CHUNK_SIZE`. Speed, not values."""


def default_chunk_elements(device: torch.device | str) -> int:
    """:data:`CHUNK_SIZE` on the CPU, :data:`ACCELERATOR_CHUNK_SIZE` elsewhere (fewer launches)."""
    return CHUNK_SIZE if torch.device(device).type == "cpu" else ACCELERATOR_CHUNK_SIZE


class PairGroups(NamedTuple):
    """(query, item) pairs grouped by query, with the sizes of their padded ``(B, P_max)`` layout on the host.

    Attributes:
        counts: ``(B,)`` long, pairs per query.
        pos: ``(K,)`` long, position of each pair within its query's group (its column in the padded layout).
        order: ``(B,)`` long, the queries by decreasing pair count (stable).
        widths: ``B`` host ints, ``counts[order]`` (non-increasing): the chunk shapes of the window kernel.
    """

    counts: Tensor
    pos: Tensor
    order: Tensor
    widths: tuple[int, ...]

    @property
    def width(self) -> int:
        """``P_max``, the largest number of pairs of a query (0 without pairs)."""
        return self.widths[0] if self.widths else 0

    def kept_rows(self) -> Tensor:
        """``(Q,)`` long, ascending: the queries with at least one pair, without a host synchronisation."""
        num_kept = sum(1 for w in self.widths if w > 0)
        return _nonzero(self.counts > 0, num_kept)[:, 0]


def group_pairs(query_idx: Tensor, num_queries: int) -> PairGroups:
    """The :class:`PairGroups` of ``query_idx`` ``(K,)`` (non-decreasing) over ``B`` queries; one host read.

    Raises:
        ValueError: ``query_idx`` is not grouped by query (non-decreasing).
    """
    device = query_idx.device
    counts = torch.zeros(num_queries, dtype=torch.long, device=device)
    counts = counts.index_add_(0, query_idx, torch.ones_like(query_idx))  # bincount would sync on CUDA (its size)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(len(query_idx), device=device) - starts[query_idx]
    order = torch.argsort(counts, descending=True, stable=True)
    unsorted = (query_idx[1:] < query_idx[:-1]).any().long().view(1)
    host = torch.cat([unsorted, counts[order]]).tolist()
    if host[0]:
        raise ValueError("query_idx must be grouped by query (non-decreasing), e.g. from torch.nonzero(mask)")
    return PairGroups(counts, pos, order, tuple(host[1:]))


def positive_pair_groups(mask: Tensor, host_counts: list[int] | None = None) -> tuple[Tensor, Tensor, PairGroups]:
    """``(query_idx (K,), item_idx (K,), groups)`` of the True entries of a ``(B, N)`` bool ``mask``, row-major, as
    ``torch.nonzero(mask, as_tuple=True)``: one host read, none when the caller passes per-row ``host_counts``."""
    counts = mask.sum(1)
    order = torch.argsort(counts, descending=True, stable=True)
    widths = tuple(counts[order].tolist()) if host_counts is None else tuple(sorted(host_counts, reverse=True))
    query_idx, item_idx = _nonzero(mask, sum(widths)).unbind(1)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(len(query_idx), device=mask.device) - starts[query_idx]
    return query_idx, item_idx, PairGroups(counts, pos, order, widths)


def _nonzero(mask: Tensor, size: int) -> Tensor:
    """``torch.nonzero(mask)`` ``(size, mask.dim())`` when its size is known: no host synchronisation on the
    devices that have ``nonzero_static`` (CPU, CUDA)."""
    if mask.device.type in ("cpu", "cuda"):
        return torch.nonzero_static(mask, size=size)
    return torch.nonzero(mask)


def _padded(values: Tensor, query_idx: Tensor, pos: Tensor, num_queries: int, width: int, fill: float) -> Tensor:
    """``(B, max(width, 1))`` matrix with ``values[k]`` at ``(query_idx[k], pos[k])`` and ``fill`` elsewhere."""
    return values.new_full((num_queries, max(width, 1)), fill).index_put((query_idx, pos), values)


def count_above(
    scores: Tensor,
    query_idx: Tensor,
    thresholds: Tensor,
    *,
    inclusive: bool = False,
    with_sum: bool = False,
    groups: PairGroups | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per pair ``k``: how many items of row ``q_k`` score above ``thresholds[k]`` (and the sum of their scores).

    ``count_k = #{j : scores[q_k, j] > thresholds[k]}`` (``>=`` when ``inclusive``) and, with ``with_sum``,
    ``sum_k = Σ_j scores[q_k, j]`` over the same items, differentiable and accumulated in float64 (float32 on MPS)
    so that ``sum_k − count_k·x`` does not cancel. Excluded items are ``-inf`` in ``scores``. ``O(B·N log P)``, no
    ``K × N`` tensor. Returns ``(count (K,) in the dtype of scores, sum (K,) float64 or None)``.
    """
    groups = group_pairs(query_idx, scores.shape[0]) if groups is None else groups
    padded = _padded(thresholds.detach(), query_idx, groups.pos, scores.shape[0], groups.width, float("inf"))
    return _count_above_padded(scores, query_idx, groups.pos, padded, inclusive, with_sum)


def _count_above_padded(
    scores: Tensor, query_idx: Tensor, pos: Tensor, padded: Tensor, inclusive: bool, with_sum: bool
) -> tuple[Tensor, Tensor | None]:
    """:func:`count_above` with the thresholds already laid out as ``padded`` ``(B, W)`` (``+inf`` padding), pair
    ``k`` at ``(query_idx[k], pos[k])``. No host synchronisation."""
    num_queries = scores.shape[0]
    sorted_t, order = torch.sort(padded, dim=1)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order).contiguous())
    pair_rank = rank[query_idx, pos]
    # bucket b_j = number of thresholds below s_j (strictly, or <= when inclusive); -inf items land in bucket 0,
    # which no threshold's suffix sum includes
    bucket = torch.searchsorted(sorted_t, scores.detach().contiguous(), right=inclusive)
    ones = torch.ones((), dtype=scores.dtype, device=scores.device).expand(bucket.shape)
    hist = scores.new_zeros(num_queries, sorted_t.shape[1] + 1).scatter_add_(1, bucket, ones)
    count = hist.flip(1).cumsum(1).flip(1)[query_idx, pair_rank + 1]
    total = None
    if with_sum:
        acc = torch.float32 if scores.device.type == "mps" else torch.float64  # MPS has no float64
        hist_sum = torch.zeros(num_queries, sorted_t.shape[1] + 1, dtype=acc, device=scores.device)
        hist_sum = hist_sum.scatter_add(1, bucket, scores.to(acc))
        total = hist_sum[:, 1:].flip(1).cumsum(1).flip(1)[query_idx, pair_rank]
    return count, total


def sigmoid_window_sum(
    Z: Tensor,
    query_idx: Tensor,
    z_item: Tensor,
    upper: float = float("inf"),
    *,
    chunk_elements: int | None = None,
    groups: PairGroups | None = None,
    scale: float = 1.0,
) -> Tensor:
    """``out[k] = Σ_j σ(scale·(Z[q_k, j] − z_item[k]))`` over the ``j`` with ``Z[q_k, j] − z_item[k] <= upper``.

    ``Z`` ``(B, M)``: scores divided by the temperature, or the scores with ``scale = 1/τ`` (the bound then tested
    exactly as an elementwise ``s_j − s_i <= upper``), ``-inf`` at excluded entries. Extra memory
    ``O(B·M + chunk_elements)`` (``None``: :func:`default_chunk_elements`). Returns ``(K,)`` in the dtype of ``Z``,
    differentiable w.r.t. ``Z`` and ``z_item``.
    """
    num_queries = Z.shape[0]
    groups = group_pairs(query_idx, num_queries) if groups is None else groups
    z = _padded(z_item, query_idx, groups.pos, num_queries, groups.width, float("inf"))
    chunk = default_chunk_elements(Z.device) if chunk_elements is None else chunk_elements
    out = window_sum(Z, z, groups.order, groups.widths, upper, chunk, scale)
    return out[query_idx, groups.pos]


def suprank_negative_sum(
    scores: Tensor,
    query_idx: Tensor,
    item_idx: Tensor,
    negatives: Tensor,
    step: SupRankStep,
    *,
    chunk_elements: int | None = None,
    groups: PairGroups | None = None,
) -> Tensor:
    """``Σ_{j : negatives[q_k, j]} H⁻(s_{q_k j} − s_{q_k i_k})`` for every pair ``k`` (SupRank Eq. 4 and 10).

    Equals the elementwise ``SupRankStep().value`` sum up to rounding and the ``±50`` sigmoid clamp (< 1e-20 per
    term). Returns ``(K,)`` in the dtype of ``scores``.
    """
    num_queries = scores.shape[0]
    groups = group_pairs(query_idx, num_queries) if groups is None else groups
    s_item = scores[query_idx, item_idx]
    s_neg = scores.masked_fill(~negatives, float("-inf"))
    z_neg, z_item, upper = s_neg / step.tau, s_item / step.tau, step.delta / step.tau
    window = sigmoid_window_sum(z_neg, query_idx, z_item, upper, chunk_elements=chunk_elements, groups=groups)
    pos, width = groups.pos, groups.width
    if step.start != 0.0:
        # one histogram for both threshold sets: s_i (t > 0) in columns [0, P_q) and s_i + δ (t > δ) in
        # [P_q, 2·P_q) of each query's row
        k = len(query_idx)
        both_q, both_pos = torch.cat([query_idx, query_idx]), torch.cat([pos, pos + groups.counts[query_idx]])
        both_t = torch.cat([s_item, s_item + step.delta]).detach()
        padded = _padded(both_t, both_q, both_pos, num_queries, 2 * width, float("inf"))
        counts, sums = _count_above_padded(s_neg, both_q, both_pos, padded, False, True)
        above_zero, above_delta, sum_above = counts[:k], counts[k:], sums[k:]
        total = window + step.start * (above_zero - above_delta)
    else:
        padded = _padded((s_item + step.delta).detach(), query_idx, pos, num_queries, width, float("inf"))
        above_delta, sum_above = _count_above_padded(s_neg, query_idx, pos, padded, False, True)
        total = window
    acc = sum_above.dtype
    linear = step.rho * (sum_above - above_delta.to(acc) * (s_item.to(acc) + step.delta))
    return total + (linear + step.resolved_offset * above_delta.to(acc)).to(scores.dtype)


def heaviside_positive_count(scores: Tensor, query_idx: Tensor, item_idx: Tensor) -> Tensor:
    """``Σ_{j∈P_q, j≠i} H(s_j − s_i)`` per pair (``H(0) = 1``), without gradient, where ``P_q`` = the items of
    query ``q``'s pairs (the pairs are the positives). ``O(K log K)``, no host synchronisation, any pair order.
    """
    with torch.no_grad():
        num_pairs, device = len(query_idx), query_idx.device
        s_item = scores[query_idx, item_idx].detach()
        by_score = torch.sort(s_item, stable=True).indices
        order = by_score[torch.sort(query_idx[by_score], stable=True).indices]  # by query, then by score
        q_sorted, s_sorted = query_idx[order], s_item[order]
        new_run = torch.ones(num_pairs, dtype=torch.bool, device=device)
        new_run[1:] = (q_sorted[1:] != q_sorted[:-1]) | (s_sorted[1:] != s_sorted[:-1])
        positions = torch.arange(num_pairs, device=device)
        run_start = torch.cummax(torch.where(new_run, positions, 0), 0).values  # first pair tied with each
        counts = torch.zeros(scores.shape[0], dtype=torch.long, device=device)
        group_end = torch.cumsum(counts.index_add_(0, query_idx, torch.ones_like(query_idx)), 0)[q_sorted]
        count = torch.empty_like(order).index_put_((order,), group_end - run_start - 1)
        return count.to(scores.dtype)


def sigmoid_rank_sums(
    scores: Tensor,
    query_idx: Tensor,
    item_idx: Tensor,
    valid: Tensor,
    tau: float,
    *,
    chunk_elements: int | None = None,
    groups: PairGroups | None = None,
) -> tuple[Tensor, Tensor]:
    """Smooth-AP sums per pair: ``(Σ_{j∈P_q, j≠i} σ_τ(s_j − s_i), Σ_{j∈V_q, j≠i} σ_τ(s_j − s_i))``.

    The positive sum runs over the ``(B, P_max)`` padded positive scores, the full sum over ``(B, N)``; ``j = i``
    contributes exactly ``σ(0) = 1/2`` and is subtracted (``i`` must be a positive).
    """
    num_queries = scores.shape[0]
    groups = group_pairs(query_idx, num_queries) if groups is None else groups
    z_item = scores[query_idx, item_idx] / tau
    pos_scores = _padded(z_item, query_idx, groups.pos, num_queries, groups.width, float("-inf"))
    pos_sum = sigmoid_window_sum(pos_scores, query_idx, z_item, chunk_elements=chunk_elements, groups=groups) - 0.5
    z_valid = scores.masked_fill(~valid, float("-inf")) / tau
    all_sum = sigmoid_window_sum(z_valid, query_idx, z_item, chunk_elements=chunk_elements, groups=groups)
    return pos_sum, all_sum - 0.5
