"""Benchmark: evaluation and search at the size of users' data. Prints one JSON object.

* ``eval_2proc_*`` — exact evaluation of ``--n-split`` items (``--dim``-d, 2 label levels) by 2 gloo processes of
  1 thread each (``RetrievalEvaluator.evaluate(distributed=True)``: each ranks half of the queries against the whole
  set, the per-query results are gathered once) against 1 process of 1 thread; ``eval_2proc_speedup`` = one-process
  seconds / two-process seconds (the slower rank, gather included); ``eval_2proc_identical``: every per-query value
  of rank 0's result equals the one-process value (counts bitwise, float metrics to 1e-12) and so do the summaries.
* ``eval_<n>_*`` — the default evaluator (every metric group, 2 levels) on ``--n-large`` items in one process:
  seconds, the ratio to the floor (the blocked score matrix alone — one matmul per chunk of the evaluator's chunk
  size — in the same process), and the peak resident memory above the resident memory once the embeddings exist
  (GB; ``ru_maxrss`` of a fresh process).
* ``search_<n>_*`` — ``RetrievalIndex`` with ``--search-backend`` (``faiss-hnsw`` or ``faiss-ivf``) over ``--n-search``
  clustered vectors: recall@10 against the exact torch backend (mean over ``--queries`` held-out queries), queries
  per second, build seconds, and the exact backend's queries per second.

Every part runs in its own fresh process (clean peak memory, its own thread count). The machine may be shared: the
ratios are measured in one process each; absolute seconds hold only for the machine and load they were taken on.

    PYTHONPATH=. python benchmarks/bench_scale.py                 # 20,000 / 200,000 / 1,000,000 (tens of minutes)
    PYTHONPATH=. python benchmarks/bench_scale.py --n-split 4000 --n-large 20000 --n-search 100000
    PYTHONPATH=. python benchmarks/bench_scale.py --dry-run       # tiny sizes, seconds (the test runs this)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty

import numpy as np
import torch
import torch.nn.functional as F

COUNT_KEYS_PREFIX = "num_"


def labelled(n: int, dim: int, seed: int, per_class: int = 20, per_coarse: int = 10) -> tuple[torch.Tensor, ...]:
    """``(n, dim)`` L2-normalised float32 embeddings around one centre per fine class (``~per_class`` items each,
    noise comparable to the spread of the centres: classes overlap as real embeddings do) and ``(n, 2)`` labels
    (fine, coarse = fine // ``per_coarse``)."""
    g = torch.Generator().manual_seed(seed)
    classes = max(1, n // per_class)
    centres = F.normalize(torch.randn(classes, dim, generator=g), dim=1)
    fine = torch.randint(0, classes, (n,), generator=g)
    emb = torch.empty(n, dim)
    for s in range(0, n, 100_000):
        e = min(s + 100_000, n)
        emb[s:e] = F.normalize(centres[fine[s:e]] + torch.randn(e - s, dim, generator=g) / math.sqrt(dim), dim=1)
    return emb, torch.stack([fine, fine // per_coarse], 1)


def _warm_up() -> None:
    """Load (or compile) the evaluator's kernels before anything is timed."""
    from pml_suprank.metrics import RetrievalEvaluator

    emb, labels = labelled(300, 16, 0)
    RetrievalEvaluator().evaluate(emb, labels)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------------------------------- the split
def _split_worker(rank: int, world: int, port: int, args: dict, out: str) -> None:
    import torch.distributed as dist

    from pml_suprank.metrics import RetrievalEvaluator

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    emb, labels = labelled(args["n"], args["dim"], args["seed"])
    _warm_up()
    evaluator = RetrievalEvaluator()
    dist.barrier()
    t0 = time.perf_counter()
    result = evaluator.evaluate(emb, labels, return_per_query=True, distributed=True)
    seconds = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    if rank == 0:
        _save(out, result, float(seconds))
    dist.barrier()
    dist.destroy_process_group()


def _one_process_worker(args: dict, out: str) -> None:
    from pml_suprank.metrics import RetrievalEvaluator

    torch.set_num_threads(1)
    emb, labels = labelled(args["n"], args["dim"], args["seed"])
    _warm_up()
    t0 = time.perf_counter()
    result = RetrievalEvaluator().evaluate(emb, labels, return_per_query=True)
    _save(out, result, time.perf_counter() - t0)


def _save(out: str, result: dict, seconds: float) -> None:
    per_query = result.pop("per_query")
    np.savez(out, **{f"pq_{k}": v.numpy() for k, v in per_query.items()})
    Path(out + ".json").write_text(json.dumps({"seconds": seconds, "summary": result}))


def _load(out: str) -> tuple[dict, dict, float]:
    meta = json.loads(Path(out + ".json").read_text())
    with np.load(out + ".npz", allow_pickle=False) as z:
        per_query = {k[3:]: z[k] for k in z.files}
    return meta["summary"], per_query, meta["seconds"]


def identical(a: tuple[dict, dict], b: tuple[dict, dict], tol: float = 1e-12) -> bool:
    """Summaries and per-query values equal: counts exactly, float metrics to ``tol`` (NaN = NaN)."""
    (sa, pa), (sb, pb) = a, b
    if sa.keys() != sb.keys() or pa.keys() != pb.keys():
        return False
    for key, x in sa.items():
        y = sb[key]
        if key.startswith(COUNT_KEYS_PREFIX):
            if x != y:
                return False
        elif not (abs(x - y) <= tol or (math.isnan(x) and math.isnan(y))):
            return False
    for key, x in pa.items():
        y = pb[key]
        if x.shape != y.shape or not np.array_equal(np.isnan(x), np.isnan(y)):
            return False
        ok = ~np.isnan(x)
        if ok.any() and float(np.abs(x[ok] - y[ok]).max()) > tol:
            return False
    return True


def eval_split(n: int, dim: int, seed: int, tmp: str) -> dict:
    ctx = mp.get_context("spawn")
    args = {"n": n, "dim": dim, "seed": seed}
    one = os.path.join(tmp, "one")
    p = ctx.Process(target=_one_process_worker, args=(args, one))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"one-process evaluation failed (exit {p.exitcode})")
    two = os.path.join(tmp, "two")
    port = _free_port()
    procs = [ctx.Process(target=_split_worker, args=(r, 2, port, args, two)) for r in range(2)]
    for q in procs:
        q.start()
    for q in procs:
        q.join()
    if any(q.exitcode != 0 for q in procs):
        raise RuntimeError(f"two-process evaluation failed (exits {[q.exitcode for q in procs]})")
    s1, p1, t1 = _load(one)
    s2, p2, t2 = _load(two)
    return {
        "eval_2proc_n": n,
        "eval_1proc_seconds": round(t1, 3),
        "eval_2proc_seconds": round(t2, 3),
        "eval_2proc_speedup": round(t1 / t2, 3),
        "eval_2proc_identical": identical((s1, p1), (s2, p2)),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------- one large set
def _large_worker(args: dict, queue) -> None:
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.metrics.eval_blocks import block_shape, label_blocks

    if args["threads"]:
        torch.set_num_threads(args["threads"])
    _warm_up()
    emb, labels = labelled(args["n"], args["dim"], args["seed"])
    base = _rss_bytes()
    t0 = time.perf_counter()
    RetrievalEvaluator().evaluate(emb, labels)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # the floor: the evaluator's blocked score matrix alone (its chunk size: same label grouping, same budget)
    _, starts, ends = label_blocks(labels, labels)
    chunk, _ = block_shape(emb.shape[0], int((ends[:, 0] - starts[:, 0]).max()), torch.device("cpu"), 2)
    buf = torch.empty(min(chunk, emb.shape[0]), emb.shape[0])
    t0 = time.perf_counter()
    for s in range(0, emb.shape[0], chunk):
        e = min(s + chunk, emb.shape[0])
        torch.mm(emb[s:e], emb.T, out=buf[: e - s])
    floor = time.perf_counter() - t0
    queue.put({"seconds": seconds, "floor": floor, "over_gb": (peak - base) / 1e9, "chunk": chunk,
               "embeddings_gb": emb.numel() * 4 / 1e9, "threads": torch.get_num_threads()})  # fmt: skip


def eval_large(n: int, dim: int, seed: int, threads: int) -> dict:
    r = _in_process(_large_worker, {"n": n, "dim": dim, "seed": seed, "threads": threads})
    tag = _tag(n)
    return {
        f"eval_{tag}_n": n,
        f"eval_{tag}_seconds": round(r["seconds"], 2),
        f"eval_{tag}_floor_seconds": round(r["floor"], 2),
        f"eval_{tag}_floor_ratio": round(r["seconds"] / r["floor"], 3),
        f"eval_{tag}_peak_rss_gb_over_embeddings": round(r["over_gb"], 3),
        f"eval_{tag}_embeddings_gb": round(r["embeddings_gb"], 3),
        f"eval_{tag}_threads": r["threads"],
    }


# --------------------------------------------------------------------------------------------------- search
def _search_worker(args: dict, queue) -> None:
    from pml_suprank.search import RetrievalIndex

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_search import clustered, recall_at_k

    if args["threads"]:
        torch.set_num_threads(args["threads"])
    data, _ = clustered(args["n"] + args["queries"], args["dim"], args["clusters"], 0.8, args["seed"])
    gallery, queries = data[: args["n"]], data[args["n"] :].clone()
    del data
    exact_index = RetrievalIndex(gallery)
    t0 = time.perf_counter()
    _, exact = exact_index.search(queries, 10)
    exact_s = time.perf_counter() - t0
    del exact_index
    backend = args["backend"]
    if backend == "faiss-hnsw":
        options = {"hnsw_m": 32, "ef_construction": 64, "ef_search": args["ef_search"]}
    else:
        nlist = args["nlist"]
        options = {"nlist": nlist, "nprobe": args["nprobe"], "train_size": min(args["n"], 64 * nlist)}
    t0 = time.perf_counter()
    index = RetrievalIndex(gallery, backend=backend, **options)
    build = time.perf_counter() - t0
    index.search(queries[:10], 10)
    t0 = time.perf_counter()
    _, found = index.search(queries, 10)
    search_s = time.perf_counter() - t0
    queue.put({"recall": recall_at_k(found, exact), "qps": len(queries) / search_s, "build": build,
               "exact_qps": len(queries) / exact_s, "options": options})  # fmt: skip


def search_scale(n: int, dim: int, queries: int, backend: str, seed: int, threads: int, **opts) -> dict:
    clusters = max(1, n // 1000)
    r = _in_process(_search_worker, {"n": n, "dim": dim, "queries": queries, "backend": backend, "seed": seed,
                                     "threads": threads, "clusters": clusters, **opts})  # fmt: skip
    tag = _tag(n)
    return {
        f"search_{tag}_n": n,
        f"search_{tag}_backend": backend,
        f"search_{tag}_options": r["options"],
        f"search_{tag}_recall_at_10": round(r["recall"], 4),
        f"search_{tag}_qps": round(r["qps"], 1),
        f"search_{tag}_build_seconds": round(r["build"], 2),
        f"search_{tag}_exact_qps": round(r["exact_qps"], 1),
    }


def _in_process(target, args: dict) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=target, args=(args, queue))
    p.start()
    while True:  # a worker that dies before it reports must not leave the benchmark waiting forever
        try:
            result = queue.get(timeout=2)
            break
        except Empty:
            if not p.is_alive():
                raise RuntimeError(f"{target.__name__} failed (exit {p.exitcode})") from None
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"{target.__name__} failed (exit {p.exitcode})")
    return result


def _tag(n: int) -> str:
    """``200000`` -> ``"200k"``, ``1000000`` -> ``"1m"``, other sizes as digits."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)  # fmt: skip
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-split", type=int, default=20_000, help="items of the 2-process split")
    parser.add_argument("--n-large", type=int, default=200_000, help="items of the one-process evaluation")
    parser.add_argument("--n-search", type=int, default=1_000_000, help="gallery of the search part")
    parser.add_argument("--queries", type=int, default=1000, help="search queries")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--search-backend", choices=("faiss-hnsw", "faiss-ivf"), default="faiss-ivf")
    parser.add_argument("--nlist", type=int, default=1024, help="faiss-ivf cells")
    parser.add_argument("--nprobe", type=int, default=16, help="faiss-ivf cells scanned per query")
    parser.add_argument("--ef-search", type=int, default=128, help="faiss-hnsw candidate list")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of the large parts (0: torch's default)")
    parser.add_argument("--parts", default="split,large,search", help="comma-separated subset of split,large,search")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes (seconds): checks that every part runs")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= {"split", "large", "search"}:
        parser.error(f"--parts must be a subset of split,large,search; got {args.parts!r}")
    if args.dry_run:
        args.n_split, args.n_large, args.n_search, args.queries, args.dim = 400, 600, 3000, 50, 16
        args.nlist, args.nprobe = 16, 4
    result: dict = {
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "torch": torch.__version__,
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "dry_run": args.dry_run,
    }
    if "split" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            result.update(eval_split(args.n_split, args.dim, args.seed, tmp))
    if "large" in parts:
        result.update(eval_large(args.n_large, args.dim, args.seed, args.threads))
    if "search" in parts:
        result.update(search_scale(args.n_search, args.dim, args.queries, args.search_backend, args.seed,
                                   args.threads, nlist=args.nlist, nprobe=args.nprobe,
                                   ef_search=args.ef_search))  # fmt: skip
    print(json.dumps(result))  # noqa: T201 - the benchmark's output
    return result


if __name__ == "__main__":
    main()
