"""Benchmark: the counting pass of the exact evaluator on the CPU (numba), previous kernels vs the fused one.

The previous path (a frozen copy of it is kept below): ``block_keys`` (keys of each row's relevant slice), a numpy
sort of the keys in row bands on ``torch.get_num_threads()`` threads, then ``block_positions`` (one counting pass
over the negatives per row). The current path: ``block_ranks_compiled``, one fused pass per row (keys, bucket sort
on the counting grid, vectorised binning of the negatives, exact resolution inside the bins).

Both run, in one process, on the same score blocks (``evaluate``'s chunks of the data of ``bench_eval.floor_data``:
coarse labels unrelated to the geometry, so the relevant items of a query spread over the whole score range and
pruning helps little), with 1 thread and with ``torch.get_num_threads()`` threads; the script prints the time of
the score blocks (the floor), of each path and their ratio, and checks that the levels and positions are identical.
The machine may be shared: only ratios measured in one process are meaningful.

    python benchmarks/bench_count_pass.py --sizes 20000 --levels 2 3
    python benchmarks/bench_count_pass.py --sizes 2000 --chunks 2      # quick
"""

from __future__ import annotations

import argparse
import threading
import time

import numba
import numpy as np
import torch
from bench_eval import floor_data

from pml_suprank.metrics._compiled_rank_counts import block_ranks_compiled
from pml_suprank.metrics.eval_blocks import chunk_rows, label_blocks

_KEY_PAD = (2**63 - 1) & ~63
_OLD_DEFAULT_BINS = 8
_OLD_LINEAR_SCAN = 8

# ---------------------------------------------------------------------------------------------------------------
# frozen copy of the previous kernels (pml_suprank/metrics/_compiled_counts.py at fd1b9e1), the reference timing


@numba.njit(inline="always")
def _old_bin(value, lo, scale, num_bins):
    """Bin of ``value >= lo``: ``floor((value - lo) · scale)`` in float64, clamped to ``num_bins - 1`` (also for an
    overflow to inf or NaN). A chain of correctly rounded monotone operations, so ``bin`` is non-decreasing in
    ``value``: an item in a higher bin than a relevant item scores strictly higher, one in a lower bin strictly
    lower."""
    x = (np.float64(value) - lo) * scale
    if x < num_bins:
        return np.int64(x)
    return num_bins - 1


@numba.njit(nogil=True)
def _old_count_row(row, r, n, num_bins, out_row):
    """``out_row[k] = #{j : row[j] >= r[k]}`` for ``k < n``: ``row`` ``(N,)`` scores, ``r`` ``(n + 1,)`` the relevant
    scores in descending order followed by a ``-inf`` sentinel (never above a kept negative)."""
    N = row.shape[0]
    lo = np.float64(r[n - 1])
    width = np.float64(r[0]) - lo
    B = num_bins if num_bins > 0 else _OLD_DEFAULT_BINS * n
    B = max(min(B, 64 * n), 1)
    scale = B / width if width > 0.0 else 0.0
    if not scale < np.inf:  # width subnormal-small or infinite: one bin, still exact
        scale = 0.0
    # ge[b] = #{k : bin(r_k) >= b} (r descending: bins non-increasing), ge[B] = 0
    ge = np.zeros(B + 1, np.int32)
    for k in range(n):
        ge[_old_bin(r[k], lo, scale, B)] += 1
    for b in range(B - 1, -1, -1):
        ge[b] += ge[b + 1]
    # slot[j] = #{k : r_k > s_j} for the kept negatives, n for the others; two passes (slots, then their
    # histogram) keep the histogram's stores out of the lookup loop, which is several times faster
    slot = np.empty(N, np.int32)
    lo_s = r[n - 1]
    for j in range(N):
        s = row[j]
        if s < lo_s:  # below every relevant item (also the -inf of removed items): never counts
            slot[j] = n
            continue
        b = _old_bin(s, lo, scale, B)
        a = np.int64(ge[b + 1])  # relevant items in higher bins: all score strictly higher
        a += np.int64(r[a] > s)  # items past the bin score strictly lower than s; the sentinel ends the row
        if r[a] > s:  # a second relevant item of the bin scores higher: finish the bin exactly
            e = np.int64(ge[b])
            if e - a <= _OLD_LINEAR_SCAN:
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


@numba.njit(nogil=True)
def _old_decode_keys(keys_row, n):
    """The float32 scores ``(n + 1,)`` of the first ``n`` sorted pessimistic keys ``-m(r)·64 + level`` of a row, then
    a ``-inf`` sentinel (``m``: the order-preserving int32 image of the float bits, an involution)."""
    bits = np.empty(n + 1, np.int32)
    for k in range(n):
        m = -(keys_row[k] >> 6)
        bits[k] = np.int32(m ^ ((m >> 31) & 0x7FFFFFFF))
    r = bits.view(np.float32)
    r[n] = -np.inf
    return r


@numba.njit(parallel=True, nogil=True)
def _old_block_keys(bits, starts, ends, self_col, keys):
    """``keys[c, t]`` = pessimistic int64 key ``-m(s)·64 + level`` of column ``starts[c, 0] + t`` of row ``c``
    (``bits``: the float32 scores viewed as int32; ``_KEY_PAD`` on padding and on the query's own column): level 1
    inside ``[starts[c, 0], ends[c, 0])``, +1 per finer nested slice ``[starts[c, m], ends[c, m])`` containing the
    column."""
    C, P = keys.shape
    L = starts.shape[1]
    for c in numba.prange(C):
        a, b = starts[c, 0], ends[c, 0]
        n = b - a
        for t in range(n):
            v = np.int64(bits[c, a + t])
            if v == -(2**31):  # -0.0 ties with +0.0
                v = 0
            keys[c, t] = -(v ^ ((v >> 31) & 0x7FFFFFFF)) * 64 + 1
        for m in range(1, L):
            for j in range(starts[c, m], ends[c, m]):
                keys[c, j - a] += 1
        s = self_col[c]
        if a <= s < b:
            keys[c, s - a] = _KEY_PAD
        for t in range(n, P):
            keys[c, t] = _KEY_PAD


@numba.njit(parallel=True, nogil=True)
def _old_block_positions(scores, keys, a1, b1, self_col, num_bins, levels, positions):
    """Levels and 1-based positions ``(C, P)`` of the sorted relevant items (``keys``, padding last) of each row.

    The negatives are every column outside ``[a1, b1)`` but the query's own: the slice and that column are set to
    ``-inf`` in ``scores`` (the caller's buffer), then :func:`_count_row` counts, for each relevant item, the
    negatives scoring at least as high."""
    C, P = keys.shape
    for c in numba.prange(C):
        row = scores[c]
        row[a1[c] : b1[c]] = -np.inf
        if self_col[c] >= 0:
            row[self_col[c]] = -np.inf
        n = 0
        while n < P and keys[c, n] != _KEY_PAD:
            n += 1
        for t in range(n, P):
            levels[c, t] = 0
            positions[c, t] = 0
        if n == 0:
            continue
        r = _old_decode_keys(keys[c], n)
        neg_ge = np.empty(n, np.int64)
        _old_count_row(row, r, n, num_bins, neg_ge)
        for k in range(n):
            levels[c, k] = keys[c, k] & 63
            positions[c, k] = neg_ge[k] + k + 1


def _old_sort_rows(keys: np.ndarray) -> None:
    """numpy's in-place row sort in row bands on ``torch.get_num_threads()`` threads (the previous ``_sort_rows``)."""
    parts = max(min(torch.get_num_threads(), keys.shape[0], keys.size // 2**18), 1)
    bounds = [keys.shape[0] * i // parts for i in range(parts + 1)]
    threads = [threading.Thread(target=keys[a:b].sort, kwargs={"axis": 1}) for a, b in zip(bounds[1:-1], bounds[2:])]
    for t in threads:
        t.start()
    keys[: bounds[1]].sort(axis=1)
    for t in threads:
        t.join()


def old_path(scores: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, self_col: torch.Tensor, P: int):
    """``(levels, positions)`` by the previous kernels (overwrites ``scores``' relevant slices with ``-inf``)."""
    C = scores.shape[0]
    keys = np.empty((C, P), np.int64)
    levels = np.empty((C, P), np.int64)
    positions = np.empty((C, P), np.int64)
    a1, b1 = starts[:, 0].contiguous().numpy(), ends[:, 0].contiguous().numpy()
    with _Threads():
        _old_block_keys(scores.numpy().view(np.int32), starts.numpy(), ends.numpy(), self_col.numpy(), keys)
        _old_sort_rows(keys)
        _old_block_positions(scores.numpy(), keys, a1, b1, self_col.numpy(), 0, levels, positions)
    return torch.from_numpy(levels), torch.from_numpy(positions)


class _Threads:
    """As many numba threads as torch uses, restored afterwards."""

    def __enter__(self) -> None:
        self.previous = numba.get_num_threads()
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))

    def __exit__(self, *exc) -> None:
        numba.set_num_threads(self.previous)


# ---------------------------------------------------------------------------------------------------------------


def chunks_of(n: int, levels: int, chunks: int | None) -> tuple[list, torch.Tensor, torch.Tensor]:
    """``evaluate``'s chunks ``(first, last, starts, ends, self_col, P)`` of ``floor_data(n, levels)`` (``chunks`` of
    them spread over the queries, all when None), the query embeddings and the gallery in label-path order."""
    emb, labels = floor_data(n, levels)
    perm, starts, ends = label_blocks(labels, labels)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    widths = ends[:, 0] - starts[:, 0]
    rows = chunk_rows(n, int(widths.max()), torch.device("cpu"), levels)
    firsts = list(range(0, n, rows))
    if chunks is not None and chunks < len(firsts):
        firsts = [firsts[i * len(firsts) // chunks] for i in range(chunks)]
    out = []
    for s in firsts:
        e = min(s + rows, n)
        out.append(
            (s, e, starts[s:e].contiguous(), ends[s:e].contiguous(), inv[s:e].contiguous(), int(widths[s:e].max()))
        )
    return out, emb, emb[perm].contiguous()


def measure(
    n: int, levels: int, chunks: int | None = None, threads: tuple[int, ...] = (1, 2), repeats: int = 2
) -> dict:
    """Seconds (best of ``repeats``) of the score blocks and of both paths per thread count, their ratio, and whether
    the levels and positions are identical. As in ``evaluate``, each path ranks a block right after its matrix
    product wrote it (the product itself is timed apart)."""
    blocks, emb, gallery = chunks_of(n, levels, chunks)
    buf = torch.empty(max(e - s for s, e, *_ in blocks), n)
    paths = {"old": old_path, "new": lambda *a: block_ranks_compiled(*a[:4], None, a[4])}
    identical = True
    mm_seconds = 0.0
    for s, e, st, en, sc, P in blocks:
        scores = buf[: e - s]
        t = time.perf_counter()
        torch.mm(emb[s:e], gallery.T, out=scores)
        mm_seconds += time.perf_counter() - t
        new = paths["new"](scores, st, en, sc, P)
        old = paths["old"](scores, st, en, sc, P)
        identical &= torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
    result = {"n": n, "levels": levels, "rows": sum(e - s for s, e, *_ in blocks), "score_blocks_s": mm_seconds}
    result["identical"] = bool(identical)
    previous = torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            best = dict.fromkeys(paths, float("inf"))
            for _ in range(repeats):  # interleaved: both paths see the same machine load
                for name, path in paths.items():
                    seconds = 0.0
                    for s, e, st, en, sc, P in blocks:
                        scores = buf[: e - s]
                        torch.mm(emb[s:e], gallery.T, out=scores)
                        start = time.perf_counter()
                        path(scores, st, en, sc, P)
                        seconds += time.perf_counter() - start
                    best[name] = min(best[name], seconds)
            result[f"threads_{t}"] = {"old_s": best["old"], "new_s": best["new"], "ratio": best["old"] / best["new"]}
    finally:
        torch.set_num_threads(previous)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000], help="gallery sizes N (queries = gallery)")
    parser.add_argument("--levels", type=int, nargs="+", default=[2, 3], choices=[2, 3])
    parser.add_argument("--chunks", type=int, default=None, help="time this many chunks spread over the queries")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    threads = tuple(sorted({1, torch.get_num_threads()}))
    print(f"torch {torch.__version__}, numba {numba.__version__}, threads {threads}")
    for n in args.sizes:
        for levels in args.levels:
            r = measure(n, levels, args.chunks, threads, args.repeats)
            line = f"N={n} levels={levels} rows={r['rows']} score blocks {r['score_blocks_s']:.3f}s"
            for t in threads:
                m = r[f"threads_{t}"]
                line += f" | {t} thr: old {m['old_s']:.3f}s new {m['new_s']:.3f}s ratio {m['ratio']:.2f}x"
            print(line + f" | identical: {r['identical']}")
            if not r["identical"]:
                raise SystemExit("the fused kernel's positions differ from the previous kernels'")


if __name__ == "__main__":
    main()
