"""Benchmark: the counting pass of the exact evaluator on the CPU (numba), the two-pass route vs the fused kernel.

The two-pass route (that of ``counting="compiled"`` in :func:`pml_suprank.metrics.ranks.rank_relevant_items`): the
keys of each row's relevant slice in torch, a numpy sort of the keys in row bands on ``torch.get_num_threads()``
threads, then ``count_negatives_compiled`` (one counting pass over the negatives per row). The current path:
``block_ranks_compiled``, one fused pass per row (keys, bucket sort on the counting grid, vectorised binning of the
negatives, exact resolution inside the bins).

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
import time

import numba
import torch
from bench_eval import floor_data

from pml_suprank.metrics._compiled_rank_counts import block_ranks_compiled, count_negatives_compiled
from pml_suprank.metrics.eval_blocks import block_shape, label_blocks
from pml_suprank.metrics.ranks import _pessimistic_keys, _sort_rows


def old_path(scores: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, self_col: torch.Tensor, P: int):
    """``(levels, positions)`` ``(C, P)`` by the two-pass route (overwrites ``scores``' relevant slices with
    ``-inf``; the query's own column lies in its slice)."""
    cols = starts[:, :1] + torch.arange(P)
    in_slice = cols < ends[:, :1]
    lev = in_slice.long()
    for m in range(1, starts.shape[1]):
        lev += (cols >= starts[:, m : m + 1]) & (cols < ends[:, m : m + 1])
    lev.masked_fill_(cols == self_col[:, None], 0)
    rel = scores.gather(1, cols.clamp_max(scores.shape[1] - 1))
    keys = _sort_rows(_pessimistic_keys(rel, lev, starts.shape[1]))
    arange = torch.arange(scores.shape[1])
    scores.masked_fill_((arange >= starts[:, :1]) & (arange < ends[:, :1]), float("-inf"))
    n_rel = (lev > 0).sum(1)
    neg_ge = count_negatives_compiled(scores, keys, n_rel)
    valid = torch.arange(P) < n_rel[:, None]
    return (keys & 63).masked_fill_(~valid, 0), neg_ge.add_(torch.arange(P) + 1).masked_fill_(~valid, 0)


# ---------------------------------------------------------------------------------------------------------------


def chunks_of(n: int, levels: int, chunks: int | None) -> tuple[list, torch.Tensor, torch.Tensor]:
    """``evaluate``'s chunks ``(first, last, starts, ends, self_col, P)`` of ``floor_data(n, levels)`` (``chunks`` of
    them spread over the queries, all when None), the query embeddings and the gallery in label-path order."""
    emb, labels = floor_data(n, levels)
    perm, starts, ends = label_blocks(labels, labels)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    widths = ends[:, 0] - starts[:, 0]
    rows, _ = block_shape(n, int(widths.max()), torch.device("cpu"), levels)
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
