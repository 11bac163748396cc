"""One report of the package on one device: kernel crossover grid, memory rows, evaluation rows, op / sync counts.

Sections (each a list of JSON rows; every row is timed after a warm-up, median of a few fwd+bwd calls):

* ``grid`` — ``kernel="dense"`` vs ``"sorted"`` for SupAP, Smooth-AP (flat) and Sup-H-AP (2 levels) on a B × N grid
  (``N = B`` is in-batch), with what ``choose_kernel("auto", device, B, N, levels=L)`` picks and whether that is the
  faster one — the measurement ``pml_suprank.ranking.CUDA_FLAT_COSTS`` / ``CUDA_HIERARCHICAL_COSTS`` are fitted to;
* ``memory`` — every rank loss at B = 256 against a 4,096- and a 60,000-item memory (flat and hierarchical), auto
  and sorted kernels (dense too at 4,096): time, ``× matmul`` (the bare score-matrix fwd+bwd of the same shapes),
  peak extra device memory (``max_memory_allocated`` on CUDA, not measured on the CPU);
* ``eval`` — ``RetrievalEvaluator`` on 60,502 clustered items (512-d) with 2 and 3 levels against the blocked
  score-matrix floor, its peak memory, and the CPU = device check on a 3,000-item subset;
* ``ops`` — aten op / launch-proxy / host-sync counts of one fwd+bwd per loss and kernel at in-batch B = 256
  (``_bench_common.profile_counts``; on CUDA also the synchronisations that ``torch.cuda.set_sync_debug_mode``
  reports).

Every section stops starting new rows when the overall ``--budget`` (seconds, default 220) is spent, so a run on one
GPU stays under 4 minutes; skipped rows are listed. The JSON (``--out``, default
``benchmarks/results/gpu_report_<device>.json``) carries the device, torch, commit and date;
``benchmarks/report_to_docs.py`` turns it into the GPU section of ``docs/performance.md``.

Usage::

    python benchmarks/gpu_report.py                      # cuda, full sizes (< 4 min on an H100/H200)
    python benchmarks/gpu_report.py --device cpu --small # dry run: tiny sizes, a few seconds
    python benchmarks/report_to_docs.py benchmarks/results/gpu_report_cuda.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _bench_common import device_name, profile_counts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FLAT = ("SupAPLoss", "SmoothAPLoss", "ROADMAPLoss", "SupRecallLoss")
HIERARCHICAL = ("SupHAPLoss", "HAPPIERLoss", "SupNDCGLoss")
GRID_LOSSES = (("SupAPLoss", 1), ("SmoothAPLoss", 1), ("SupHAPLoss", 2))


class Budget:
    """The overall time budget: ``spent()`` once ``seconds`` have passed since construction."""

    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.perf_counter(), seconds

    def spent(self) -> bool:
        return time.perf_counter() - self.start > self.seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``step`` after one warm-up call (device synchronised)."""
    step()
    sync(device)
    times = []
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(step: Callable[[], object], device: torch.device, repeats: int) -> dict:
    """``{"time_s", "peak_extra_mb"}`` of ``step`` (peak: CUDA only), or ``{"error"}``."""
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        seconds = timed(step, device, repeats)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
        return {"time_s": seconds, "peak_extra_mb": peak}
    except Exception as exc:  # reported in the row, not fatal
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def batch(num_queries: int, num_refs: int | None, dim: int, levels: int, device: torch.device, seed: int = 0):
    """Embeddings with 4 items per class, and a memory of ``num_refs`` items (every batch class has 5 items in it);
    labels ``(fine, fine // 4)`` with 2 levels, fine only with 1."""
    g = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(num_queries, dim, generator=g), dim=1)
    fine = torch.arange(num_queries) // 4
    ref = ref_fine = None
    if num_refs is not None:
        ref = F.normalize(torch.randn(num_refs, dim, generator=g), dim=1)
        ref_fine = torch.randperm(num_refs, generator=g) // 5

    def lab(f):
        return None if f is None else (f if levels == 1 else torch.stack([f, f // 4], 1)).to(device)

    return emb.to(device), lab(fine), None if ref is None else ref.to(device), lab(ref_fine)


def make_loss(name: str, kernel: str, dim: int, num_classes: int, device: torch.device):
    from pml_suprank import losses

    kwargs = {"kernel": kernel}
    if name == "HAPPIERLoss":
        kwargs.update(num_classes=num_classes, embedding_size=dim)
    return getattr(losses, name)(**kwargs).to(device)


def fwd_bwd(loss_fn, emb, labels, ref, ref_labels) -> Callable[[], None]:
    x = emb.clone().requires_grad_(True)

    def step():
        x.grad = None
        value = loss_fn(x, labels) if ref is None else loss_fn(x, labels, ref_emb=ref, ref_labels=ref_labels)
        value.backward()

    return step


def matmul_floor(emb, ref) -> Callable[[], None]:
    x = emb.clone().requires_grad_(True)
    refs = emb if ref is None else ref

    def step():
        x.grad = None
        (x @ refs.T).sum().backward()

    return step


def num_classes_of(labels, ref_labels) -> int:
    """Classes of the finest level (host-side: setup only)."""
    fine = [t if t.dim() == 1 else t[:, 0] for t in (labels, ref_labels) if t is not None]
    return int(max(int(t.max()) for t in fine)) + 1


# ------------------------------------------------------------------------------------------------ sections
def grid_section(device, dim, sizes, repeats, budget, skipped) -> list[dict]:
    from pml_suprank.ranking import choose_kernel

    rows = []
    for num_queries, num_refs in sizes:
        for name, levels in GRID_LOSSES:
            if budget.spent():
                skipped.append(f"grid B={num_queries} N={num_refs} {name}")
                continue
            emb, labels, ref, ref_labels = batch(
                num_queries, None if num_refs == num_queries else num_refs, dim, levels, device
            )
            t = {}
            for kernel in ("dense", "sorted"):
                fn = make_loss(name, kernel, dim, 1, device)
                t[kernel] = measure(fwd_bwd(fn, emb, labels, ref, ref_labels), device, repeats)
            auto = choose_kernel("auto", device, num_queries, num_refs, levels=levels)
            row = {
                "B": num_queries,
                "N": num_refs,
                "BN2": num_queries * num_refs**2,
                "loss": name,
                "levels": levels,
                "dense_s": t["dense"].get("time_s"),
                "sorted_s": t["sorted"].get("time_s"),
                "auto": auto,
            }
            row["dense_mb"], row["sorted_mb"] = t["dense"].get("peak_extra_mb"), t["sorted"].get("peak_extra_mb")
            errors = [v["error"] for v in t.values() if "error" in v]
            if errors:
                row["error"] = errors[0]
            else:
                row["faster"] = "dense" if row["dense_s"] < row["sorted_s"] else "sorted"
                row["ratio"] = max(row["dense_s"], row["sorted_s"]) / min(row["dense_s"], row["sorted_s"])
            rows.append(row)
    return rows


def memory_section(device, dim, num_queries, memories, repeats, dense_max_refs, budget, skipped) -> list[dict]:
    rows = []
    for num_refs in memories:
        for group, names in (("flat", FLAT), ("hierarchical", HIERARCHICAL)):
            levels = 1 if group == "flat" else 2
            emb, labels, ref, ref_labels = batch(num_queries, num_refs, dim, levels, device)
            floor = measure(matmul_floor(emb, ref), device, repeats)
            classes = num_classes_of(labels, ref_labels)
            for name in names:
                for kernel in ("auto", "dense", "sorted"):
                    if kernel == "dense" and num_refs > dense_max_refs:
                        continue
                    if budget.spent():
                        skipped.append(f"memory B={num_queries} N={num_refs} {name} {kernel}")
                        continue
                    fn = make_loss(name, kernel, dim, classes, device)
                    r = measure(fwd_bwd(fn, emb, labels, ref, ref_labels), device, repeats)
                    if "time_s" in r and "time_s" in floor:
                        r["x_matmul"] = r["time_s"] / floor["time_s"]
                    rows.append(
                        {
                            "B": num_queries,
                            "N": num_refs,
                            "group": group,
                            "loss": name,
                            "kernel": kernel,
                            "matmul_s": floor.get("time_s"),
                            **r,
                        }
                    )
    return rows


def eval_data(num_items: int, dim: int, levels: int, device: torch.device):
    g = torch.Generator().manual_seed(levels)
    num_fine = max(num_items // 5, 2)
    fine = torch.randint(0, num_fine, (num_items,), generator=g)
    columns = [fine, fine % 12] if levels == 2 else [fine, fine % 40, fine % 8]
    centers = torch.randn(num_fine, dim, generator=g)
    emb = F.normalize(centers[fine] * 0.5 + torch.randn(num_items, dim, generator=g), dim=1)
    return emb.to(device), torch.stack(columns, 1).to(device)


def eval_section(device, dim, num_items, subset, budget, skipped) -> list[dict]:
    from pml_suprank.metrics import RetrievalEvaluator

    rows = []
    for levels in (2, 3):
        if budget.spent():
            skipped.append(f"eval levels={levels}")
            continue
        emb, labels = eval_data(num_items, dim, levels, device)

        def floor(emb=emb):
            for start in range(0, num_items, 4096):
                (emb[start : start + 4096] @ emb.T).amax(1)

        row = {"N": num_items, "D": dim, "levels": levels}
        try:
            floor_s = timed(floor, device, 1)
            evaluator = RetrievalEvaluator(k_values=(1, 10), device=device)
            evaluator.evaluate(emb[:256], labels[:256])  # warm-up
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            t0 = time.perf_counter()
            out = evaluator.evaluate(emb, labels)
            sync(device)
            row.update(floor_s=floor_s, eval_s=time.perf_counter() - t0, h_ap=float(out["h_ap"]))
            row["ratio"] = row["eval_s"] / floor_s
            row["peak_gb"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            cpu = RetrievalEvaluator(k_values=(1, 10), device="cpu").evaluate(emb[:subset].cpu(), labels[:subset].cpu())
            dev = evaluator.evaluate(emb[:subset], labels[:subset])
            keys = [k for k in ("ap", "h_ap", "ndcg", "asi", "map_at_r") if k in cpu]
            diffs = {k: abs(float(cpu[k]) - float(dev[k])) for k in keys}
            row.update(check_subset=subset, max_abs_diff=max(diffs.values(), default=0.0))
        except Exception as exc:  # reported in the row, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
    return rows


def cuda_syncs(step: Callable[[], None]) -> int:
    """Synchronisations of one call that ``torch.cuda.set_sync_debug_mode("warn")`` reports (after a warm-up)."""
    step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def ops_section(device, dim, num_queries, budget, skipped) -> list[dict]:
    rows = []
    for name in FLAT + HIERARCHICAL:
        levels = 2 if name in HIERARCHICAL else 1
        emb, labels, _, _ = batch(num_queries, None, dim, levels, device)
        for kernel in ("auto", "dense", "sorted"):
            if budget.spent():
                skipped.append(f"ops {name} {kernel}")
                continue
            step = fwd_bwd(make_loss(name, kernel, dim, num_classes_of(labels, None), device), emb, labels, None, None)
            row = {"B": num_queries, "loss": name, "kernel": kernel, **profile_counts(step)}
            if device.type == "cuda":
                row["cuda_syncs"] = cuda_syncs(step)
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ main
def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def sizes(small: bool) -> dict:
    if small:
        return {
            "dim": 32,
            "grid": [(8, 8), (8, 64), (16, 16), (16, 128)],
            "memory_b": 16,
            "memories": (256, 1024),
            "dense_max_refs": 256,
            "eval_n": 600,
            "subset": 200,
            "ops_b": 16,
            "repeats": 1,
        }
    grid = [(b, n) for b in (32, 64, 128, 256, 512) for n in (b, 512, 1024, 2048, 4096) if n >= b]
    grid = sorted(set(grid))
    return {
        "dim": 512,
        "grid": grid,
        "memory_b": 256,
        "memories": (4096, 60000),
        "dense_max_refs": 4096,
        "eval_n": 60502,
        "subset": 3000,
        "ops_b": 256,
        "repeats": 5,
    }


def print_tables(report: dict) -> None:
    meta = report["meta"]
    print(f"\n{meta['device_name']} · torch {meta['torch']} · commit {meta['commit']} · {meta['date']}")
    print("\n| B | N | loss | dense (ms) | sorted (ms) | faster | auto |")
    print("|---|---|---|---|---|---|---|")
    for r in report["grid"]:
        d, s = (f"{r[k] * 1e3:.2f}" if r.get(k) is not None else "–" for k in ("dense_s", "sorted_s"))
        print(f"| {r['B']} | {r['N']} | {r['loss']} | {d} | {s} | {r.get('faster', r.get('error'))} | {r['auto']} |")
    print("\n| B | N | loss | kernel | ms | × matmul | peak extra (MB) |")
    print("|---|---|---|---|---|---|---|")
    for r in report["memory"]:
        ms = f"{r['time_s'] * 1e3:.2f}" if "time_s" in r else r.get("error")
        x = f"{r['x_matmul']:.1f}×" if "x_matmul" in r else "–"
        mb = f"{r['peak_extra_mb']:.0f}" if r.get("peak_extra_mb") is not None else "–"
        print(f"| {r['B']} | {r['N']} | {r['loss']} | {r['kernel']} | {ms} | {x} | {mb} |")
    print("\n| N | levels | evaluate (s) | floor (s) | ratio | peak (GB) | CPU vs device |")
    print("|---|---|---|---|---|---|---|")
    for r in report["eval"]:
        if "error" in r:
            print(f"| {r['N']} | {r['levels']} | {r['error']} | | | | |")
            continue
        gb = f"{r['peak_gb']:.2f}" if r.get("peak_gb") is not None else "–"
        print(
            f"| {r['N']} | {r['levels']} | {r['eval_s']:.3f} | {r['floor_s']:.3f} | {r['ratio']:.1f}× | {gb} "
            f"| {r['max_abs_diff']:.1e} |"
        )
    print("\n| loss | kernel | aten ops | compute ops | host syncs | CUDA syncs |")
    print("|---|---|---|---|---|---|")
    for r in report["ops"]:
        print(
            f"| {r['loss']} | {r['kernel']} | {r['aten_ops']} | {r['compute_ops']} | {r['syncs']} "
            f"| {r.get('cuda_syncs', '–')} |"
        )
    if report["skipped"]:
        print(f"\nskipped (budget): {len(report['skipped'])} rows, e.g. {report['skipped'][:3]}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a CPU dry run)")
    parser.add_argument("--budget", type=float, default=220.0, help="seconds for the whole report")
    parser.add_argument("--only", default="grid,memory,eval,ops", help="comma-separated sections")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_report_<device>.json)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    size, budget, skipped = sizes(args.small), Budget(args.budget), []
    only = set(args.only.split(","))
    unknown = only - {"grid", "memory", "eval", "ops"}
    if unknown:
        raise ValueError(f"--only: unknown sections {sorted(unknown)}; choose from grid, memory, eval, ops")
    meta = {
        "device": str(device),
        "device_name": device_name(str(device)),
        "torch": torch.__version__,
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "small": args.small,
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    report = {"meta": meta, "grid": [], "memory": [], "eval": [], "ops": [], "skipped": skipped}
    t0 = time.perf_counter()
    if "grid" in only:
        report["grid"] = grid_section(device, size["dim"], size["grid"], size["repeats"], budget, skipped)
    if "memory" in only:
        report["memory"] = memory_section(
            device,
            size["dim"],
            size["memory_b"],
            size["memories"],
            size["repeats"],
            size["dense_max_refs"],
            budget,
            skipped,
        )
    if "eval" in only:
        report["eval"] = eval_section(device, size["dim"], size["eval_n"], size["subset"], budget, skipped)
    if "ops" in only:
        report["ops"] = ops_section(device, size["dim"], size["ops_b"], budget, skipped)
    meta["seconds"] = time.perf_counter() - t0
    print_tables(report)
    out = Path(args.out) if args.out else RESULTS / f"gpu_report{'_small' if args.small else ''}_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out} ({meta['seconds']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
