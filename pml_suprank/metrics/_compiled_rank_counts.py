"""Compiled (numba, CPU) counting of the negatives ranked at or above each relevant item; numba is the optional
``fast`` extra: import this module lazily and treat ``ImportError`` as "not available".

* :func:`block_ranks_compiled`, the evaluator's CPU path (:func:`pml_suprank.metrics.eval_blocks.chunk_ranks`): per
  row the keys ``-m(s)·64 + level`` (``m``: order-preserving int32 image of the float32 bits) of the relevant
  items are bucket-sorted on a three-segment grid (:func:`_make_grid`), giving ``ge[b] = #{k : bin(r_k) > b}``; one
  pass over the negatives does ``hist[ge[bin(s)] + exact in-bin count] += 1``, and ``neg_ge = cumsum(hist)``.
* :func:`count_negatives_compiled`, ``counting="compiled"`` of :func:`pml_suprank.metrics.ranks.rank_relevant_items`:
  the same count on one uniform grid per row.

Exact (``bin(s)`` is monotone, so only an entry's own bin needs comparisons): positions and tie rule are those of the
torch counters; ``NaN`` negatives count above all; the score block is never written.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

from ._numba_jit import _threads, njit

__all__ = ["block_ranks_compiled", "count_negatives_compiled"]

_KEY_PAD = (2**63 - 1) & ~63  # larger than every key; level bits 0 (== ranks._KEY_PAD)
_DEFAULT_BINS = 8  # counting bins per relevant item
_TAIL_SIGMAS = 3.0  # the grid's middle segment: mean ± this many standard deviations of the relevant scores
_SORT_MOVES = 16  # insertion-sort moves per item beyond which a row's keys are sorted in full
_LINEAR_SCAN = 8  # bins holding at most this many relevant items are scanned, larger ones binary-searched
_TILE = 1024  # columns per tile of the counting pass (the tile and its bins stay in L1)
_SAMPLES = 64  # entries of a row sampled to decide whether its pruned tiles are worth skipping
_SPREAD = 8  # pruned entries go to 8 spare slots (no chain of increments of one counter)
_ONE = np.uint32(1)
_INF_IMAGE = 0x7F800000  # image of +inf (that of -inf is -_INF_IMAGE - 1); NaN images lie beyond


# the uniform-grid counter of one row (non-finite relevant scores, and :func:`count_negatives_compiled`)


@njit(inline="always")
def _uniform_bin(value, lo, scale, num_bins):
    """Bin of ``value >= lo``: ``floor((value - lo) · scale)`` in float64, clamped to ``num_bins - 1`` (also inf or
    NaN); non-decreasing in ``value``."""
    x = (np.float64(value) - lo) * scale
    if x < num_bins:
        return np.int64(x)
    return num_bins - 1


@njit(nogil=True)
def _count_row(row, r, n, num_bins, out_row):  # pragma: no cover - compiled
    """``out_row[k] = #{j : row[j] >= r[k]}`` for ``k < n``: ``row`` ``(N,)`` scores, ``r`` ``(n + 1,)`` the relevant
    scores in descending order followed by a ``-inf`` sentinel (never above a kept negative)."""
    N = row.shape[0]
    lo = np.float64(r[n - 1])
    width = np.float64(r[0]) - lo
    B = num_bins if num_bins > 0 else _DEFAULT_BINS * n
    B = max(min(B, 64 * n), 1)
    scale = B / width if width > 0.0 else 0.0
    if not scale < np.inf:  # width subnormal-small or infinite: one bin, still exact
        scale = 0.0
    # ge[b] = #{k : bin(r_k) >= b} (r descending: bins non-increasing), ge[B] = 0
    ge = np.zeros(B + 1, np.int32)
    for k in range(n):
        ge[_uniform_bin(r[k], lo, scale, B)] += 1
    for b in range(B - 1, -1, -1):
        ge[b] += ge[b + 1]
    # slot[j] = #{k : r_k > s_j} for the kept negatives, n for the others (slots, then their histogram)
    slot = np.empty(N, np.int32)
    lo_s = r[n - 1]
    for j in range(N):
        s = row[j]
        if s < lo_s:  # below every relevant item (also the -inf of removed items): never counts
            slot[j] = n
            continue
        b = _uniform_bin(s, lo, scale, B)
        a = np.int64(ge[b + 1])  # relevant items in higher bins: all score strictly higher
        a += np.int64(r[a] > s)  # items past the bin score strictly lower than s; the sentinel ends the row
        if r[a] > s:  # a second relevant item of the bin scores higher: finish the bin exactly
            e = np.int64(ge[b])
            if e - a <= _LINEAR_SCAN:
                while r[a] > s:
                    a += 1
            else:  # first slot in [a, e) with r <= s
                while a < e:
                    m = (a + e) >> 1
                    if r[m] > s:
                        a = m + 1
                    else:
                        e = m
        slot[j] = a  # a < n because s >= the lowest relevant score
    hist = np.zeros(n + 1, np.int64)
    for j in range(N):
        k = slot[j]
        if k < n:  # the pruned entries (slot n) never count; skipping them avoids a store chain on hist[n]
            hist[k] += 1
    acc = 0
    for k in range(n):
        acc += hist[k]
        out_row[k] = acc


@njit(nogil=True)
def _decode_keys(keys_row, n, pad=1):  # pragma: no cover - compiled
    """The float32 scores ``(n + pad,)`` of a row's first ``n`` sorted keys (see the module), then ``pad`` ``-inf``
    sentinels."""
    bits = np.empty(n + pad, np.int32)
    for k in range(n):
        m = -(keys_row[k] >> 6)
        bits[k] = np.int32(m ^ ((m >> 31) & 0x7FFFFFFF))
    r = bits.view(np.float32)
    r[n:] = -np.inf
    return r


@njit(inline="always")
def _bin(value, grid):
    """Bin of ``value`` on the :func:`_make_grid` grid: in its segment (``[lo, g_lo)``, ``[g_lo, g_hi)``, ``[g_hi, hi]``
    or NaN) the offset plus ``trunc(clamp((value - start) · scale, 0, top))`` in float32; non-decreasing."""
    g_lo, g_hi, lo, scale_b, top_b, scale_m, top_m, off_m, scale_t, top_t, off_t = grid
    bottom = value < g_lo
    upper = not (value < g_hi)
    start = lo if bottom else (g_hi if upper else g_lo)
    scale = scale_b if bottom else (scale_t if upper else scale_m)
    top = top_b if bottom else (top_t if upper else top_m)
    off = np.int32(0) if bottom else (off_t if upper else off_m)
    x = (value - start) * scale
    x = x if x < top else top  # also NaN
    x = x if x > np.float32(0.0) else np.float32(0.0)
    return np.int32(x) + off


@njit(inline="always")
def _decode_one(m):
    """float32 of the order-preserving int32 image ``m`` of its bits."""
    bits = np.empty(1, np.int32)
    bits[0] = np.int32(m ^ ((m >> 31) & 0x7FFFFFFF))
    return bits.view(np.float32)[0]


@njit(inline="always")
def _scale(lo, hi, bins):
    """float32 ``bins / (hi - lo)`` (``0``: one bin, if degenerate or overflowing)."""
    width = np.float64(hi) - np.float64(lo)
    scale = np.float32(bins / width if width > 0.0 else 0.0)
    return scale if scale < np.float32(np.inf) else np.float32(0.0)


@njit(nogil=True, fastmath={"reassoc"})  # the grid only affects speed: sums in any order
def _make_grid(vals, keys, n, lo, hi, bins):  # pragma: no cover - compiled
    """``(grid, number of bins)`` for the ``n`` valid scores ``vals`` (finite, in ``[lo, hi]``): middle segment
    ``mean ± _TAIL_SIGMAS · std``, outlier tails their own bins, ``bins / n`` per item in every segment."""
    total = 0.0
    total2 = 0.0
    for t in range(vals.shape[0]):
        v = np.float64(vals[t]) if keys[t] != _KEY_PAD else 0.0
        total += v
        total2 += v * v
    mean = total / n
    spread = _TAIL_SIGMAS * np.sqrt(max(total2 / n - mean * mean, 0.0))
    g_lo = np.float32(max(np.float64(lo), mean - spread))
    g_hi = np.float32(min(np.float64(hi), mean + spread))
    g_hi = max(g_hi, g_lo)
    n_bottom = 0
    n_top = 0
    for t in range(vals.shape[0]):
        valid = keys[t] != _KEY_PAD
        n_bottom += valid and vals[t] < g_lo
        n_top += valid and not vals[t] < g_hi
    per = bins / n
    b_bottom = max(int(per * n_bottom), 1)
    b_top = max(int(per * n_top), 1)
    b_mid = max(bins - b_bottom - b_top, 1)
    grid = (
        g_lo,
        g_hi,
        np.float32(lo),
        _scale(lo, g_lo, b_bottom),
        np.float32(b_bottom - 1),
        _scale(g_lo, g_hi, b_mid),
        np.float32(b_mid - 1),
        np.int32(b_bottom),
        _scale(g_hi, hi, b_top),
        np.float32(b_top - 1),
        np.int32(b_bottom + b_mid),
    )
    return grid, b_bottom + b_mid + b_top


@njit(nogil=True)
def _count_range(row, j0, j1, lo, grid, B, ge, r, bins, hist, skip_pruned):  # pragma: no cover - compiled
    """``hist[#{k : r_k > s}] += 1`` for the negatives ``s = row[j >= j0, < j1]`` scoring at least ``lo`` (others:
    spare slots ``n .. n + 7``; ``skip_pruned`` skips tiles of only those). ``ge[b + 2]`` / ``ge[b + 1]``: relevant
    items in bins ``> b`` / ``>= b``, ``ge[B + 2 + i] = n + i``; ``r`` ``(n + 8,)`` descending, ``-inf`` padded."""
    for t0 in range(j0, j1, _TILE):
        m = min(_TILE, j1 - t0)
        tile = row[t0 : t0 + m]
        if skip_pruned:  # most entries score below every relevant item: tiles holding no other are skipped
            kept = np.int32(0)
            for j in range(m):  # vectorised
                s = tile[j]
                b = _bin(s, grid) + np.int32(2)
                below = s < lo
                bins[j] = b if not below else np.int32(B + 2 + (j & 7))
                kept |= np.int32(not below)
            if kept == 0:
                continue
        else:
            for j in range(m):  # vectorised: table index of every entry
                s = tile[j]
                b = _bin(s, grid) + np.int32(2)
                bins[j] = b if not (s < lo) else np.int32(B + 2 + (j & 7))
        for j in range(m):
            s = tile[j]
            b = np.uint32(bins[j])
            a = np.uint32(ge[b])
            a += np.uint32(r[a] > s)  # first relevant item of the bin (if any) above s
            if r[a] > s:  # a second one: finish the bin exactly (items past the bin score strictly lower)
                e = np.uint32(ge[b - _ONE])
                if e - a <= _LINEAR_SCAN:
                    while r[a] > s:
                        a += _ONE
                else:
                    while a < e:
                        mid = (a + e) >> _ONE
                        if r[mid] > s:
                            a = mid + _ONE
                        else:
                            e = mid
            hist[a] += 1


@njit(nogil=True)
def _rank_row(row, vals, keys, n, a1, b1, sc, lo, hi, num_bins):  # pragma: no cover - compiled
    """``(sorted keys (n,), neg_ge (n,))`` of one row (``n`` valid ``keys``, scores ``vals`` finite in ``[lo, hi]``):
    a bucket sort on the counting grid, then the counting pass over the columns outside ``[a1, b1)`` but ``sc``."""
    ns = keys.shape[0]
    B = num_bins if num_bins > 0 else _DEFAULT_BINS * n
    B = max(min(B, 64 * n), 1)
    grid, B = _make_grid(vals, keys, n, lo, hi, B)
    binof = np.empty(ns, np.int32)
    for t in range(ns):  # vectorised
        binof[t] = _bin(vals[t], grid) + np.int32(1)
    # the bin table in 16 bits when it can (half the cache footprint of the counting pass's random lookups)
    if n + _SPREAD < 2**16:
        ge16 = np.zeros(B + 2 + _SPREAD, np.uint16)
        return _sort_and_count(row, keys, n, a1, b1, sc, lo, grid, B, binof, ge16)
    return _sort_and_count(row, keys, n, a1, b1, sc, lo, grid, B, binof, np.zeros(B + 2 + _SPREAD, np.int32))


@njit(nogil=True)
def _sort_and_count(row, keys, n, a1, b1, sc, lo, grid, B, binof, ge):  # pragma: no cover - compiled
    """:func:`_rank_row` once the bins ``binof`` (+1) of the keys are known; ``ge`` ``(B + 10,)`` zeros."""
    ns = keys.shape[0]
    # ge[b + 1]: items of bin b, then start of bin b in the descending order; after the placement the end of bin b
    for t in range(ns):
        ge[np.uint32(binof[t])] += np.int32(keys[t] != _KEY_PAD)
    acc = 0
    for b in range(B, 0, -1):
        c = ge[b]
        ge[b] = acc
        acc += c
    srt = np.empty(n, np.int64)
    for t in range(ns):
        k = keys[t]
        if k != _KEY_PAD:
            b = np.uint32(binof[t])
            srt[np.uint32(ge[b])] = k
            ge[b] += 1
    ge[0] = n  # now ge[b + 1] = #{bin >= b} = end of bin b, ge[b + 2] = #{bin > b} = its start
    ge[B + 1] = 0
    for i in range(_SPREAD):
        ge[B + 2 + i] = n + i
    moves = 0  # inversions exist only inside a bin; an unusually crowded row is sorted in full instead
    for i in range(1, n):
        x = srt[i]
        j = i - 1
        while j >= 0 and srt[j] > x:
            srt[j + 1] = srt[j]
            j -= 1
        srt[j + 1] = x
        moves += i - 1 - j
        if moves > _SORT_MOVES * n:
            srt.sort()
            break
    r = _decode_keys(srt, n, _SPREAD)
    bins = np.empty(_TILE, np.int32)
    hist = np.zeros(n + _SPREAD, np.int32)
    N = row.shape[0]
    step = max(N // _SAMPLES, 1)
    below = 0
    sampled = 0
    for j in range(0, N, step):  # a sample of the negatives: do most score below every relevant item?
        if j < a1 or j >= b1:
            below += row[j] < lo
            sampled += 1
    skip = below * 10 >= 9 * sampled
    for j0, j1 in ((0, a1), (b1, N)):
        if j0 <= sc < j1:  # the query's own column outside its slice
            _count_range(row, j0, sc, lo, grid, B, ge, r, bins, hist, skip)
            _count_range(row, sc + 1, j1, lo, grid, B, ge, r, bins, hist, skip)
        else:
            _count_range(row, j0, j1, lo, grid, B, ge, r, bins, hist, skip)
    neg_ge = np.empty(n, np.int64)
    acc = 0
    for k in range(n):
        acc += hist[k]
        neg_ge[k] = acc
    return srt, neg_ge


@njit(nogil=True)
def _count_general(row, keys, n, a1, b1, sc, num_bins):  # pragma: no cover - compiled
    """The two-pass kernel's sort and count (any scores, e.g. infinite or NaN relevant ones)."""
    srt = np.sort(keys)[:n]
    neg = row.copy()
    neg[a1:b1] = -np.inf
    if sc >= 0:
        neg[sc] = -np.inf
    neg_ge = np.empty(n, np.int64)
    _count_row(neg, _decode_keys(srt, n), n, num_bins, neg_ge)
    return srt, neg_ge


@njit(parallel=True, nogil=True)
def _block_ranks(scores, starts, ends, self_col, num_bins, levels, positions):  # pragma: no cover - compiled
    """Levels and 1-based positions ``(C, P)`` of the relevant items of each row in its pessimistic ranking, sorted
    (padding ``0`` last); see the module docstring."""
    C, P = levels.shape
    L = starts.shape[1]
    for c in numba.prange(C):
        row = scores[c]
        a1, b1 = starts[c, 0], ends[c, 0]
        ns = b1 - a1
        vals = row[a1:b1]
        bits = vals.view(np.int32)
        keys = np.empty(ns, np.int64)
        for t in range(ns):
            v = np.int64(bits[t])
            v = v if v != -(2**31) else 0  # -0.0 ties with +0.0
            keys[t] = -(v ^ ((v >> 31) & 0x7FFFFFFF)) * 64 + 1
        for m in range(1, L):
            keys[starts[c, m] - a1 : ends[c, m] - a1] += 1
        sc = self_col[c]
        n = ns
        if a1 <= sc < b1:
            keys[sc - a1] = _KEY_PAD
            n -= 1
        # extreme keys of the valid slots (the query's own column left out): scores, and whether all are finite
        s0 = sc - a1 if a1 <= sc < b1 else ns
        k_hi = min(keys[:s0].min() if s0 > 0 else _KEY_PAD, keys[s0 + 1 :].min() if s0 + 1 < ns else _KEY_PAD)
        k_lo = max(keys[:s0].max() if s0 > 0 else -_KEY_PAD, keys[s0 + 1 :].max() if s0 + 1 < ns else -_KEY_PAD)
        m_hi = -(k_hi >> 6)
        m_lo = -(k_lo >> 6)
        finite = m_hi < _INF_IMAGE and m_lo > -_INF_IMAGE - 1
        levels[c, n:] = 0
        positions[c, n:] = 0
        if n == 0:
            continue
        if finite:
            lo = _decode_one(m_lo)
            hi = _decode_one(m_hi)
            srt, neg_ge = _rank_row(row, vals, keys, n, a1, b1, sc, lo, hi, num_bins)
        else:
            srt, neg_ge = _count_general(row, keys, n, a1, b1, sc, num_bins)
        for k in range(n):
            levels[c, k] = srt[k] & 63
            positions[c, k] = neg_ge[k] + k + 1


def block_ranks_compiled(
    scores: Tensor, starts: Tensor, ends: Tensor, self_col: Tensor, num_bins: int | None = None, P: int | None = None
) -> tuple[Tensor, Tensor]:
    """``(levels, positions)`` ``(C, P)`` int64 of the relevant items of each row in its pessimistic ranking.

    Args:
        scores: ``(C, N)`` float32 CPU score block (gallery in label-path order); read, never modified.
        starts, ends: ``(C, L)`` int64 nested label slices (column 0 coarsest; ``L < 63``).
        self_col: ``(C,)`` int64 column of the query itself (``-1`` when not in the gallery).
        num_bins: counting bins per row (default ``8 · n``, at most ``64 · n``); speed only.
        P: width, at least ``max(ends[:, 0] - starts[:, 0])`` (read from the slices when None).

    Returns:
        ``levels`` and 1-based ``positions`` (``0`` on padding) sorted by score descending, then level ascending.

    Raises:
        ValueError: a tensor not on the CPU, of another dtype or with another row count (naming the argument).
    """
    if scores.device.type != "cpu" or scores.dtype != torch.float32 or scores.dim() != 2:
        raise ValueError(
            f"scores must be a 2-D float32 CPU tensor; got {tuple(scores.shape)} {scores.dtype} on {scores.device}"
        )
    for name, t in (("starts", starts), ("ends", ends), ("self_col", self_col)):
        if t.device.type != "cpu" or t.dtype != torch.int64 or t.shape[0] != scores.shape[0]:
            raise ValueError(
                f"{name} must be an int64 CPU tensor with one row per score row ({scores.shape[0]}); "
                f"got {tuple(t.shape)} {t.dtype} on {t.device}"
            )
    C = scores.shape[0]
    if P is None:
        P = int((ends[:, 0] - starts[:, 0]).max()) if C else 0
    levels = torch.empty(C, P, dtype=torch.int64)
    positions = torch.empty(C, P, dtype=torch.int64)
    if levels.numel():
        with _threads():
            _block_ranks(
                scores.contiguous().numpy(),
                starts.contiguous().numpy(),
                ends.contiguous().numpy(),
                self_col.contiguous().numpy(),
                int(num_bins) if num_bins is not None else 0,
                levels.numpy(),
                positions.numpy(),
            )
    return levels, positions


@njit(parallel=True, nogil=True)
def _count_rows(neg, rs, n_rel, num_bins, out):  # pragma: no cover - compiled
    """``out[c, k] = #{j : neg[c, j] >= rs[c, k]}`` for ``k < n_rel[c]`` (0 elsewhere), ``rs`` descending;
    ``num_bins <= 0``: ``_DEFAULT_BINS · n_rel[c]`` bins."""
    for c in numba.prange(neg.shape[0]):
        out[c, :] = 0
        n = n_rel[c]
        if n > 0:
            r = np.empty(n + 1, rs.dtype)
            r[:n] = rs[c, :n]
            r[n] = -np.inf
            _count_row(neg[c], r, n, num_bins, out[c])


@njit(parallel=True, nogil=True)
def _count_rows_keys(neg, keys, n_rel, num_bins, out):  # pragma: no cover - compiled
    """:func:`_count_rows` for float32 ``neg``, the relevant items given as sorted int64 keys (:func:`_decode_keys`)."""
    for c in numba.prange(neg.shape[0]):
        out[c, :] = 0
        n = n_rel[c]
        if n > 0:
            _count_row(neg[c], _decode_keys(keys[c], n), n, num_bins, out[c])


def count_negatives_compiled(neg_scores: Tensor, rs: Tensor, n_rel: Tensor, num_bins: int | None = None) -> Tensor:
    """``neg_ge[c, k] = #{j : neg_scores[c, j] >= rs[c, k]}`` for the valid relevant items, with the compiled kernel.

    Args:
        neg_scores: ``(C, N)`` float32/float64 CPU scores of the negatives, ``-inf`` elsewhere; not modified.
        rs: ``(C, P)`` float32/float64 relevant scores, descending, valid slots first; or, with float32
            ``neg_scores``, their sorted int64 pessimistic keys.
        n_rel: ``(C,)`` int64 number of valid slots of each row of ``rs``.
        num_bins: bins per row (default ``8 · n_rel``, at most ``64 · n_rel``); speed only.

    Returns:
        ``(C, P)`` int64 counts, ``0`` on padding slots.

    Raises:
        ValueError: a tensor not on the CPU or of an unsupported dtype (naming the argument).
    """
    keys = rs.dtype == torch.int64
    for name, t in (("neg_scores", neg_scores), ("rs", rs)):
        if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64) and not (name == "rs" and keys):
            raise ValueError(f"{name} must be a float32/float64 CPU tensor; got {t.dtype} on {t.device}")
    if keys and neg_scores.dtype != torch.float32:
        raise ValueError(f"int64 keys rs need float32 neg_scores; got {neg_scores.dtype}")
    C, P = rs.shape
    out = torch.empty(C, P, dtype=torch.int64)
    if C == 0 or P == 0:
        return out.zero_()
    neg = neg_scores.detach().contiguous().numpy()
    rel = rs.detach().contiguous().numpy()
    counts = n_rel.detach().to(torch.int64).contiguous().numpy()
    with _threads():
        (_count_rows_keys if keys else _count_rows)(neg, rel, counts, int(num_bins or 0), out.numpy())
    return out
