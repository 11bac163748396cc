"""Benchmark: exact retrieval evaluation (every metric) vs the bare score matrix, PML's AccuracyCalculator and a
naive per-query full-sort implementation.

Synthetic SOP-like data: 512-d L2-normalised embeddings, fine classes of ~5 items, 2 levels (12 coarse classes) or
3 levels (120 middle, 12 coarse). Prints times and ratios measured in the same process (the machine is shared: only
ratios are meaningful) and writes JSON to ``benchmarks/results/``.

``--coarse-weight`` sets how far apart the coarse classes are (default 2.0: well separated, so almost every negative
scores below the lowest relevant item of its query and the evaluator's pruned exact search applies; ~0.5 makes the
coarse classes overlap like a weakly trained model, which exercises the histogram counter instead).

    python benchmarks/bench_eval.py --quick        # N = 2,000 and 10,000
    python benchmarks/bench_eval.py                # N = 10,000 and 60,502 (SOP test size)
    python benchmarks/bench_eval.py --sizes 20000 --coarse-weight 0.5 --no-pml

``--floor`` prints instead, in one process, the blocked score-matrix floor and the evaluation at 2 and 3 levels and
the default call as ratios of it, on the data of ``gpu_check.py`` / ``gpu_report.py`` (coarse labels unrelated to
the geometry, the hardest case for the counting), plus the host reads of one call:

    python benchmarks/bench_eval.py --floor --sizes 20000
"""

from __future__ import annotations

import argparse
import json
import resource
import threading
import time
from pathlib import Path

import numpy as np
import torch
from _bench_common import profile_counts

from pml_suprank.metrics import RetrievalEvaluator
from pml_suprank.metrics.registry import SINGLE_LABEL_GROUPS
from pml_suprank.relevance import level_matrix


def make_data(
    n: int, levels: int, dim: int = 512, seed: int = 0, coarse_weight: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    fine = torch.arange(n) // 5
    cols = [fine]
    if levels == 3:
        cols.append(fine % 120)
    cols.append(fine % 12)
    labels = torch.stack(cols, 1)
    centres = torch.randn(int(fine.max()) + 1, dim, generator=g)
    coarse_dirs = torch.randn(12, dim, generator=g)
    emb = centres[fine] + coarse_weight * coarse_dirs[labels[:, -1]] + 2.5 * torch.randn(n, dim, generator=g)
    return torch.nn.functional.normalize(emb, dim=1), labels


class PeakRSS:
    """Resident memory sampled every 20 ms while the block runs (``ru_maxrss`` keeps the maximum of the whole
    process, e.g. an earlier faiss run, so it cannot isolate the evaluator)."""

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = _rss_gb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_gb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_gb())


def _rss_gb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**30
    except OSError:  # not Linux: whole-process maximum
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_scores(emb: torch.Tensor, chunk: int) -> float:
    """Seconds of the chunked ``(N, N)`` score matrix alone, on the device of ``emb``."""
    _synchronize(emb.device)
    t = time.perf_counter()
    buf = torch.empty(min(chunk, len(emb)), len(emb), device=emb.device)
    for s in range(0, len(emb), chunk):
        torch.mm(emb[s : s + chunk], emb.T, out=buf[: min(chunk, len(emb) - s)])
    _synchronize(emb.device)
    return time.perf_counter() - t


def naive_subset(emb: torch.Tensor, labels: torch.Tensor, n_queries: int) -> tuple[float, dict[str, float]]:
    """Per-query full sort (numpy lexsort with the pessimistic tie rule) for the first ``n_queries`` queries."""
    t = time.perf_counter()
    L = labels.shape[1]
    aps, ndcgs = [], []
    for q in range(n_queries):
        s = (emb[q : q + 1] @ emb.T)[0].numpy().astype(np.float64)
        lev = level_matrix(labels[q : q + 1], labels)[0].numpy()
        keep = np.arange(len(s)) != q
        s, lev = s[keep], lev[keep]
        o = np.lexsort((np.arange(len(s)), lev, -s))
        lv = lev[o]
        pos = lv == L
        if pos.any():
            aps.append(((np.cumsum(pos) / np.arange(1, len(lv) + 1)) * pos).sum() / pos.sum())
        gain = 2.0**lv - 1
        disc = 1 / np.log2(np.arange(2, len(lv) + 2))
        ndcgs.append((gain * disc).sum() / (np.sort(gain)[::-1] * disc).sum())
    return time.perf_counter() - t, {"ap": float(np.mean(aps)), "ndcg": float(np.mean(ndcgs))}


def pml_calculator(emb: torch.Tensor, fine: torch.Tensor) -> tuple[float, dict[str, float]] | None:
    try:
        import faiss  # noqa: F401
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
        from pytorch_metric_learning.utils.inference import FaissKNN
    except ImportError:
        return None
    calc = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
        k="max_bin_count",
        knn_func=FaissKNN(index_init_fn=faiss.IndexFlatIP),
        device=torch.device("cpu"),
    )
    t = time.perf_counter()
    out = calc.get_accuracy(emb, fine)
    return time.perf_counter() - t, out


def host_syncs(emb: torch.Tensor, labels: torch.Tensor, counting: str, device: str = "cpu", n: int = 1024) -> list[int]:
    """Host syncs of one ``evaluate()`` (every metric) of the first ``n`` items, with 1 and with 8 row blocks
    (``_bench_common.profile_counts``: outermost sync ops plus ``.tolist()``-style reads, after a warm-up)."""
    emb, labels = emb[:n], labels[:n]
    counts = []
    for blocks in (1, 8):
        ev = RetrievalEvaluator(
            k_values=(1, 10, 100), chunk_size=n // blocks, counting=counting, metrics=SINGLE_LABEL_GROUPS, device=device
        )
        counts.append(profile_counts(lambda ev=ev: ev.evaluate(emb, labels))["syncs"])
    return counts


def warm_up(ev: RetrievalEvaluator, emb: torch.Tensor, labels: torch.Tensor) -> float:
    """Seconds of a first evaluation of 512 queries: the one-off numba compilation of the counting kernel (per
    process) plus a negligible evaluation; excluded from the timed evaluation that follows."""
    t = time.perf_counter()
    ev.evaluate(emb[:512], labels[:512])
    return time.perf_counter() - t


def run(
    n: int,
    levels: int,
    naive_queries: int,
    with_pml: bool,
    coarse_weight: float = 2.0,
    counting: str = "auto",
    device: str = "cpu",
) -> dict:
    emb, labels = make_data(n, levels, coarse_weight=coarse_weight)
    ev = RetrievalEvaluator(k_values=(1, 10, 100), counting=counting, device=device)
    chunk = max(16, 2**25 // n)  # rows of the bare score-matrix blocks
    t_compile = warm_up(ev, emb, labels)
    syncs = host_syncs(emb, labels, counting, device)
    t_scores = bare_scores(emb.to(device), chunk)
    with PeakRSS() as mem:
        t = time.perf_counter()
        out = ev.evaluate(emb, labels, return_per_query=True)
        t_eval = time.perf_counter() - t
    # the machine is shared: time the bare score matrix again after the evaluation and keep the faster of the two
    # (the conservative denominator for the ratio)
    t_scores_after = bare_scores(emb.to(device), chunk)
    t_scores_before, t_scores = t_scores, min(t_scores, t_scores_after)
    res = {
        "n": n,
        "levels": levels,
        "coarse_weight": coarse_weight,
        "dim": emb.shape[1],
        "threads": torch.get_num_threads(),
        "chunk_size": chunk,
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "counting": counting,
        "numba": _numba_version(),
        "first_call_compile_s": t_compile,
        "host_syncs_1_vs_8_blocks": syncs,
        "score_matrix_s": t_scores,
        "score_matrix_before_after_s": [t_scores_before, t_scores_after],
        "evaluate_all_metrics_s": t_eval,
        "ratio_vs_score_matrix": t_eval / t_scores,
        "rss_before_eval_gb": mem.start,
        "peak_rss_during_eval_gb": mem.peak,
        "metrics": {k: v for k, v in out.items() if isinstance(v, (int, float))},
    }
    print(
        f"\nN={n:,} L={levels} coarse_weight={coarse_weight} device={res['device_name']} counting={counting} "
        f"numba={res['numba']} "
        f"(first call incl. compile {t_compile:.1f}s, excluded): score matrix {t_scores:.1f}s "
        f"(min of {t_scores_before:.1f}s before, {t_scores_after:.1f}s after) | all metrics {t_eval:.1f}s "
        f"(x{t_eval / t_scores:.2f}) | RSS {mem.start:.2f} GB before, peak {mem.peak:.2f} GB during the evaluation"
    )
    print("  " + ", ".join(f"{k}={out[k]:.4f}" for k in ("ap", "map_at_r", "recall_at_1", "h_ap", "ndcg", "asi")))
    print(f"  host syncs of evaluate() on 1,024 items (every metric), 1 vs 8 row blocks: {syncs[0]} vs {syncs[1]}")
    if naive_queries:
        t_naive, naive = naive_subset(emb, labels, naive_queries)
        per_q_naive = t_naive / naive_queries
        per_q_ours = t_eval / n
        pq = out["per_query"]
        ap_ours = float(np.nanmean(pq["ap"][:naive_queries].numpy()))
        ndcg_ours = float(np.nanmean(pq["ndcg"][:naive_queries].numpy()))
        res["naive_full_sort"] = {
            "queries": naive_queries,
            "seconds": t_naive,
            "per_query_s": per_q_naive,
            "speedup_per_query": per_q_naive / per_q_ours,
            "max_abs_diff_ap": abs(ap_ours - naive["ap"]),
            "max_abs_diff_ndcg": abs(ndcg_ours - naive["ndcg"]),
        }
        print(
            f"  naive per-query full sort: {per_q_naive * 1e3:.1f} ms/query vs {per_q_ours * 1e3:.2f} ms/query "
            f"(x{per_q_naive / per_q_ours:.1f} faster); |ΔAP|={res['naive_full_sort']['max_abs_diff_ap']:.1e}"
        )
    if with_pml:
        pml = pml_calculator(emb, labels[:, 0])
        if pml is not None:
            t_pml, pml_out = pml
            res["pml_accuracy_calculator_faiss"] = {"seconds": t_pml, "ratio_ours_vs_pml": t_eval / t_pml, **pml_out}
            print(
                f"  PML AccuracyCalculator (faiss IndexFlatIP, k=max_bin_count; mAP@R, P@1, R-prec only): "
                f"{t_pml:.1f}s; ours (all metrics) / PML = {t_eval / t_pml:.2f}; "
                f"mAP@R {pml_out['mean_average_precision_at_r']:.6f} vs ours {out['map_at_r']:.6f}"
            )
    return res


def floor_data(n: int, levels: int, dim: int = 512, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluation data of ``gpu_check.py``: fine classes of ~5 items, coarse labels ``fine % 12`` (2 levels) or
    ``fine % 40``, ``fine % 8`` (3 levels), unrelated to the geometry."""
    g = torch.Generator().manual_seed(seed)
    fine = torch.randint(0, n // 5, (n,), generator=g)
    cols = [fine, fine % 12] if levels == 2 else [fine, fine % 40, fine % 8]
    centers = torch.randn(n // 5, dim, generator=g)
    emb = torch.nn.functional.normalize(centers[fine] * 0.5 + torch.randn(n, dim, generator=g), dim=1)
    return emb, torch.stack(cols, 1)


def floor_ratios(n: int, device: str = "cpu") -> dict:
    """Floor (blocked score matrix, 32 MiB blocks, each reduced by ``amax``) and the exact evaluation at 2 and 3
    levels (``k_values=(1,)``) and the default call (``RetrievalEvaluator()``, 2 levels), timed in this process;
    the floor is the faster of a run before and after the evaluations."""
    dev = torch.device(device)
    data = {levels: tuple(t.to(dev) for t in floor_data(n, levels)) for levels in (2, 3)}
    emb = data[2][0]
    rows = max(2**23 // n, 1)

    def floor() -> float:
        _synchronize(dev)
        t = time.perf_counter()
        buf = torch.empty(min(rows, n), n, device=dev)
        for s in range(0, n, rows):
            torch.mm(emb[s : s + rows], emb.T, out=buf[: min(rows, n - s)]).amax(1)
        _synchronize(dev)
        return time.perf_counter() - t

    floor()  # warm-up
    before = floor()
    runs = {}
    calls = {
        "2 levels": (RetrievalEvaluator(k_values=(1,), device=device), 2),
        "3 levels": (RetrievalEvaluator(k_values=(1,), device=device), 3),
        "default call": (RetrievalEvaluator(device=device), 2),
    }
    for name, (ev, levels) in calls.items():
        e, y = data[levels]
        ev.evaluate(e[:512], y[:512])  # warm-up (numba compilation)
        _synchronize(dev)
        t = time.perf_counter()
        out = ev.evaluate(e, y)
        _synchronize(dev)
        runs[name] = {"seconds": time.perf_counter() - t, "h_ap": out["h_ap"], "ap": out["ap"]}
    after = floor()
    t_floor = min(before, after)
    e, y = data[2]
    syncs = profile_counts(lambda: RetrievalEvaluator(device=device).evaluate(e[:1024], y[:1024]))["syncs"]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(
        f"\nN={n:,} x {emb.shape[1]}-d, {name}, torch {torch.__version__}: floor {t_floor:.2f} s "
        f"(before {before:.2f} s, after {after:.2f} s)"
    )
    for key, r in runs.items():
        r["ratio"] = r["seconds"] / t_floor
        print(f"  {key:>12}: {r['seconds']:.2f} s = {r['ratio']:.2f}x the floor (h_ap {r['h_ap']:.6f})")
    print(f"  host reads of one default evaluate() of 1,024 items: {syncs}")
    return {
        "n": n,
        "device": name,
        "floor_s": t_floor,
        "floor_before_after_s": [before, after],
        "runs": runs,
        "host_reads_default_call_1024": syncs,
    }


def _numba_version() -> str | None:
    try:
        import numba
    except ImportError:
        return None
    return numba.__version__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small N (2,000 and 10,000)")
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--levels", type=int, nargs="*", default=[2, 3])
    parser.add_argument("--naive-queries", type=int, default=50)
    parser.add_argument("--no-pml", action="store_true")
    parser.add_argument("--coarse-weight", type=float, default=2.0, help="separation of the coarse classes")
    parser.add_argument("--device", default="cpu", help="where the evaluator and the bare score matrix run")
    parser.add_argument("--counting", default="auto", help="counting= of the evaluator (auto/compiled/histogram/...)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--floor", action="store_true", help="floor ratios at 2 and 3 levels and the default call")
    args = parser.parse_args()
    sizes = args.sizes or ([2000, 10000] if args.quick else [10000, 60502])
    if args.floor:
        results = [floor_ratios(n, args.device) for n in sizes]
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"bench_eval_floor_{int(time.time())}.json"
        path.write_text(json.dumps({"torch": torch.__version__, "results": results}, indent=1))
        print(f"\nwrote {path}")
        return
    results = []
    for n in sizes:
        for levels in args.levels:
            results.append(
                run(n, levels, args.naive_queries, not args.no_pml, args.coarse_weight, args.counting, args.device)
            )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bench_eval_{'quick' if args.quick else 'full'}_{int(time.time())}.json"
    path.write_text(json.dumps({"torch": torch.__version__, "results": results}, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
