"""Sorted-score rank kernels of the hierarchical rank losses (Sup-H-AP / HAPPIER, Sup-NDCG / ROD-NDCG).

For a query with reference scores ``s_j`` and levels ``T_j ∈ {0..L}`` (``L`` = same fine class, ``0`` = negative),
SupRank (Ramzi et al., TPAMI 2025) defines for every positive item ``i`` (``T_i > 0``):

* ``rank(i) = 1 + Σ_{j≠i, T_j ≥ T_i} H(s_j − s_i) + Σ_{j: T_j < T_i} H⁻(s_j − s_i)`` (Eq. 21; ``H⁻`` of Eq. 4 only
  towards strictly less relevant items, the Heaviside ``H``, ``H(0) = 1``, otherwise);
* ``H-rank⁺(i) = rel_i + Σ_{j≠i} min(rel_i, rel_j) · H⁺(s_j − s_i)`` (Eq. 18), ``H⁺ = H`` or HAPPIER's lower bound
  ``H_s^>(t) = γ·t`` (``t ≤ 0``), ``min(ν·t + μ, 1)`` (``t > 0``) towards ``T_j > T_i`` (Ramzi et al., ECCV 2022,
  App. A.3, Eq. 43 with ``min`` for the paper's ``max`` typo).

Without ``B × N × N`` tensors: terms between positives from their sorted level sets (:mod:`pml_suprank.ranking.levels`),
the ``H⁻`` term over ``A_l = {valid j : T_j < l}`` by the sigmoid window kernel. One host read per call (the ``(B, L)``
positive counts); blocks of queries: :mod:`pml_suprank.ranking.query_blocks`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .flat import _count_above_padded, _padded, positive_pair_groups, sigmoid_window_sum
from .levels import SortedLevels, sort_levels
from .query_blocks import by_blocks, query_block_rows
from .steps import HRankParams, SupRankStep

__all__ = [
    "ACCELERATOR_WINDOW_CHUNK_ELEMENTS",
    "WINDOW_CHUNK_ELEMENTS",
    "hierarchical_ranks",
    "sup_hap_scores",
    "sup_ndcg_scores",
]


class _BlockRanks(NamedTuple):
    """Ranks of the positives of a block in a padded ``(b, P)`` layout, and where each positive comes from."""

    rank: Tensor  # (b, P), 1 at padding
    rank_plus: Tensor | None  # (b, P), 0 at padding
    levels: Tensor  # (b, P) long, 0 at padding
    present: Tensor  # (b, P) bool
    q: Tensor  # (K,) query of each positive
    i: Tensor  # (K,) its column in the reference set
    col: Tensor  # (K,) its column in the padded layout


def _positive_counts(levels: Tensor, valid: Tensor, num_levels: int) -> list[list[int]]:
    """``(B, L)`` host ints: the positives of every query at every level ``1..L``. The one host read of a call."""
    pos = (valid & (levels > 0)).long()
    counts = torch.zeros(levels.shape[0], num_levels + 1, dtype=torch.long, device=levels.device)
    return counts.scatter_add_(1, levels.clamp(0, num_levels), pos)[:, 1:].tolist()


def _last_within(s: Tensor, delta: float) -> Tensor:
    """Largest ``u`` (elementwise) with ``fl(u − s) <= δ``, so that ``key > u`` ⇔ ``fl(key − s) > δ``: the linear
    branch of H⁻ is then chosen exactly as an elementwise evaluation of ``t = s_j − s_i`` would."""
    u = s + delta
    down = torch.full((), float("-inf"), dtype=s.dtype, device=s.device)
    up = torch.full((), float("inf"), dtype=s.dtype, device=s.device)
    for _ in range(4):  # fl(x − s) is monotone in x: a few ulp steps settle the boundary
        u = torch.where((u - s) > delta, torch.nextafter(u, down), u)
    for _ in range(4):
        nxt = torch.nextafter(u, up)
        u = torch.where((nxt - s) <= delta, nxt, u)
    return u


def _negative_terms(
    scores: Tensor, levels: Tensor, valid: Tensor, counts: list[list[int]], step: SupRankStep, chunk: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``Σ_{j ∈ A_l} H⁻(s_j − s_i)`` (SupRank Eq. 4) for every positive ``i`` (level ``l``) of a block:
    ``(query (K,), column (K,), sum (K,) float64)``; row ``(l − 1)·b + q`` of the stacked ``(L·b, N)`` problem is
    query ``q`` restricted to ``A_l``; branches as an elementwise ``t = s_j − s_i`` (:func:`_last_within`)."""
    bsz, n = scores.shape
    num_levels = len(counts[0]) if counts else 0
    lvl = torch.arange(1, num_levels + 1, device=levels.device)[:, None, None]
    members = (valid & (levels < lvl)).reshape(num_levels * bsz, n)
    at_level = (valid & (levels == lvl)).reshape(num_levels * bsz, n)
    rows, cols, groups = positive_pair_groups(at_level, [counts[q][l] for l in range(num_levels) for q in range(bsz)])
    if not rows.numel():
        return rows, cols, scores.new_zeros(0, dtype=torch.float64)
    s_neg = scores.repeat(num_levels, 1).masked_fill(~members, float("-inf"))
    s_item = scores[rows % bsz, cols]
    window = sigmoid_window_sum(
        s_neg, rows, s_item, step.delta, chunk_elements=chunk, groups=groups, scale=1.0 / step.tau
    ).to(torch.float64)
    s_det = s_item.detach()
    k, width, pos = rows.numel(), groups.width, groups.pos
    both_rows, both_pos = torch.cat([rows, rows]), torch.cat([pos, pos + groups.counts[rows]])
    thresholds = torch.cat([s_det, _last_within(s_det, step.delta)])
    padded = _padded(thresholds, both_rows, both_pos, num_levels * bsz, 2 * width, float("inf"))
    counts_above, sums = _count_above_padded(s_neg, both_rows, both_pos, padded, False, True)
    above_zero, above_delta = counts_above[:k].to(torch.float64), counts_above[k:].to(torch.float64)
    sum_above = sums[k:]
    linear = step.rho * (sum_above - above_delta * (s_item.to(torch.float64) + step.delta))
    total = window + step.start * (above_zero - above_delta) + linear + step.resolved_offset * above_delta
    return rows % bsz, cols, total


def _block_ranks(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor | None,
    valid: Tensor,
    counts: list[list[int]],
    step: SupRankStep,
    hrank: HRankParams | None,
    chunk: int,
) -> _BlockRanks:
    """``rank`` and ``H-rank⁺`` of the positives of one block of ``b`` queries (``(b, N)`` inputs; ``counts``: the
    block's ``(b, L)`` host positive counts), with plain autograd and no host read."""
    bsz, n = scores.shape
    num_levels = len(counts[0]) if counts else 0
    per_query = [sum(c) for c in counts]
    width = max(max(per_query, default=0), 1)
    q, i, groups = positive_pair_groups(valid & (levels > 0), per_query)
    col = groups.pos
    s_pos, lv_pos = scores[q, i], levels[q, i]
    padded = _padded(s_pos, q, col, bsz, width, 0.0)
    lv = _padded(lv_pos, q, col, bsz, width, 0)
    present = _padded(torch.ones_like(q, dtype=torch.bool), q, col, bsz, width, False)
    s_det, s64 = padded.detach(), padded.to(torch.float64)
    sl = sort_levels(padded, lv, present, num_levels, s64=s64)
    # items of A_l scored >= s_i, l = 1..L+1; T_j >= T_i: A_{L+1} minus A_{T_i} (i itself included: the "1 +")
    ge_pos = sl.search(s_det, right=False)
    ge = [sl.counts[l - 1] - sl.members_before(l, ge_pos) for l in range(1, num_levels + 2)]
    ge_all = torch.stack(ge)  # (L + 1, b, P)
    heaviside = ge_all[num_levels] - ge_all.gather(0, (lv - 1).clamp_min(0)[None]).squeeze(0)
    nq, ni, neg = _negative_terms(scores, levels, valid, counts, step, chunk)
    col_of = torch.zeros(bsz * n, dtype=torch.long, device=scores.device).index_put((q * n + i,), col)
    neg_pad = torch.zeros(bsz, width, dtype=torch.float64, device=scores.device)
    neg_pad = neg_pad.index_put((nq, col_of[nq * n + ni]), neg)
    rank = torch.where(present, heaviside.to(torch.float64) + neg_pad, 1.0).to(scores.dtype)
    rank_plus = None
    if level_relevance is not None:
        gt_pos = sl.search(s_det, right=True) if hrank is not None else None
        rank_plus = _rank_plus(sl, s_det, s64, lv, present, ge, gt_pos, level_relevance, hrank).to(scores.dtype)
    return _BlockRanks(rank, rank_plus, lv, present, q, i, col)


def _rank_plus(
    sl: SortedLevels,
    s_det: Tensor,
    s64: Tensor,
    lv: Tensor,
    present: Tensor,
    ge: list[Tensor],
    gt_pos: Tensor | None,
    level_relevance: Tensor,
    hrank: HRankParams | None,
) -> Tensor:
    """``H-rank⁺`` ``(b, P)`` of the padded positives of a block (scores ``s_det`` detached, ``s64`` float64, levels
    ``lv``, mask ``present``; SupRank Eq. 18; ``H_s^>`` of HAPPIER Eq. 43 towards more relevant levels when ``hrank``
    is given), 0 at padding; ``sl`` holds the positives' level sets only."""
    num_levels = sl.num_levels
    rel_tab = level_relevance.to(torch.float64)
    rel_i = torch.gather(rel_tab, 1, lv)
    rplus = torch.zeros_like(s64, dtype=torch.float64)
    if hrank is not None:
        saturated = sl.search(s_det + hrank.saturation, right=True)  # H_s^> reaches 1 at t = (1 − μ) / ν
        r0 = [sl.members_before(m, gt_pos) for m in range(1, num_levels + 2)]
        r1 = [sl.members_before(m, saturated) for m in range(1, num_levels + 2)]
    for lp in range(1, num_levels + 1):
        w = torch.minimum(rel_i, rel_tab[:, lp : lp + 1])
        cnt = (ge[lp] - ge[lp - 1]).to(torch.float64)  # items at level lp with s_j >= s_i
        if hrank is None:
            rplus = rplus + w * cnt
            continue
        # H_s^> towards the strictly more relevant level lp > T_i, Heaviside otherwise; level lp = A_{lp+1} \ A_{lp}
        a, b = lp + 1, lp
        c_le_a, s_le_a = sl.count_and_sum(a, None, r0[a - 1])
        c_le_b, s_le_b = sl.count_and_sum(b, None, r0[b - 1])
        h_val = hrank.gamma * ((s_le_a - s_le_b) - (c_le_a - c_le_b) * s64)
        c_mid_a, s_mid_a = sl.count_and_sum(a, r0[a - 1], r1[a - 1])
        c_mid_b, s_mid_b = sl.count_and_sum(b, r0[b - 1], r1[b - 1])
        c_mid = c_mid_a - c_mid_b
        h_val = h_val + hrank.nu * ((s_mid_a - s_mid_b) - c_mid * s64) + hrank.mu * c_mid
        c_hi_a, _ = sl.count_and_sum(a, r1[a - 1], None)
        c_hi_b, _ = sl.count_and_sum(b, r1[b - 1], None)
        h_val = h_val + (c_hi_a - c_hi_b)
        rplus = rplus + w * torch.where(lv < lp, h_val, cnt)
    return torch.where(present, rplus, 0.0)


WINDOW_CHUNK_ELEMENTS = 1 << 24
"""Elements of one window block of the hierarchical kernel on the CPU; :data:`ACCELERATOR_WINDOW_CHUNK_ELEMENTS`
elsewhere."""

ACCELERATOR_WINDOW_CHUNK_ELEMENTS = 1 << 25


def _prepare(scores, levels, valid, num_levels, step, chunk_size, block_elements):
    """Long levels, bool valid, the ``(B, L)`` host positive counts, the queries per block, the step, the chunk."""
    levels = levels.long()
    valid = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid.bool()
    counts = _positive_counts(levels, valid, int(num_levels))
    rows = query_block_rows(scores.shape[1], int(num_levels), block_elements, scores.shape[0], scores.device)
    step = step if step is not None else SupRankStep()
    if chunk_size is None:
        chunk_size = WINDOW_CHUNK_ELEMENTS if scores.device.type == "cpu" else ACCELERATOR_WINDOW_CHUNK_ELEMENTS
    return levels, valid, counts, rows, step, int(chunk_size)


def _ideal_dcg(levels: Tensor, present: Tensor, gains_l: Tensor) -> Tensor:
    """``(b,)`` ideal DCG from the padded positives ``(b, P)``: their gains sorted in decreasing order at positions
    ``1..P`` (negatives have gain ``2^0 − 1 = 0``: :func:`pml_suprank.relevance.ideal_dcg` of the level counts, with
    every shape known from the host counts)."""
    best = torch.where(present, levels, 0).sort(1, descending=True).values
    positions = torch.arange(2, best.shape[1] + 2, dtype=gains_l.dtype, device=gains_l.device)
    return (gains_l[best] / torch.log2(positions)).sum(1)


def hierarchical_ranks(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor | None,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    hrank: HRankParams | None = None,
    chunk_size: int | None = None,
    block_elements: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Surrogate ranks and H-rank⁺ of every positive reference item (SupRank Eqs. 18 and 21).

    Args:
        scores: ``(B, N)`` query-reference similarities (differentiable).
        levels: ``(B, N)`` int64 levels in ``{0..L}`` (``L`` = same fine class, 0 = negative).
        level_relevance: ``(B, L + 1)`` relevance of each level for each query (e.g.
            :func:`pml_suprank.relevance.pop_relevance`); ``None`` skips H-rank⁺ (Sup-NDCG only needs ranks).
        num_levels: ``L``.
        valid: optional ``(B, N)`` bool, the reference items that take part for each query.
        step: the SupRank step H⁻ (:class:`pml_suprank.ranking.SupRankStep`, paper defaults when None).
        hrank: if given, use ``H_s^>`` (HAPPIER Eq. 43) towards more relevant items in H-rank⁺.
        chunk_size: window elements processed at once (memory/speed trade-off only; ``None``:
            :data:`WINDOW_CHUNK_ELEMENTS` on the CPU, :data:`ACCELERATOR_WINDOW_CHUNK_ELEMENTS` elsewhere).
        block_elements: ``(query, list, item)`` elements of one block of queries (:func:`query_block_rows`; ``None``:
            the device's byte budget). With several blocks, backward recomputes one block at a time.

    Returns:
        ``rank`` ``(B, N)`` (1 at non-positive or invalid items) and ``rank_plus`` ``(B, N)`` (0 there, ``None`` if
        ``level_relevance`` is None), both in ``scores.dtype``.
    """
    levels, valid, counts, rows, step, chunk = _prepare(
        scores, levels, valid, num_levels, step, chunk_size, block_elements
    )

    def ranks(s: Tensor, rel: Tensor | None, lv: Tensor, va: Tensor, b0: int, b1: int) -> tuple[Tensor, Tensor]:
        r = _block_ranks(s, lv, rel, va, counts[b0:b1], step, hrank, chunk)
        rank = torch.ones_like(s).index_put((r.q, r.i), r.rank[r.q, r.col])
        rank_plus = torch.zeros_like(s)
        if r.rank_plus is not None:
            rank_plus = rank_plus.index_put((r.q, r.i), r.rank_plus[r.q, r.col])
        return rank, rank_plus

    rank, rank_plus = by_blocks(ranks, rows, scores, level_relevance, levels, valid)
    return rank, (None if level_relevance is None else rank_plus)


def sup_hap_scores(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    hrank: HRankParams | None = None,
    chunk_size: int | None = None,
    block_elements: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate H-AP of SupRank Eq. 21, ``Σ_{i ∈ Ω⁺} H-rank⁺(i) / rank(i) / Σ_j rel_j``; arguments as
    :func:`hierarchical_ranks` (several blocks keep each block's Jacobian from forward: one pass each way).

    Returns ``(B,)`` scores (0 without a positive) and the ``(B,)`` bool mask of queries with relevance sum > 0.
    """
    levels, valid_b, counts, rows, step, chunk = _prepare(
        scores, levels, valid, num_levels, step, chunk_size, block_elements
    )

    def hap(s: Tensor, rel_tab: Tensor, lv: Tensor, va: Tensor, b0: int, b1: int) -> tuple[Tensor]:
        r = _block_ranks(s, lv, rel_tab, va, counts[b0:b1], step, hrank, chunk)
        rel = torch.gather(rel_tab.to(s.dtype), 1, lv)
        norm = torch.where(va, rel, torch.zeros_like(rel)).sum(1)
        has_pos = norm > 0
        ratio = torch.where(r.present, r.rank_plus / r.rank, torch.zeros_like(r.rank)).sum(1)
        return (torch.where(has_pos, ratio / torch.where(has_pos, norm, 1.0), torch.zeros_like(norm)),)

    (score,) = by_blocks(hap, rows, scores, level_relevance, levels, valid_b, per_query_scalar=True)
    with torch.no_grad():
        rel = torch.gather(level_relevance.to(scores.dtype), 1, levels)
        has_pos = torch.where(valid_b, rel, torch.zeros_like(rel)).sum(1) > 0
    return score, has_pos


def sup_ndcg_scores(
    scores: Tensor,
    levels: Tensor,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    chunk_size: int | None = None,
    block_elements: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate NDCG of SupRank Eq. 24, ``DCG_s / iDCG``: ``DCG_s = Σ_{i ∈ Ω⁺} (2^{T_i} − 1) /
    log2(1 + rank(i))``, iDCG of the valid items sorted by level; arguments as :func:`hierarchical_ranks` (blocks as
    :func:`sup_hap_scores`). Returns ``(B,)`` scores (0 without a positive) and the ``(B,)`` mask of queries with one.
    """
    levels, valid_b, counts, rows, step, chunk = _prepare(
        scores, levels, valid, num_levels, step, chunk_size, block_elements
    )
    num_levels = int(num_levels)
    gains_l = torch.pow(2.0, torch.arange(num_levels + 1, dtype=scores.dtype, device=scores.device)) - 1.0

    def ndcg(s: Tensor, _rel: None, lv: Tensor, va: Tensor, b0: int, b1: int) -> tuple[Tensor]:
        r = _block_ranks(s, lv, None, va, counts[b0:b1], step, None, chunk)
        dcg = torch.where(r.present, gains_l[r.levels] / torch.log2(1.0 + r.rank), torch.zeros_like(r.rank)).sum(1)
        idcg = _ideal_dcg(r.levels, r.present, gains_l)
        has_pos = r.present.any(1)
        return (torch.where(has_pos, dcg / torch.where(has_pos, idcg, torch.ones_like(idcg)), torch.zeros_like(dcg)),)

    (score,) = by_blocks(ndcg, rows, scores, None, levels, valid_b, per_query_scalar=True)
    return score, (valid_b & (levels > 0)).any(1)
