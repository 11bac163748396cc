"""Sorted-score rank kernels of the hierarchical rank losses (Sup-H-AP / HAPPIER, Sup-NDCG / ROD-NDCG).

For a query ``b`` with reference scores ``s_j``, levels ``T_j ∈ {0..L}`` (``L`` = same fine class, ``0`` = negative)
and per-level relevances, SupRank (Ramzi et al., "Optimization of Rank Losses for Image Retrieval", TPAMI 2025)
defines for every positive item ``i`` (``T_i > 0``):

* ``rank(i) = 1 + Σ_{j≠i, T_j ≥ T_i} H(s_j − s_i) + Σ_{j: T_j < T_i} H⁻(s_j − s_i)``
  (Eq. 21: the SupRank surrogate H⁻ of Eq. 4 only towards strictly less relevant items, the Heaviside ``H``
  (``H(0) = 1``, no gradient) otherwise);
* ``H-rank⁺(i) = rel_i + Σ_{j≠i} min(rel_i, rel_j) · H⁺(s_j − s_i)`` (Eq. 18) with ``H⁺ = H``, or, with the
  HAPPIER lower bound (Ramzi et al., ECCV 2022, App. A.3, Eq. 43 with ``min`` instead of the paper's ``max``
  typo), ``H⁺ = H_s^>`` for the strictly more relevant items ``T_j > T_i``:
  ``H_s^>(t) = γ·t`` for ``t ≤ 0`` and ``min(ν·t + μ, 1)`` for ``t > 0``.

A dense implementation materialises ``B × N × N`` tensors. Here every quantity is computed from the sets
``A_l = {valid j : T_j < l}`` (``l = 1..L+1``) sorted by score once per query (:mod:`pml_suprank.ranking.levels`):

* Heaviside counts and the ``min(rel)``-weighted ``H-rank⁺`` are per-level counts obtained with ``searchsorted``;
* the linear branch ``ρ·(t − δ) + offset`` of H⁻ and the piecewise-linear ``H_s^>`` are prefix sums of the sorted
  scores (differentiable through ``gather``/``cumsum``, accumulated in float64);
* the jump ``start`` on ``(0, δ]`` is a count;
* only the sigmoid branch of H⁻ (``t ∈ [t_lo, δ]``) needs pairs. Its pairs are contiguous windows of the sorted
  lists, summed by the window kernel of :mod:`pml_suprank.ranking.window` (:class:`SortedWindowLayout`), which
  recomputes them in backward instead of saving them;
* when it saves work (an untrained network: many scores within ``|t_lo|`` of each other), the window shrinks to
  ``|t| ≤ cτ`` (``c = 2``): on ``t < −cτ`` and on ``cτ < t ≤ δ`` the sigmoid is summed by its separable alternating
  series (:mod:`pml_suprank.ranking.tail`; ``K = 19`` terms for float64 scores, error ``< e^{−40} ≈ 4e−18`` per
  pair, ``K = 11`` otherwise, ``< e^{−24} ≈ 4e−11``). It costs ``O(K · N)`` per (list, score band), so it is chosen
  by comparing that with the window elements it removes.

Branch boundaries are decided exactly as an elementwise evaluation of ``t = s_j − s_i`` would (``t > 0`` ⇔
``s_j > s_i``; the ``δ`` threshold is searched with :func:`_last_within`), so ties and boundary cases match the
dense definition. Cost: ``O(L · B · N log N)`` plus the window work ``Σ_{(b,i)} |window(b, i)|``; extra memory
``O(L · b · N)`` for a block of ``b`` queries plus one chunk: queries are independent, so large problems are
evaluated in blocks of :data:`QUERY_BLOCK_ELEMENTS` ``(query, list, item)`` elements whose backward recomputes them
(:class:`_BlockedRows`, a second forward pass), and the extra memory does not grow with ``B``.
``t_lo = −τ · min(50, log(N / eps))``: below it the sigmoid contributes less than ``eps`` (the dtype's machine
epsilon) to any rank in total, so such pairs may be skipped (the reference's clamp makes them constant
``σ(−50) ≈ 2e−22`` with zero gradient).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..relevance import ideal_dcg
from .levels import SortedLevels, sort_levels
from .steps import HRankParams, SupRankStep
from .tail import CUT, SigmoidTail, band_span, bands, num_terms_for, table_rows
from .window import CHUNK_SIZE, SigmoidTerm, SortedWindowLayout, StepTerm, window_sum

__all__ = [
    "HRankParams",
    "hierarchical_ranks",
    "ideal_dcg",
    "sup_hap_scores",
    "sup_ndcg_scores",
]

# relative costs (CPU, measured) of one elementwise window element and of one element of one series table per term
_WINDOW_COST, _TABLE_COST = 1.0, 1.5

QUERY_BLOCK_ELEMENTS = 1 << 21
"""``(query, list, item)`` elements of one block of queries of the sorted hierarchical kernel (``rows · (L + 1) · N``):
bounds its extra memory (a few hundred bytes per element with autograd) whatever the batch and memory sizes."""

ONE_BLOCK_FACTOR = 2
"""A problem of at most ``ONE_BLOCK_FACTOR · QUERY_BLOCK_ELEMENTS`` elements is evaluated as one block (plain autograd,
no recomputation): e.g. B = 256 queries against 4,096 items with 2 levels (3.1e6 elements)."""


class _Query(NamedTuple):
    """Per-call inputs of :func:`hierarchical_ranks`, all ``(B, N)``."""

    scores: Tensor  # differentiable
    s_det: Tensor  # detached
    s64: Tensor  # float64, differentiable
    levels: Tensor  # long
    valid: Tensor  # bool
    positive: Tensor  # valid & (levels > 0)


class _LevelWindow(NamedTuple):
    """Sigmoid window of the positives at level ``l`` in sorted ``A_l``, ``(B, N)`` each: sorted positions
    ``[lo, hi)`` (truncated at ``t_lo``) and, when the series is considered, ``[lo_s, up_s)`` (``|t| <= cτ``)."""

    at_level: Tensor
    lo: Tensor
    hi: Tensor
    lo_s: Tensor | None = None
    up_s: Tensor | None = None


class _SeriesPlan(NamedTuple):
    """Items whose sigmoid tail is summed by the series (``(M,)`` each) and its bands (:func:`bands`)."""

    q_idx: Tensor
    i_idx: Tensor
    rows: Tensor  # list row (level − 1)·B + query
    lo_end: Tensor  # lower tail: sorted positions < lo_end
    up_begin: Tensor  # upper part: [up_begin, up_end)
    up_end: Tensor
    s_item: Tensor  # float64, differentiable
    anchors: Tensor
    band: Tensor


def _last_within(s: Tensor, delta: float) -> Tensor:
    """Largest ``u`` (elementwise) with ``fl(u − s) <= δ``, so that ``key <= u`` ⇔ ``fl(key − s) <= δ``: the sorted
    positions then choose the branch of H⁻ exactly as an elementwise evaluation of ``t = s_j − s_i`` would."""
    u = s + delta
    down, up = torch.tensor(float("-inf"), dtype=s.dtype), torch.tensor(float("inf"), dtype=s.dtype)
    for _ in range(4):  # fl(x − s) is monotone in x: a few ulp steps settle the boundary
        u = torch.where((u - s) > delta, torch.nextafter(u, down.to(s.device)), u)
    for _ in range(4):
        nxt = torch.nextafter(u, up.to(s.device))
        u = torch.where((nxt - s) <= delta, nxt, u)
    return u


def _closed_form_ranks(
    sl: SortedLevels, x: _Query, ge: list[Tensor], gt_pos: Tensor | None, step: SupRankStep, fast: bool
) -> tuple[Tensor, list[_LevelWindow]]:
    """The closed-form part of ``rank`` (SupRank Eq. 21) ``(B, N)`` float64 and the sigmoid window of every level.

    Per level ``l`` and positive ``i`` at level ``l``: the Heaviside count of the items at levels ``>= l`` scored
    ``>= s_i`` (``i`` included: the ``1 +``), the linear branch of H⁻ over ``A_l`` (``s_j > s_i + δ``) from prefix
    sums, and on the fast path the jump ``start`` for the window items scored above ``s_i``.
    """
    bsz, n = x.s_det.shape
    num_levels = sl.num_levels
    t_lo = -step.tau * min(50.0, math.log(max(n, 1) / torch.finfo(x.s_det.dtype).eps))
    lin_pos = sl.search(_last_within(x.s_det, step.delta), right=True)
    lo_pos = sl.search(x.s_det + t_lo, right=False)
    offset = step.resolved_offset
    rank64 = torch.zeros(bsz, n, dtype=torch.float64, device=x.s_det.device)
    windows = []
    for l in range(1, num_levels + 1):
        at_l = x.positive & (x.levels == l)
        rank64 = rank64 + torch.where(at_l, (ge[num_levels] - ge[l - 1]).to(torch.float64), 0.0)
        h = sl.members_before(l, lin_pos)
        c64 = (sl.counts[l - 1] - h).clamp_min(0).to(torch.float64)
        s_lin = sl.prefix_sums[l - 1][:, -1:] - torch.gather(sl.prefix_sums[l - 1], 1, h.clamp_max(n))
        lin = step.rho * (s_lin - c64 * (x.s64 + step.delta)) + c64 * offset
        rank64 = rank64 + torch.where(at_l, lin, 0.0)
        lo = sl.members_before(l, lo_pos)
        hi = torch.minimum(h, sl.counts[l - 1].expand_as(h))
        if fast:  # the jump `start` on 0 < t <= δ: window items scored strictly above s_i
            n_up = (hi - torch.maximum(lo, sl.members_before(l, gt_pos))).clamp_min(0)
            rank64 = rank64 + torch.where(at_l, step.start * n_up.to(torch.float64), 0.0)
        windows.append(_LevelWindow(at_l, torch.minimum(lo, hi), hi))
    return rank64, windows


def _plan_series(
    sl: SortedLevels, x: _Query, windows: list[_LevelWindow], step: SupRankStep, fast: bool
) -> tuple[list[_LevelWindow], _SeriesPlan | None]:
    """Whether the series tail replaces part of the windows: with it the elementwise window keeps only
    ``|t| <= cτ``; below it (and, on the fast path, on ``cτ < t <= δ``) the sigmoid is summed by the series. It costs
    ``O(K·N)`` per (list, score band) table, so it is used only when that saves more elementwise work.

    Returns the windows (with ``lo_s``/``up_s`` when the series was considered) and the plan, or ``None``."""
    bsz, n = x.s_det.shape
    num_terms = num_terms_for(x.s_det.dtype)
    sums = [torch.where(w.at_level, w.hi - w.lo, 0).sum() for w in windows]
    sums += [w.at_level.any(1).sum() for w in windows]  # lists with positives: at least one table each
    host = torch.stack(sums).tolist()  # one host read
    window_total, num_rows = sum(host[: len(windows)]), sum(host[len(windows) :])
    if window_total * _WINDOW_COST <= num_rows * n * num_terms * _TABLE_COST:
        return windows, None
    cut = CUT * step.tau  # |t| > cut: the sigmoid may be summed by its separable series
    below_pos = sl.search(x.s_det - cut, right=False)
    above_pos = sl.search(x.s_det + cut, right=True) if fast else None
    for l, w in enumerate(windows, 1):
        lo_s = torch.minimum(sl.members_before(l, below_pos), w.hi)
        up_s = torch.minimum(torch.maximum(sl.members_before(l, above_pos), lo_s), w.hi) if fast else w.hi
        windows[l - 1] = w._replace(lo_s=lo_s, up_s=up_s)
    # (level, query, item) of every item with a series part: one nonzero over the stacked levels
    lo_all, up_all, hi_all = (torch.stack(v) for v in zip(*((w.lo_s, w.up_s, w.hi) for w in windows)))
    at_all = torch.stack([w.at_level for w in windows])
    lv, tq, ti = torch.nonzero(at_all & ((lo_all > 0) | (up_all < hi_all)), as_tuple=True)
    if not lv.numel():
        return windows, None
    t_rows = lv * bsz + tq  # row of the stacked sorted lists A_1..A_L
    lo_end, up_begin, up_end = lo_all[lv, tq, ti], up_all[lv, tq, ti], hi_all[lv, tq, ti]
    inf = torch.tensor(float("inf"), dtype=x.s_det.dtype, device=x.s_det.device)
    s_row_min = torch.where(x.valid, x.s_det, inf).amin(1).to(torch.float64)
    s_row_max = torch.where(x.valid, x.s_det, -inf).amax(1).to(torch.float64)
    s_row_min = torch.where(torch.isfinite(s_row_min), s_row_min, 0.0).repeat(sl.num_levels)
    s_row_max = torch.where(torch.isfinite(s_row_max), s_row_max, 0.0).repeat(sl.num_levels)
    s_item = x.s64[tq, ti]
    lo, span = band_span(s_row_min, s_row_max, s_item, t_rows)
    kept = torch.where(at_all, up_all - lo_all, 0).sum()
    span_max, kept = torch.stack([span.max().to(torch.float64), kept.to(torch.float64)]).tolist()  # one host read
    anchors, band = bands(s_row_min, s_row_max, s_item, t_rows, step.tau, num_terms, (lo, span_max))
    saved = window_total - int(kept)
    table_cost = table_rows(t_rows, band, sl.num_levels * bsz) * n * num_terms * _TABLE_COST
    if saved * _WINDOW_COST <= table_cost:
        return windows, None
    return windows, _SeriesPlan(tq, ti, t_rows, lo_end, up_begin, up_end, s_item, anchors, band)


def _add_window_sums(
    rank64: Tensor,
    sl: SortedLevels,
    x: _Query,
    windows: list[_LevelWindow],
    series: _SeriesPlan | None,
    step: SupRankStep,
    fast: bool,
    chunk_size: int,
) -> tuple[Tensor, _SeriesPlan | None]:
    """Add the elementwise sigmoid windows (``σ(t/τ)`` on the fast path, else the full H⁻) to ``rank64``.

    A window shorter than its block is evaluated from the block's start (:class:`SortedWindowLayout`): where the
    series sums the items below the windows, it then stops at the block's start; the returned plan says so."""
    bsz, n = x.s_det.shape
    num_levels = sl.num_levels
    bounds = [(w.lo_s, w.up_s) if series is not None else (w.lo, w.hi) for w in windows]
    end_all, start_all = torch.stack([end for _, end in bounds]), torch.stack([b for b, _ in bounds])
    length_all = torch.where(torch.stack([w.at_level for w in windows]), end_all - start_all, 0)
    lv, q_idx, i_idx = torch.nonzero(length_all > 0, as_tuple=True)  # one nonzero over the stacked levels
    if not lv.numel():
        return rank64, series
    rows = lv * bsz + q_idx  # row of the stacked sorted lists A_1..A_L
    ends, lengths = end_all[lv, q_idx, i_idx], length_all[lv, q_idx, i_idx]
    order = torch.argsort(lengths, descending=True)  # similar widths per block: little padding
    q_idx, i_idx, rows, ends, lengths = (v[order] for v in (q_idx, i_idx, rows, ends, lengths))
    layout = SortedWindowLayout(
        x.scores, torch.stack(sl.keys[:num_levels]), torch.stack(sl.perms[:num_levels]), rows, ends, lengths,
        q_idx, i_idx, int(chunk_size), mask_infinite=not fast,
    )  # fmt: skip
    if series is not None:  # the series' lower tail stops where the evaluated block starts
        spans = torch.tensor([[m1 - m0, width] for m0, m1, width in layout.block_list]).to(lengths.device)
        widths = torch.repeat_interleave(spans[:, 1], spans[:, 0], output_size=lengths.numel())
        block_start = torch.full((num_levels * bsz * n,), n, dtype=torch.long, device=lengths.device)
        block_start[rows * n + i_idx] = (ends - widths).clamp_min(0)
        lo_end = torch.minimum(series.lo_end, block_start[series.rows * n + series.i_idx])
        series = series._replace(lo_end=lo_end)
    term = SigmoidTerm(1.0 / step.tau) if fast else StepTerm(step)
    window = window_sum(layout, term, x.scores)
    rank64 = rank64.reshape(-1).index_add(0, q_idx * n + i_idx, window.to(torch.float64)).view(bsz, n)
    return rank64, series


def _add_series(rank64: Tensor, sl: SortedLevels, series: _SeriesPlan, step: SupRankStep, chunk_size: int) -> Tensor:
    """Add the series tail (:class:`pml_suprank.ranking.tail.SigmoidTail`) of the planned items to ``rank64``."""
    bsz, n = rank64.shape
    keys = torch.stack(sl.keys64).reshape(sl.num_levels * bsz, n)
    num_terms = num_terms_for(sl.keys[0].dtype)
    tail = SigmoidTail.apply(
        keys, series.s_item, series.rows, series.lo_end, series.up_begin, series.up_end, series.anchors,
        series.band, step.tau, num_terms, int(chunk_size),
    )  # fmt: skip
    return rank64.reshape(-1).index_add(0, series.q_idx * n + series.i_idx, tail).view(bsz, n)


def _rank_plus(
    sl: SortedLevels,
    x: _Query,
    ge: list[Tensor],
    gt_pos: Tensor | None,
    level_relevance: Tensor,
    hrank: HRankParams | None,
) -> Tensor:
    """``H-rank⁺`` ``(B, N)`` (SupRank Eq. 18; ``H_s^>`` of HAPPIER Eq. 43 towards more relevant levels when
    ``hrank`` is given), 0 at non-positive or invalid items."""
    num_levels = sl.num_levels
    rel_tab = level_relevance.to(torch.float64)
    rel_i = torch.gather(rel_tab, 1, x.levels)
    rplus = torch.zeros_like(x.s64, dtype=torch.float64)
    if hrank is not None:
        saturated = sl.search(x.s_det + hrank.saturation, right=True)  # H_s^> reaches 1 at t = (1 − μ) / ν
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
        h_val = hrank.gamma * ((s_le_a - s_le_b) - (c_le_a - c_le_b) * x.s64)
        c_mid_a, s_mid_a = sl.count_and_sum(a, r0[a - 1], r1[a - 1])
        c_mid_b, s_mid_b = sl.count_and_sum(b, r0[b - 1], r1[b - 1])
        c_mid = c_mid_a - c_mid_b
        h_val = h_val + hrank.nu * ((s_mid_a - s_mid_b) - c_mid * x.s64) + hrank.mu * c_mid
        c_hi_a, _ = sl.count_and_sum(a, r1[a - 1], None)
        c_hi_b, _ = sl.count_and_sum(b, r1[b - 1], None)
        h_val = h_val + (c_hi_a - c_hi_b)
        rplus = rplus + w * torch.where(x.levels < lp, h_val, cnt)
    return torch.where(x.positive, rplus, 0.0)


def _block_ranks(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor | None,
    num_levels: int,
    valid: Tensor,
    step: SupRankStep,
    hrank: HRankParams | None,
    chunk_size: int,
) -> tuple[Tensor, Tensor | None]:
    """:func:`hierarchical_ranks` of one block of queries (``(b, N)`` inputs), with plain autograd."""
    x = _Query(scores, scores.detach(), scores.to(torch.float64), levels, valid, valid & (levels > 0))
    sl = sort_levels(scores, levels, valid, int(num_levels), s64=x.s64)
    ge_pos = sl.search(x.s_det, right=False)
    # number of items of A_l with score >= s_i, for l = 1..L+1
    ge = [sl.counts[l - 1] - sl.members_before(l, ge_pos) for l in range(1, sl.num_levels + 2)]
    fast = step.delta <= 50.0 * step.tau  # the sigmoid clamp never acts inside the window [t_lo, δ]
    need_gt = fast or (hrank is not None and level_relevance is not None)
    gt_pos = sl.search(x.s_det, right=True) if need_gt else None
    rank64, windows = _closed_form_ranks(sl, x, ge, gt_pos, step, fast)
    windows, series = _plan_series(sl, x, windows, step, fast)
    rank64, series = _add_window_sums(rank64, sl, x, windows, series, step, fast, chunk_size)
    if series is not None:
        rank64 = _add_series(rank64, sl, series, step, chunk_size)
    rank = torch.where(x.positive, rank64, 1.0).to(scores.dtype)
    if level_relevance is None:
        return rank, None
    return rank, _rank_plus(sl, x, ge, gt_pos, level_relevance, hrank).to(scores.dtype)


class _BlockedRows(torch.autograd.Function):
    """``fn`` (a per-query function of ``(scores, level_relevance, levels, valid)`` rows returning a tuple of
    row-indexed float tensors) over blocks of ``rows`` queries; backward recomputes one block at a time.

    Forward runs every block without autograd and keeps only the inputs and the outputs; backward re-evaluates each
    block with autograd and back-propagates through it before the next one. The extra memory is then one block's
    graph (about ``rows · (L + 1) · N`` list elements, :data:`QUERY_BLOCK_ELEMENTS`) whatever ``B`` and however many
    items of a query are relevant; values and gradients are those of the blocks evaluated separately.
    """

    @staticmethod
    def forward(ctx, fn, rows, scores, level_relevance, levels, valid):
        outs = None
        for b0 in range(0, scores.shape[0], rows):
            rel = None if level_relevance is None else level_relevance[b0 : b0 + rows]
            got = fn(scores[b0 : b0 + rows], rel, levels[b0 : b0 + rows], valid[b0 : b0 + rows])
            if outs is None:  # preallocated: no list of blocks and no concatenation
                outs = [o.new_empty((scores.shape[0], *o.shape[1:])) for o in got]
            for out, o in zip(outs, got):
                out[b0 : b0 + rows] = o
        ctx.save_for_backward(scores, level_relevance, levels, valid)
        ctx.fn, ctx.rows = fn, rows
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outs):
        scores, level_relevance, levels, valid = ctx.saved_tensors
        fn, rows = ctx.fn, ctx.rows
        need_rel = level_relevance is not None and ctx.needs_input_grad[3]
        grad_s = torch.zeros_like(scores) if ctx.needs_input_grad[2] else None
        grad_r = torch.zeros_like(level_relevance) if need_rel else None
        for b0 in range(0, scores.shape[0], rows):
            b1 = b0 + rows
            with torch.enable_grad():
                s = scores[b0:b1].detach().requires_grad_(grad_s is not None)
                rel = None if level_relevance is None else level_relevance[b0:b1].detach().requires_grad_(need_rel)
                outs = [(o, g[b0:b1]) for o, g in zip(fn(s, rel, levels[b0:b1], valid[b0:b1]), grad_outs)]
                outs = [(o, g) for o, g in outs if o.requires_grad]
                targets = [(t, acc) for t, acc in ((s, grad_s), (rel, grad_r)) if acc is not None]
                if not outs or not targets:
                    continue
                got = torch.autograd.grad(
                    [o for o, _ in outs], [t for t, _ in targets], [g for _, g in outs], allow_unused=True
                )
            for (_, acc), g in zip(targets, got):
                if g is not None:
                    acc[b0:b1] = g
        return None, None, grad_s, grad_r, None, None


def _by_blocks(fn, rows: int, scores: Tensor, level_relevance: Tensor | None, levels: Tensor, valid: Tensor):
    """``fn(scores, level_relevance, levels, valid)`` directly when the ``B`` queries fit one block of ``rows``,
    else by :class:`_BlockedRows`."""
    if scores.shape[0] <= rows:
        return fn(scores, level_relevance, levels, valid)
    return _BlockedRows.apply(fn, rows, scores, level_relevance, levels, valid)


def query_block_rows(
    num_refs: int, num_levels: int, block_elements: int | None = None, num_queries: int | None = None
) -> int:
    """Queries per block of the sorted hierarchical kernel: ``rows · (L + 1) · N <= block_elements``
    (:data:`QUERY_BLOCK_ELEMENTS` by default), at least 1.

    Blocks cost a second forward pass (backward recomputes them), so ``num_queries`` queries whose whole problem is
    at most :data:`ONE_BLOCK_FACTOR` blocks are kept as one block (returns ``num_queries``)."""
    budget = QUERY_BLOCK_ELEMENTS if block_elements is None else int(block_elements)
    per_query = max(1, (int(num_levels) + 1) * int(num_refs))
    if num_queries is not None and int(num_queries) * per_query <= ONE_BLOCK_FACTOR * budget:
        return max(1, int(num_queries))
    return max(1, budget // per_query)


def hierarchical_ranks(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor | None,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    hrank: HRankParams | None = None,
    chunk_size: int = CHUNK_SIZE,
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
        chunk_size: window (and series table) elements processed at once (memory/speed trade-off only).
        block_elements: ``(query, list, item)`` elements of one block of queries (:func:`query_block_rows`,
            :data:`QUERY_BLOCK_ELEMENTS` when None). When ``B`` queries need several blocks, forward keeps no graph
            and backward recomputes one block at a time (:class:`_BlockedRows`): the extra memory is bounded by one
            block whatever ``B`` and the number of relevant items, at the price of a second forward pass.

    Returns:
        ``rank`` ``(B, N)`` (1 at non-positive or invalid items) and ``rank_plus`` ``(B, N)`` (0 there, ``None`` if
        ``level_relevance`` is None), both in ``scores.dtype``.
    """
    step = step if step is not None else SupRankStep()
    levels = levels.long()
    valid = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid.bool()
    num_levels = int(num_levels)
    rows = query_block_rows(scores.shape[1], num_levels, block_elements, scores.shape[0])
    chunk_size = int(chunk_size)

    def ranks(s: Tensor, rel: Tensor | None, lv: Tensor, va: Tensor) -> tuple[Tensor, Tensor]:
        rank, rank_plus = _block_ranks(s, lv, rel, num_levels, va, step, hrank, chunk_size)
        return rank, (torch.zeros_like(rank) if rank_plus is None else rank_plus)

    rank, rank_plus = _by_blocks(ranks, rows, scores, level_relevance, levels, valid)
    return rank, (None if level_relevance is None else rank_plus)


def sup_hap_scores(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    hrank: HRankParams | None = None,
    chunk_size: int = CHUNK_SIZE,
    block_elements: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate H-AP of SupRank Eq. 21 (the score inside ``1 − mean``).

    ``H-AP_b = Σ_{i ∈ Ω⁺} H-rank⁺(i) / rank(i) / Σ_{j} rel_j`` with the relevances of ``level_relevance``.

    Args:
        scores, levels, level_relevance, num_levels, valid, step, hrank, chunk_size, block_elements: see
            :func:`hierarchical_ranks`.

    Returns:
        ``(B,)`` per-query scores (0 where the query has no positive) and the ``(B,)`` bool mask of queries with at
        least one positive (relevance sum > 0).
    """
    step = step if step is not None else SupRankStep()
    levels = levels.long()
    valid_b = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid.bool()
    num_levels, chunk = int(num_levels), int(chunk_size)

    def hap(s: Tensor, rel_tab: Tensor, lv: Tensor, va: Tensor) -> tuple[Tensor]:
        rank, rank_plus = _block_ranks(s, lv, rel_tab, num_levels, va, step, hrank, chunk)
        rel = torch.gather(rel_tab.to(s.dtype), 1, lv)
        norm = torch.where(va, rel, torch.zeros_like(rel)).sum(1)
        has_pos = norm > 0
        ratio = torch.where(va & (lv > 0), rank_plus / rank, torch.zeros_like(rank))
        return (torch.where(has_pos, ratio.sum(1) / torch.where(has_pos, norm, 1.0), torch.zeros_like(norm)),)

    rows = query_block_rows(scores.shape[1], num_levels, block_elements, scores.shape[0])
    (score,) = _by_blocks(hap, rows, scores, level_relevance, levels, valid_b)
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
    chunk_size: int = CHUNK_SIZE,
    block_elements: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate NDCG of SupRank Eq. 24: ``DCG_s / iDCG`` with gains ``2^l − 1``.

    ``DCG_s = Σ_{i ∈ Ω⁺} (2^{T_i} − 1) / log2(1 + rank(i))`` with the SupRank ranks of :func:`hierarchical_ranks`;
    the ideal DCG is that of the same reference set (the valid items) sorted by level. Arguments: see
    :func:`hierarchical_ranks`.

    Returns:
        ``(B,)`` per-query scores (0 where the query has no positive) and the ``(B,)`` mask of queries with one.
    """
    step = step if step is not None else SupRankStep()
    levels = levels.long()
    valid_b = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid.bool()
    num_levels, chunk = int(num_levels), int(chunk_size)
    gains_l = torch.pow(2.0, torch.arange(num_levels + 1, dtype=scores.dtype, device=scores.device)) - 1.0

    def ndcg(s: Tensor, _rel: None, lv: Tensor, va: Tensor) -> tuple[Tensor]:
        rank, _ = _block_ranks(s, lv, None, num_levels, va, step, None, chunk)
        pos = va & (lv > 0)
        dcg = torch.where(pos, gains_l[lv] / torch.log2(1.0 + rank), torch.zeros_like(rank)).sum(1)
        counts = torch.zeros(lv.shape[0], num_levels + 1, dtype=torch.long, device=lv.device)
        idcg = ideal_dcg(counts.scatter_add(1, lv, va.long()), gains_l)
        has_pos = pos.any(1)
        return (torch.where(has_pos, dcg / torch.where(has_pos, idcg, torch.ones_like(idcg)), torch.zeros_like(dcg)),)

    rows = query_block_rows(scores.shape[1], num_levels, block_elements, scores.shape[0])
    (score,) = _by_blocks(ndcg, rows, scores, None, levels, valid_b)
    return score, (valid_b & (levels > 0)).any(1)
