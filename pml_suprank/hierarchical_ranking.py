"""Sorted-score rank kernels for the hierarchical rank losses (Sup-H-AP / HAPPIER, Sup-NDCG / ROD-NDCG).

For a query ``b`` with reference scores ``s_j``, levels ``T_j ∈ {0..L}`` (DESIGN.md §2) and per-level relevances,
SupRank (Ramzi et al., TPAMI) defines for every positive item ``i`` (``T_i > 0``):

* ``rank(i) = 1 + Σ_{j≠i, T_j ≥ T_i} H(s_j − s_i) + Σ_{j: T_j < T_i} H⁻(s_j − s_i)``
  (Eq. 21: the SupRank surrogate H⁻ of Eq. 4 only towards strictly less relevant items, the Heaviside ``H``
  (``H(0) = 1``, no gradient) otherwise);
* ``H-rank⁺(i) = rel_i + Σ_{j≠i} min(rel_i, rel_j) · H⁺(s_j − s_i)`` (Eq. 18) with ``H⁺ = H``, or, with the
  HAPPIER lower bound (HAPPIER App. A.3, Eq. 43 with ``min`` instead of the paper's ``max`` typo),
  ``H⁺ = H_s^>`` for the strictly more relevant items ``T_j > T_i``:
  ``H_s^>(t) = γ·t`` for ``t ≤ 0`` and ``min(ν·t + μ, 1)`` for ``t > 0``.

A dense implementation materialises ``B × N × N`` tensors. Here every quantity is computed from the sets
``A_l = {valid j : T_j < l}`` (``l = 1..L+1``) sorted by score once per query:

* Heaviside counts and the ``min(rel)``-weighted ``H-rank⁺`` are per-level counts obtained with ``searchsorted``;
* the linear branch ``ρ·(t − δ) + offset`` of H⁻ and the piecewise-linear ``H_s^>`` are prefix sums of the sorted
  scores (differentiable through ``gather``/``cumsum``, accumulated in float64);
* the jump ``start`` on ``(0, δ]`` is a count;
* only the sigmoid branch of H⁻ (``t ∈ [t_lo, δ]``) needs pairs. Its pairs are contiguous windows of the sorted
  lists; they are enumerated in chunks inside a custom :class:`torch.autograd.Function` that recomputes them in
  backward instead of saving them;
* when it saves work (an untrained network: many scores within ``|t_lo|`` of each other), the window shrinks to
  ``|t| ≤ cτ`` (``c = 2``): on ``t < −cτ`` and on ``cτ < t ≤ δ`` the sigmoid is summed by its separable alternating
  series ``σ(x) = Σ_k (−1)^{k+1} e^{kx}`` (``x < 0``; ``1 − σ(−x)`` for ``x > 0``) truncated after ``K`` terms, i.e.
  by prefix sums of ``e^{±k s_j/τ}`` over the same sorted lists (:mod:`pml_suprank._sigmoid_tail`; ``K = 19`` for
  float64 scores, error ``< e^{−40} ≈ 4e−18`` per pair, ``K = 11`` otherwise, ``< e^{−24} ≈ 4e−11``). It costs
  ``O(K · N)`` per (list, score band), so it is chosen by comparing that with the window elements it removes.

Branch boundaries are decided exactly as an elementwise evaluation of ``t = s_j − s_i`` would (``t > 0`` ⇔
``s_j > s_i``; the ``δ`` threshold is searched with :func:`_last_within`), so ties and boundary cases match the
dense definition. Cost: ``O(L · B · N log N)`` plus the window work ``Σ_{(b,i)} |window(b, i)|``; extra memory
``O(L · B · N)`` plus one chunk. ``t_lo = −τ · min(50, log(N / eps))``: below it the sigmoid contributes less than
``eps`` (the dtype's machine epsilon) to any rank in total, so such pairs may be skipped (the reference's clamp
makes them constant ``σ(−50) ≈ 2e−22`` with zero gradient). The window work dominates when many scores lie within
``|t_lo|`` of each other (an untrained network); it is then ``O(Σ_q P_q · N)`` like a flat SupAP kernel, still
without any ``B × N × N`` tensor; with the series it is that of the much narrower ``|t| ≤ cτ`` windows plus
``O(K · L · B · N)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._sigmoid_tail import CUT, SigmoidTail, bands, num_terms_for, table_rows
from ._validation import check_positive, check_probability
from .ranking import SupRankStep
from .relevance import ideal_dcg

__all__ = [
    "HRankParams",
    "hierarchical_ranks",
    "ideal_dcg",
    "sup_hap_scores",
    "sup_ndcg_scores",
]

_CHUNK = 1 << 21  # window elements processed at once (a few tensors of this many elements live per chunk)
# relative costs (CPU, measured) of one elementwise window element and of one element of one series table per term
_WINDOW_COST, _TABLE_COST = 1.0, 1.5


class HRankParams:
    """Hyper-parameters of the HAPPIER H-rank⁺ lower bound ``H_s^>`` (HAPPIER App. A.3, Eq. 43).

    ``H_s^>(t) = gamma·t`` for ``t ≤ 0`` and ``min(nu·t + mu, 1)`` for ``t > 0``.
    """

    __slots__ = ("nu", "mu", "gamma")

    def __init__(self, nu: float = 25.0, mu: float = 0.5, gamma: float = 10.0) -> None:
        self.nu = check_positive("hrank_nu", nu)
        self.mu = check_probability("hrank_mu", mu)
        self.gamma = check_positive("hrank_gamma", gamma, strict=False)

    def __repr__(self) -> str:
        return f"HRankParams(nu={self.nu}, mu={self.mu}, gamma={self.gamma})"


def _chunks(lengths: Tensor, budget: int, fill: float = 0.7) -> list[tuple[int, int, int]]:
    """Split pairs sorted by decreasing window length into ranges ``(m0, m1, width)`` of at most ``budget``
    padded elements (``(m1 − m0) · width``; ``width`` = the longest window of the range); a range also ends where
    the windows get shorter than ``fill · width``, so that padding stays below ``1/fill − 1`` of the work."""
    out = []
    m0, n = 0, lengths.numel()
    if n == 0:
        return out
    # first pair whose window is shorter than fill·(window of pair m): lengths are non-increasing
    desc = lengths.flip(0).contiguous()  # non-decreasing
    short_start = n - torch.searchsorted(desc, (lengths.to(torch.float64) * fill).ceil().to(lengths.dtype))
    short_start = short_start.tolist()
    lens = lengths.tolist()
    while m0 < n:
        width = max(int(lens[m0]), 1)
        m1 = min(n, m0 + max(1, budget // width), max(m0 + 1, short_start[m0]))
        out.append((m0, m1, width))
        m0 = m1
    return out


class _WindowSum(torch.autograd.Function):
    """Σ over each pair's window of ``f(s_{q,j} − s_{q,i})``; the windows are recomputed in backward, never saved.

    ``f`` is the bare sigmoid ``σ(t/τ)`` (fast path, the caller adds the ``start`` jump from counts) or, when the
    sigmoid clamp falls inside the window (``δ > 50τ``), the full step ``H⁻``. Pairs (sorted by decreasing window
    length) are processed as ``(pairs, width)`` blocks read from the sorted score lists (a block ends where windows
    get shorter than 0.7 × its width, bounding the padding): a window shorter than its block is extended to the
    left, i.e. to items scored even lower (legitimate sigmoid-branch terms, below the truncation threshold) or to
    ``−inf`` sentinels stored before each list (zero value and derivative); when the series sums the items below
    the windows, the caller ends the series at the block's start instead of the window's. So every element costs a
    handful of contiguous vector operations plus one gather, without masks; the gradient w.r.t. the window items
    is accumulated in sorted order and un-permuted once at the end.
    """

    @staticmethod
    def forward(ctx, scores, keys, perms, rows, hi, lengths, q_idx, i_idx, step, fast, chunk):
        s_i = scores.detach()[q_idx, i_idx]
        num_lists, bsz, n = keys.shape
        pad = int(lengths[0])  # the longest window
        sentinels = torch.full((num_lists, bsz, pad), float("-inf"), dtype=keys.dtype, device=keys.device)
        keys_ext = torch.cat([sentinels, keys], dim=2).reshape(-1)
        ends = rows * (n + pad) + pad + hi  # flat end (exclusive) of every window
        out = torch.zeros_like(s_i)
        for m0, m1, width in _chunks(lengths, chunk):
            t, _ = _window_block(keys_ext, ends, s_i, m0, m1, width)
            if fast:  # in place on the block's own temporary
                value = t.mul_(1.0 / step.tau).sigmoid_()
            else:
                value = torch.where(torch.isfinite(t), step.value(t), 0.0)
            out[m0:m1] = value.sum(1)
        ctx.save_for_backward(scores, keys_ext, perms, ends, lengths, q_idx, i_idx)
        ctx.step, ctx.fast, ctx.chunk, ctx.shape = step, fast, chunk, (num_lists, bsz, n, pad)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        scores, keys_ext, perms, ends, lengths, q_idx, i_idx = ctx.saved_tensors
        step = ctx.step
        s_i = scores.detach()[q_idx, i_idx]
        grad_sorted = torch.zeros_like(keys_ext)
        grad_i = torch.zeros_like(s_i)
        for m0, m1, width in _chunks(lengths, ctx.chunk):
            t, flat_pos = _window_block(keys_ext, ends, s_i, m0, m1, width)
            if ctx.fast:  # σ'(x)/τ = σ(1 − σ)/τ, in place on the block's own temporaries
                sig = t.mul_(1.0 / step.tau).sigmoid_()
                w = sig.sub_(sig * sig).mul_(grad_out[m0:m1, None] * (1.0 / step.tau))
            else:
                w = torch.where(torch.isfinite(t), step.derivative(t), 0.0) * grad_out[m0:m1, None]
            grad_i[m0:m1] = -w.sum(1)
            grad_sorted.index_add_(0, flat_pos.reshape(-1), w.reshape(-1))
        num_lists, bsz, n, pad = ctx.shape
        grad_sorted = grad_sorted.view(num_lists, bsz, n + pad)[:, :, pad:]
        grad = torch.zeros_like(scores)
        for l in range(num_lists):  # un-permute: sorted position -> reference column
            grad = grad.scatter_add(1, perms[l], grad_sorted[l])
        grad = grad.index_put((q_idx, i_idx), grad_i, accumulate=True)
        return grad, None, None, None, None, None, None, None, None, None, None


def _window_block(keys_ext, ends, s_i, m0, m1, width):
    """Score differences ``t`` ``(k, width)`` of the ``width`` sorted items ending each window of pairs ``m0..m1``,
    and their flat positions."""
    flat_pos = (ends[m0:m1] - width)[:, None] + torch.arange(width, device=keys_ext.device)
    return keys_ext.take(flat_pos).sub_(s_i[m0:m1, None]), flat_pos


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


def _gather_rows(table: Tensor, idx: Tensor) -> Tensor:
    return torch.gather(table, 1, idx)


def hierarchical_ranks(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor | None,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    hrank: HRankParams | None = None,
    chunk_size: int = _CHUNK,
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
        chunk_size: window elements enumerated at once (memory/speed trade-off only).

    Returns:
        ``rank`` ``(B, N)`` (1 at non-positive or invalid items) and ``rank_plus`` ``(B, N)`` (0 there, ``None`` if
        ``level_relevance`` is None), both in ``scores.dtype``.
    """
    step = step if step is not None else SupRankStep()
    bsz, n = scores.shape
    L = int(num_levels)
    device, dtype = scores.device, scores.dtype
    acc = torch.float64
    levels = levels.long()
    valid = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid.bool()
    positive = valid & (levels > 0)
    s_det = scores.detach()
    s64 = scores.to(acc)
    inf = torch.tensor(float("inf"), dtype=dtype, device=device)
    zero64 = torch.zeros(bsz, 1, dtype=acc, device=device)

    # sorted sets A_l = {valid j: T_j < l}, l = 1..L+1; invalid / excluded items sorted last as +inf
    sorted_keys, perms, counts, csums, keys64 = [], [], [], [], []
    for l in range(1, L + 2):
        member = valid & (levels < l)
        key, perm = torch.sort(torch.where(member, s_det, inf), dim=1)
        cnt = member.sum(1, keepdim=True)
        member_sorted = torch.gather(member, 1, perm)
        s64_sorted = torch.gather(s64, 1, perm)
        vals = torch.where(member_sorted, s64_sorted, 0.0)
        if l <= L:
            keys64.append(torch.where(member_sorted, s64_sorted, float("inf")))
        sorted_keys.append(key)
        perms.append(perm)
        counts.append(cnt)
        csums.append(torch.cat([zero64, torch.cumsum(vals, 1)], 1))  # (B, N + 1)

    # Positions in the sorted A_l come from ONE search per query tensor in the list of all valid items (A_{L+1}):
    # #{j ∈ A_l : key_j < x} = number of A_l members among the items of A_{L+1} scored below x (same comparisons).
    member_cum = []  # (B, N + 1): members of A_l among the first p items of A_{L+1}'s sorted order
    levels_sorted, valid_sorted = torch.gather(levels, 1, perms[L]), torch.gather(valid, 1, perms[L])
    zero_col = torch.zeros(bsz, 1, dtype=torch.long, device=device)
    for l in range(1, L + 2):
        member_cum.append(torch.cat([zero_col, torch.cumsum((valid_sorted & (levels_sorted < l)).long(), 1)], 1))
    searched: dict[tuple[int, bool], tuple[Tensor, Tensor]] = {}

    def position(x: Tensor, right: bool) -> Tensor:  # position of x in A_{L+1}, cached per query tensor
        key = (id(x), right)
        if key not in searched:  # x is kept with its result, so that its id is not reused meanwhile
            searched[key] = (x, torch.searchsorted(sorted_keys[L], x.contiguous(), right=right))
        return searched[key][1]

    def index_ge(l: int, x: Tensor) -> Tensor:  # first position in sorted A_l with key >= x
        return torch.gather(member_cum[l - 1], 1, position(x, False))

    def index_gt(l: int, x: Tensor) -> Tensor:  # first position in sorted A_l with key > x
        return torch.gather(member_cum[l - 1], 1, position(x, True))

    # number of items of A_l with score >= s_i, for l = 1..L+1
    ge = [counts[l - 1] - index_ge(l, s_det) for l in range(1, L + 2)]

    t_lo = -step.tau * min(50.0, math.log(max(n, 1) / torch.finfo(dtype).eps))
    fast = step.delta <= 50.0 * step.tau  # the sigmoid clamp never acts inside the window [t_lo, δ]
    lin_upper = _last_within(s_det, step.delta)
    rank64 = torch.zeros(bsz, n, dtype=acc, device=device)
    cut = CUT * step.tau  # |t| > cut: the sigmoid may be summed by its separable series (pml_suprank._sigmoid_tail)
    below_cut, above_cut, lo_query = s_det - cut, s_det + cut, s_det + t_lo
    per_level = []  # (at_l, truncated window start, series window start, series window end, window end)
    for l in range(1, L + 1):
        at_l = positive & (levels == l)
        # Heaviside part: items at level >= l with s_j >= s_i (i itself included: the "1 +")
        rank64 = rank64 + torch.where(at_l, (ge[L] - ge[l - 1]).to(acc), 0.0)
        # linear branch of H⁻ over A_l: s_j > s_i + δ
        h = index_gt(l, lin_upper)
        c_lin = (counts[l - 1] - h).clamp_min(0)
        s_lin = csums[l - 1][:, -1:] - _gather_rows(csums[l - 1], h.clamp_max(n))
        c64 = c_lin.to(acc)
        lin = step.rho * (s_lin - c64 * (s64 + step.delta)) + c64 * step.resolved_offset
        rank64 = rank64 + torch.where(at_l, lin, 0.0)
        # sigmoid window over A_l: s_i + t_lo <= s_j <= s_i + δ
        lo = index_ge(l, lo_query)
        hi = torch.minimum(h, counts[l - 1].expand_as(h))
        if fast:  # the jump `start` on 0 < t <= δ: window items scored strictly above s_i
            n_up = (hi - torch.maximum(lo, index_gt(l, s_det))).clamp_min(0)
            rank64 = rank64 + torch.where(at_l, step.start * n_up.to(acc), 0.0)
        per_level.append([at_l, torch.minimum(lo, hi), None, None, hi])

    # With the series, the elementwise window keeps only |t| <= cut: below it (and, on the fast path, on
    # cut < t <= δ) the sigmoid is summed by the separable series (which also replaces the truncation at t_lo).
    # It costs O(K·N) per (list, score band) table: used when that saves more elementwise work.
    num_terms = num_terms_for(dtype)
    window_total = sum(int(torch.where(a, hi - lo, 0).sum()) for a, lo, _, _, hi in per_level)
    num_rows = sum(int(a.any(1).sum()) for a, *_ in per_level)  # lists with positives: at least one table each
    tail_lists = []  # (query, item, row, lower-tail end, upper-part begin, upper-part end)
    if window_total * _WINDOW_COST > num_rows * n * num_terms * _TABLE_COST:
        for l, entry in enumerate(per_level, 1):
            at_l, _, _, _, hi = entry
            lo_s = torch.minimum(index_ge(l, below_cut), hi)
            up_s = torch.minimum(torch.maximum(index_gt(l, above_cut), lo_s), hi) if fast else hi
            entry[2], entry[3] = lo_s, up_s
            q_idx, i_idx = torch.nonzero(at_l & ((lo_s > 0) | (up_s < hi)), as_tuple=True)
            if q_idx.numel():
                rows = (l - 1) * bsz + q_idx
                tail_lists.append((q_idx, i_idx, rows, lo_s[q_idx, i_idx], up_s[q_idx, i_idx], hi[q_idx, i_idx]))
    use_tail = False
    if tail_lists:
        tq, ti, t_rows, t_lo_end, t_up_begin, t_up_end = (torch.cat(x) for x in zip(*tail_lists))
        s_row_min = torch.where(valid, s_det, inf).amin(1).to(acc)
        s_row_max = torch.where(valid, s_det, -inf).amax(1).to(acc)
        s_row_min = torch.where(torch.isfinite(s_row_min), s_row_min, 0.0).repeat(L)
        s_row_max = torch.where(torch.isfinite(s_row_max), s_row_max, 0.0).repeat(L)
        s_item = s64[tq, ti]
        anchors, band = bands(s_row_min, s_row_max, s_item, t_rows, step.tau, num_terms)
        saved = window_total - sum(int(torch.where(a, up_s - lo_s, 0).sum()) for a, _, lo_s, up_s, _ in per_level)
        table_cost = table_rows(t_rows, band) * n * num_terms * _TABLE_COST
        use_tail = saved * _WINDOW_COST > table_cost

    pair_lists = []  # (level, query, item, window start, window length)
    for l, (at_l, lo, lo_s, up_s, hi) in enumerate(per_level, 1):
        start, end = (lo_s, up_s) if use_tail else (lo, hi)
        length = torch.where(at_l, end - start, torch.zeros_like(hi))
        q_idx, i_idx = torch.nonzero(length > 0, as_tuple=True)
        if q_idx.numel():
            rows = (l - 1) * bsz + q_idx  # row of the stacked sorted lists A_1..A_L
            pair_lists.append((q_idx, i_idx, rows, end[q_idx, i_idx], length[q_idx, i_idx]))

    if pair_lists:
        q_idx, i_idx, rows, hi_idx, lengths = (torch.cat(x) for x in zip(*pair_lists))
        order = torch.argsort(lengths, descending=True)  # similar widths per block: little padding
        q_idx, i_idx, rows, hi_idx, lengths = (x[order] for x in (q_idx, i_idx, rows, hi_idx, lengths))
        keys, chunk = torch.stack(sorted_keys[:L]), int(chunk_size)
        if use_tail:  # a window shorter than its block is evaluated from the block's start: the series stops there
            widths = torch.empty_like(lengths)
            for m0, m1, width in _chunks(lengths, chunk):
                widths[m0:m1] = width
            block_start = torch.full((L * bsz * n,), n, dtype=torch.long, device=device)
            block_start[rows * n + i_idx] = (hi_idx - widths).clamp_min(0)
            t_lo_end = torch.minimum(t_lo_end, block_start[t_rows * n + ti])
        window = _WindowSum.apply(
            scores, keys, torch.stack(perms[:L]), rows, hi_idx, lengths, q_idx, i_idx, step, fast, chunk
        )
        flat_idx = q_idx * n + i_idx
        rank64 = (rank64.reshape(-1).index_add(0, flat_idx, window.to(acc))).view(bsz, n)
    if use_tail:
        keys = torch.stack(keys64).reshape(L * bsz, n)
        tail = SigmoidTail.apply(
            keys, s_item, t_rows, t_lo_end, t_up_begin, t_up_end, anchors, band, step.tau, num_terms
        )
        rank64 = (rank64.reshape(-1).index_add(0, tq * n + ti, tail)).view(bsz, n)
    rank = torch.where(positive, rank64, 1.0).to(dtype)

    if level_relevance is None:
        return rank, None

    rel_tab = level_relevance.to(acc)
    rel_i = torch.gather(rel_tab, 1, levels)
    rplus = torch.zeros(bsz, n, dtype=acc, device=device)
    if hrank is not None:
        theta = s_det + (1.0 - hrank.mu) / hrank.nu  # H_s^> reaches 1 at t = (1 - μ) / ν
        r0 = [index_gt(m, s_det) for m in range(1, L + 2)]
        r1 = [index_gt(m, theta) for m in range(1, L + 2)]
    for lp in range(1, L + 1):
        w = torch.minimum(rel_i, rel_tab[:, lp : lp + 1])
        cnt = (ge[lp] - ge[lp - 1]).to(acc)  # items at level lp with s_j >= s_i
        if hrank is None:
            term = w * cnt
        else:
            # H_s^> towards the strictly more relevant level lp > T_i, Heaviside otherwise
            a, b = lp + 1, lp  # level lp = A_{lp+1} \ A_{lp}

            def rng(m: int, i0: Tensor | None, i1: Tensor | None) -> tuple[Tensor, Tensor]:
                lo_i = torch.zeros_like(r0[0]) if i0 is None else i0[m - 1]
                hi_i = counts[m - 1].expand_as(r0[0]) if i1 is None else i1[m - 1]
                hi_i = torch.maximum(hi_i, lo_i)
                c = (hi_i - lo_i).to(acc)
                s = _gather_rows(csums[m - 1], hi_i) - _gather_rows(csums[m - 1], lo_i)
                return c, s

            c_le_a, s_le_a = rng(a, None, r0)
            c_le_b, s_le_b = rng(b, None, r0)
            h_val = hrank.gamma * ((s_le_a - s_le_b) - (c_le_a - c_le_b) * s64)
            c_mid_a, s_mid_a = rng(a, r0, r1)
            c_mid_b, s_mid_b = rng(b, r0, r1)
            c_mid = c_mid_a - c_mid_b
            h_val = h_val + hrank.nu * ((s_mid_a - s_mid_b) - c_mid * s64) + hrank.mu * c_mid
            c_hi_a, _ = rng(a, r1, None)
            c_hi_b, _ = rng(b, r1, None)
            h_val = h_val + (c_hi_a - c_hi_b)
            term = w * torch.where(levels < lp, h_val, cnt)
        rplus = rplus + term
    rank_plus = torch.where(positive, rplus, 0.0).to(dtype)
    return rank, rank_plus


def sup_hap_scores(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    hrank: HRankParams | None = None,
    chunk_size: int = _CHUNK,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate H-AP of SupRank Eq. 21 (the score inside ``1 − mean``).

    ``H-AP_b = Σ_{i ∈ Ω⁺} H-rank⁺(i) / rank(i) / Σ_{j} rel_j`` with the relevances of ``level_relevance``.

    Args:
        scores, levels, level_relevance, num_levels, valid, step, hrank, chunk_size: see :func:`hierarchical_ranks`.

    Returns:
        ``(B,)`` per-query scores (0 where the query has no positive) and the ``(B,)`` bool mask of queries with at
        least one positive (relevance sum > 0).
    """
    valid_b = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid.bool()
    rank, rank_plus = hierarchical_ranks(scores, levels, level_relevance, num_levels, valid_b, step, hrank, chunk_size)
    rel = torch.gather(level_relevance.to(scores.dtype), 1, levels.long())
    rel = torch.where(valid_b, rel, torch.zeros_like(rel))
    norm = rel.sum(1)
    has_pos = norm > 0
    ratio = torch.where(valid_b & (levels > 0), rank_plus / rank, torch.zeros_like(rank))
    score = torch.where(
        has_pos, ratio.sum(1) / torch.where(has_pos, norm, torch.ones_like(norm)), torch.zeros_like(norm)
    )
    return score, has_pos


def sup_ndcg_scores(
    scores: Tensor,
    levels: Tensor,
    num_levels: int,
    valid: Tensor | None = None,
    step: SupRankStep | None = None,
    chunk_size: int = _CHUNK,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate NDCG of SupRank Eq. 24: ``DCG_s / iDCG`` with gains ``2^l − 1``.

    ``DCG_s = Σ_{i ∈ Ω⁺} (2^{T_i} − 1) / log2(1 + rank(i))`` with the SupRank ranks of :func:`hierarchical_ranks`;
    the ideal DCG is that of the same reference set (the valid items) sorted by level.

    Returns:
        ``(B,)`` per-query scores (0 where the query has no positive) and the ``(B,)`` mask of queries with one.
    """
    valid_b = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid.bool()
    levels = levels.long()
    rank, _ = hierarchical_ranks(scores, levels, None, num_levels, valid_b, step, None, chunk_size)
    gains_l = torch.pow(2.0, torch.arange(num_levels + 1, dtype=scores.dtype, device=scores.device)) - 1.0
    g = gains_l[levels]
    pos = valid_b & (levels > 0)
    dcg = torch.where(pos, g / torch.log2(1.0 + rank), torch.zeros_like(rank)).sum(1)
    counts = torch.zeros(levels.shape[0], num_levels + 1, dtype=torch.long, device=levels.device)
    counts = counts.scatter_add(1, levels, valid_b.long())
    idcg = ideal_dcg(counts, gains_l)
    has_pos = pos.any(1)
    score = torch.where(has_pos, dcg / torch.where(has_pos, idcg, torch.ones_like(idcg)), torch.zeros_like(dcg))
    return score, has_pos
