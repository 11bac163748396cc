"""Benchmark: exact and approximate search with ``pml_suprank.search.RetrievalIndex`` on synthetic clustered vectors.

Backends, all through ``RetrievalIndex``: exact ``"torch"`` (the baseline and the ground truth), exact ``"faiss"``
(``IndexFlatIP``), ``"faiss-ivf"`` (several ``nprobe``) and ``"faiss-hnsw"`` (several ``ef_search``). For each:
build time (index construction: copy / k-means training / graph), queries per second (all queries in one batch,
k = 10, the best of ``--repeats`` runs) and recall@10 = |approximate top-10 ∩ exact top-10| / 10 averaged over the
queries. Ratios are against the exact torch backend measured in the same process (the machine is shared: only ratios
are meaningful).

Data: ``--n`` gallery vectors in ``--dim`` dimensions drawn around ``--clusters`` Gaussian centres (unit centres,
per-point noise of norm ~``--noise``), L2-normalised; ``--queries`` held-out queries from the same mixture.

    python benchmarks/bench_search.py                      # 1,000,000 x 128, 1,000 queries
    python benchmarks/bench_search.py --n 100000 --quick   # a quick check
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import torch.nn.functional as F

from pml_suprank.search import RetrievalIndex
from pml_suprank.search.faiss_backends import import_faiss


def clustered(n: int, dim: int, clusters: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, dim)`` L2-normalised points around ``clusters`` centres, and the centres (generated in blocks)."""
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(clusters, dim, generator=g), dim=1)
    out = torch.empty(n, dim)
    for s in range(0, n, 100_000):
        e = min(s + 100_000, n)
        assign = torch.randint(0, clusters, (e - s,), generator=g)
        out[s:e] = F.normalize(centres[assign] + noise / dim**0.5 * torch.randn(e - s, dim, generator=g), dim=1)
    return out, centres


def recall_at_k(found: torch.Tensor, exact: torch.Tensor) -> float:
    hits = (found.unsqueeze(2) == exact.unsqueeze(1)).any(dim=2).sum()
    return float(hits) / exact.numel()


def run(args: argparse.Namespace) -> list[dict]:
    data, _ = clustered(args.n + args.queries, args.dim, args.clusters, args.noise, args.seed)
    gallery, queries = data[: args.n], data[args.n :]
    del data
    nlist = args.nlist or max(1, int(4 * args.n**0.5) // 256 * 256 or 256)
    settings = [("torch", {}, "exact"), ("faiss", {}, "exact IndexFlatIP")]
    settings += [("faiss-ivf", {"nlist": nlist, "nprobe": p, "train_size": min(args.n, args.ivf_train)},
                  f"nlist={nlist}, nprobe={p}") for p in args.nprobe]  # fmt: skip
    settings += [("faiss-hnsw", {"hnsw_m": args.hnsw_m, "ef_construction": args.ef_construction, "ef_search": ef},
                  f"M={args.hnsw_m}, efC={args.ef_construction}, efS={ef}") for ef in args.ef_search]  # fmt: skip
    settings = [s for s in settings if s[0] in args.backends]
    rows, exact, built = [], None, {}
    for backend, options, label in settings:
        build_key = (backend, tuple(sorted((k, v) for k, v in options.items() if k not in ("nprobe", "ef_search"))))
        if build_key in built:  # same structure, another search parameter: reuse it (build time reported once)
            index, build_s = built[build_key][0], None
            index.set_search_options(**{k: options[k] for k in ("nprobe", "ef_search") if k in options})
        else:
            built.clear()  # free the previous structure before building the next one
            t0 = time.perf_counter()
            index = RetrievalIndex(gallery, backend=backend, **options)
            build_s = time.perf_counter() - t0
            built[build_key] = (index,)
        index.search(queries[:10], args.k)  # warm-up
        times = []
        for _ in range(args.repeats):  # best of several runs: the machine is shared, its load varies
            t0 = time.perf_counter()
            _, found = index.search(queries, args.k)
            times.append(time.perf_counter() - t0)
        search_s = min(times)
        if exact is None:
            exact = found
        row = {"backend": backend, "setting": label, "build_s": build_s, "search_s": search_s,
               "qps": args.queries / search_s, "recall_at_10": recall_at_k(found, exact)}  # fmt: skip
        rows.append(row)
        build = "-" if build_s is None else f"{build_s:8.2f} s"
        print(f"{backend:10s} {label:32s} build {build:>10s}  search {search_s:7.3f} s  QPS {row['qps']:9.0f}  "
              f"recall@10 {row['recall_at_10']:.4f}", flush=True)  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| backend | setting | build (s) | QPS | QPS / exact torch | recall@10 |", "|---|---|---|---|---|---|"]
    for r in rows:
        build = "—" if r["build_s"] is None else f"{r['build_s']:.1f}"
        lines.append(f"| `{r['backend']}` | {r['setting']} | {build} | {r['qps']:,.0f} | "
                     f"{r['qps'] / base['qps']:.2f}× | {r['recall_at_10']:.4f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--noise", type=float, default=1.5, help="per-point noise norm relative to the centres")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--nlist", type=int, default=None, help="IVF cells (default ~4 sqrt(n), a multiple of 256)")
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--ivf_train", type=int, default=200_000, help="rows the IVF quantizer is trained on")
    parser.add_argument("--hnsw_m", type=int, default=16)
    parser.add_argument("--ef_construction", type=int, default=40)
    parser.add_argument("--ef_search", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--threads", type=int, default=2, help="torch and faiss threads")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["torch", "faiss", "faiss-ivf", "faiss-hnsw"],
        help="backends to run; the first is the baseline and the ground truth (keep torch first)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="search runs per setting; the fastest is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="one nprobe and one ef_search")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    if args.quick:
        args.nprobe, args.ef_search = args.nprobe[:1], args.ef_search[:1]
    torch.set_num_threads(args.threads)
    faiss = import_faiss()
    faiss.omp_set_num_threads(args.threads)
    print(f"torch {torch.__version__}, faiss {faiss.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} threads; gallery {args.n:,} x {args.dim}, {args.queries:,} queries, k = {args.k}, "
          f"{args.clusters} clusters, noise {args.noise}")  # fmt: skip
    rows = run(args)
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "faiss": faiss.__version__, "rows": rows}, f,
                      indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
