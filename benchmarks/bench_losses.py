"""Benchmark the flat rank losses: forward+backward time and extra peak memory, as ratios against baselines.

Rows (``ROWS``) are run for every setting (``SETTINGS``) they apply to, each in a fresh process so that the peak
memory (max RSS on CPU, ``max_memory_allocated`` on CUDA) of one row does not leak into another. Baselines, measured
in the same run:

* ``matmul``: the bare ``B × N`` similarity matmul, forward + backward (the floor any rank loss pays);
* ``dense SupAP`` / ``dense Smooth-AP``: the same formulas written the way the reference code does (``B × N × N``
  difference tensor, ranks for every reference item), skipped where ``B·N²`` exceeds ``--dense-limit``;
* ``PML SmoothAPLoss`` (2.9): in-batch only (it rejects ``ref_emb``); it is timed although its value is wrong for
  these batches (PML 2.9's SmoothAPLoss assumes a fixed number of samples per class in a fixed batch layout).

Other engineers add rows by appending ``Row(...)`` to ``ROWS`` (e.g. hierarchical losses, memory wrappers).

Usage::

    python benchmarks/bench_losses.py            # B ∈ {64,128,256} in-batch, B=256 vs N ∈ {1024,4096,60000}
    python benchmarks/bench_losses.py --quick    # small sizes only, 1 repeat
    python benchmarks/bench_losses.py --device cuda
    python benchmarks/bench_losses.py --crossover  # kernel="dense" (eager, compiled) vs "sorted" timings, auto's choice
    python benchmarks/bench_losses.py --ops        # op / launch-proxy / host-sync counts per fwd+bwd, per kernel,
                                                   # on every available device, with the naive dense and PML rows
    python benchmarks/bench_losses.py --ops --no-compile  # the same without the torch.compile rows (faster)
    python benchmarks/bench_losses.py --settings "in-batch B=256" "B=256 N=4096"  # only these settings
    python benchmarks/bench_losses.py --crossover --settings "in-batch B=64" "in-batch B=256"  # (crossover names)

"dense compiled" (``--ops`` / ``--crossover``, flat losses): ``torch.compile(loss, fullgraph=True, dynamic=False)`` of
the ``kernel="dense"`` loss, compiled on the setting's shapes; the compile time is printed apart and excluded from
the timings (those start after a warm-up call).

Rows ``<loss> dense`` / ``<loss> sorted`` force the ``kernel=`` option; the plain rows use ``kernel="auto"``.

Writes ``benchmarks/results/bench_losses[_quick]_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from _bench_common import available_devices, compile_loss, median_time, profile_counts
from _bench_common import device_name as _device_name

RESULTS = Path(__file__).parent / "results"


# ------------------------------------------------------------------------------------------------ settings / data
@dataclass(frozen=True)
class Setting:
    name: str
    batch: int
    num_refs: int | None  # None = in-batch (the reference set is the batch)
    dim: int = 512


def make_inputs(setting: Setting, device: str, seed: int = 0):
    """Embeddings (4 per class) and, for memory settings, an N-item memory where every batch class has 5 items
    (SOP-like: ~5 images per class), the rest belonging to other classes."""
    g = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(setting.batch, setting.dim, generator=g), dim=1).to(device)
    labels = (torch.arange(setting.batch) // 4).to(device)
    if setting.num_refs is None:
        return emb, labels, None, None
    ref = F.normalize(torch.randn(setting.num_refs, setting.dim, generator=g), dim=1).to(device)
    ref_labels = (torch.randperm(setting.num_refs, generator=g) // 5).to(device)
    return emb, labels, ref, ref_labels


# ------------------------------------------------------------------------------------------------ dense baselines
def _dense_ap(scores, pos, valid, pos_step, neg_step):
    """AP from B×N×N tensors, as the reference computes it (ranks of every reference item, then mask positives)."""
    diff = scores.unsqueeze(1) - scores.unsqueeze(2)  # (B, N, N): s_j − s_i
    n = scores.shape[1]
    not_i = ~torch.eye(n, dtype=torch.bool, device=scores.device)
    pos_f = (pos.unsqueeze(1) & not_i).to(scores.dtype)
    neg_f = (valid & ~pos).unsqueeze(1).to(scores.dtype)
    rank_plus = 1 + (pos_step(diff) * pos_f).sum(-1)
    rank = rank_plus + (neg_step(diff) * neg_f).sum(-1)
    ap = (rank_plus / rank * pos).sum(1) / pos.sum(1).clamp(min=1)
    return 1 - ap.mean()


def _h_minus(t, tau=0.01, rho=100.0, delta=0.05, start=0.5, offset=1.4933071):
    sig = torch.sigmoid(t / tau)
    return torch.where(t <= 0, sig, torch.where(t <= delta, start + sig, rho * (t - delta) + offset))


def _dense(kind):
    def loss(emb, labels, ref, ref_labels):
        if ref is None:
            ref, ref_labels = emb, labels
        scores = emb @ ref.t()
        pos = labels[:, None] == ref_labels[None, :]
        valid = torch.ones_like(pos)
        if ref is emb:
            valid.fill_diagonal_(False)
            pos = pos & valid
        if kind == "supap":
            return _dense_ap(scores, pos, valid, lambda d: (d >= 0).to(d.dtype), _h_minus)
        sig = lambda d: torch.sigmoid(d / 0.01)  # noqa: E731
        return _dense_ap(scores, pos, valid, sig, sig)

    return loss


# ------------------------------------------------------------------------------------------------ rows
@dataclass
class Row:
    """One benchmarked loss: ``factory()`` returns ``f(emb, labels, ref, ref_labels) -> scalar loss``."""

    name: str
    factory: Callable[[], Callable]
    kind: str = "ours"  # "ours" or "baseline"
    in_batch_only: bool = False
    dense: bool = False  # B·N² work and memory: subject to --dense-limit
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _ours(cls_name, **kwargs):
    def factory():
        from pml_suprank import losses

        fn = getattr(losses, cls_name)(**kwargs)

        def loss(emb, labels, ref, ref_labels):
            if ref is None:
                return fn(emb, labels)
            return fn(emb, labels, ref_emb=ref, ref_labels=ref_labels)

        return loss

    return factory


def _matmul():
    def loss(emb, labels, ref, ref_labels):
        return (emb @ (emb if ref is None else ref).t()).sum()

    return loss


def _pml_smooth_ap():
    from pytorch_metric_learning import losses as pml_losses

    fn = pml_losses.SmoothAPLoss(temperature=0.01)
    return lambda emb, labels, ref, ref_labels: fn(emb, labels)


ROWS: list[Row] = [
    Row("matmul", _matmul, kind="baseline", notes="bare B×N similarity matmul, fwd+bwd"),
    Row("SupAP", _ours("SupAPLoss")),
    Row("ROADMAP", _ours("ROADMAPLoss")),
    Row("Smooth-AP", _ours("SmoothAPLoss")),
    Row("Sup-R@k", _ours("SupRecallLoss")),
    Row("SupAP dense", _ours("SupAPLoss", kernel="dense"), dense=True),
    Row("SupAP sorted", _ours("SupAPLoss", kernel="sorted")),
    Row("Smooth-AP dense", _ours("SmoothAPLoss", kernel="dense"), dense=True),
    Row("Smooth-AP sorted", _ours("SmoothAPLoss", kernel="sorted")),
    Row("dense SupAP", lambda: _dense("supap"), kind="baseline", dense=True, notes="B×N×N, reference-style"),
    Row("dense Smooth-AP", lambda: _dense("smoothap"), kind="baseline", dense=True, notes="B×N×N"),
    Row("PML SmoothAPLoss", _pml_smooth_ap, kind="baseline", in_batch_only=True, notes="PML 2.9; value wrong here"),
]

# which baseline each of our rows is compared with
COMPARE = {
    "SupAP": ["matmul", "dense SupAP"],
    "ROADMAP": ["matmul", "dense SupAP"],
    "Smooth-AP": ["matmul", "dense Smooth-AP", "PML SmoothAPLoss"],
    "Sup-R@k": ["matmul"],
    "SupAP dense": ["matmul", "dense SupAP"],
    "SupAP sorted": ["matmul", "dense SupAP"],
    "Smooth-AP dense": ["matmul", "dense Smooth-AP", "PML SmoothAPLoss"],
    "Smooth-AP sorted": ["matmul", "dense Smooth-AP", "PML SmoothAPLoss"],
}


# ------------------------------------------------------------------------------------------------ measurement
def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _measure(row_name: str, setting: Setting, device: str, repeats: int, threads: int | None):
    if threads:
        torch.set_num_threads(threads)
    row = next(r for r in ROWS if r.name == row_name)
    emb, labels, ref, ref_labels = make_inputs(setting, device)
    fn = row.factory()
    emb = emb.clone().requires_grad_(True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss0 = _max_rss_mb()
    times, value = [], None
    for _ in range(repeats + 1):  # the first call is a warm-up but sets the peak memory
        emb.grad = None
        t0 = time.perf_counter()
        loss = fn(emb, labels, ref, ref_labels)
        loss.backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        value = float(loss.detach())
    if device.startswith("cuda"):
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak = _max_rss_mb() - rss0
    timed = times[1:] if repeats > 0 else times
    return {"time_s": statistics.median(timed), "peak_extra_mb": peak, "loss": value}


def _worker(queue, *args):
    try:
        queue.put(_measure(*args))
    except Exception as exc:  # reported in the table, not fatal
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def run_row(row: Row, setting: Setting, device: str, repeats: int, threads: int | None, timeout: float):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, args=(queue, row.name, setting, device, repeats, threads))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"error": f"timeout after {timeout:.0f} s"}
    return queue.get() if not queue.empty() else {"error": f"exit code {proc.exitcode}"}


# ------------------------------------------------------------------------------------------------ kernel= option
KERNEL_LOSSES = (
    "SupAPLoss",
    "SmoothAPLoss",
    "ROADMAPLoss",
    "SupRecallLoss",
    "SupHAPLoss",
    "HAPPIERLoss",
    "SupNDCGLoss",
)
HIERARCHICAL = {"SupHAPLoss": {}, "HAPPIERLoss": {"num_classes": 16384, "embedding_size": 512}, "SupNDCGLoss": {}}
CROSSOVER_SETTINGS = [Setting(f"in-batch B={b}", b, None) for b in (16, 32, 64, 128, 256)]
CROSSOVER_SETTINGS += [Setting(f"B=64 N={n}", 64, n) for n in (128, 256, 512)]


def _kernel_loss(cls_name: str, kernel: str):
    """The loss with ``kernel=``; hierarchical losses get 2-level labels ``(fine, fine // 4)``."""
    if cls_name not in HIERARCHICAL:
        return _ours(cls_name, kernel=kernel)()
    fn = _ours(cls_name, kernel=kernel, **HIERARCHICAL[cls_name])()

    def two_levels(labels):
        return None if labels is None else torch.stack([labels, labels // 4], 1)

    return lambda emb, labels, ref, ref_labels: fn(emb, two_levels(labels), ref, two_levels(ref_labels))


def _fwd_bwd(fn, setting: Setting, device: str):
    """A closure running one forward + backward of ``fn`` on the inputs of ``setting``."""
    emb, labels, ref, ref_labels = make_inputs(setting, device)
    emb = emb.clone().requires_grad_(True)

    def step():
        emb.grad = None
        fn(emb, labels, ref, ref_labels).backward()

    return step


def _time_in_process(fn, setting: Setting, device: str, repeats: int) -> float:
    return median_time(_fwd_bwd(fn, setting, device), device, repeats)


def _compiled_kernel_loss(cls_name: str, setting: Setting, device: str):
    """``kernel="dense"`` under ``torch.compile(fullgraph=True)``, compiled (fwd and bwd) on ``setting``'s shapes:
    ``(compiled, compile_s)``."""
    return compile_loss(_kernel_loss(cls_name, "dense"), lambda compiled: _fwd_bwd(compiled, setting, device)(), device)


def _select(settings: list[Setting], names: list[str] | None) -> list[Setting]:
    """The settings named in ``names`` (all when None); ValueError naming ``--settings`` for an unknown name."""
    if names is None:
        return settings
    unknown = set(names) - {s.name for s in settings}
    if unknown:
        raise ValueError(f"--settings: unknown {sorted(unknown)}; choose from {[s.name for s in settings]}")
    return [s for s in settings if s.name in names]


def crossover(device: str, repeats: int, compiled: bool = True, settings: list[Setting] | None = None) -> list[dict]:
    """Time ``kernel="dense"`` (eager and, with ``compiled``, under ``torch.compile(fullgraph=True)``) against
    ``"sorted"`` (one process, median of ``repeats`` after a warm-up) and print the table with the ``auto`` choice.

    The CPU rule of ``pml_suprank.ranking.choose_kernel`` (dense iff ``B·N² <= CPU_DENSE_MAX_WORK``) is read off
    the eager columns: the largest ``B·N²`` at which eager dense is still faster for every loss. Compile time is
    reported apart and excluded from the timings.
    """
    from pml_suprank.ranking import choose_kernel

    rows = []
    print(f"\ndevice: {_device_name(device)}")
    print(
        "| setting | B·N² | loss | dense (s) | dense compiled (s) | compile (s) | sorted (s) | sorted/dense "
        "| dense/compiled | auto picks |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for setting in settings or CROSSOVER_SETTINGS:
        n = setting.num_refs or setting.batch
        for cls_name in KERNEL_LOSSES:
            t = {k: _time_in_process(_kernel_loss(cls_name, k), setting, device, repeats) for k in ("dense", "sorted")}
            if compiled and cls_name not in HIERARCHICAL:
                fn, t["compile_s"] = _compiled_kernel_loss(cls_name, setting, device)
                t["dense_compiled"] = _time_in_process(fn, setting, device, repeats)
            auto = choose_kernel("auto", device, setting.batch, n, levels=2 if cls_name in HIERARCHICAL else 1)
            rows.append({"setting": setting.name, "B": setting.batch, "N": n, "loss": cls_name, **t, "auto": auto})
            comp = f"{t['dense_compiled']:.4f} | {t['compile_s']:.1f} | " if "dense_compiled" in t else "– | – | "
            speed = f"{t['dense'] / t['dense_compiled']:.2f}×" if "dense_compiled" in t else "–"
            print(
                f"| {setting.name} | {setting.batch * n * n:.1e} | {cls_name} | {t['dense']:.4f} | {comp}"
                f"{t['sorted']:.4f} | {t['sorted'] / t['dense']:.2f}× | {speed} | {auto} |",
                flush=True,
            )
    faster = [r["B"] * r["N"] ** 2 for r in rows if r["dense"] < r["sorted"]]
    slower = [r["B"] * r["N"] ** 2 for r in rows if r["dense"] >= r["sorted"]]
    print(f"eager dense faster up to B·N² = {max(faster, default=0):.2e}; first slower at {min(slower, default=0):.2e}")
    return rows


def _profile_counts(fn, emb, labels, ref, ref_labels) -> dict:
    """Operator counts of one fwd+bwd of ``fn`` after a warm-up (see ``_bench_common.profile_counts``)."""
    return profile_counts(lambda: fn(emb, labels, ref, ref_labels).backward())


def op_counts(device: str, batch: int = 256, compiled: bool = True) -> list[dict]:
    """Per loss: our kernels (auto / dense / sorted / dense under ``torch.compile(fullgraph=True)`` — compile time
    reported, flat losses only with ``compiled``), and for SupAP / Smooth-AP the naive dense formulation of the
    reference code and PML's SmoothAPLoss, at ``batch`` in-batch — operator and host-sync counts of one fwd+bwd."""
    setting = Setting(f"in-batch B={batch}", batch, None)
    rows = []
    print(f"\ndevice: {_device_name(device)}")
    print(
        f"| loss (B = {batch} in-batch) | kernel | top-level aten ops | compute ops (≈ launches) | host syncs "
        "| compile (s) |"
    )
    print("|---|---|---|---|---|---|")
    candidates = [(cls_name, kernel, None) for cls_name in KERNEL_LOSSES for kernel in ("auto", "dense", "sorted")]
    if compiled:
        candidates += [(cls_name, "dense compiled", None) for cls_name in KERNEL_LOSSES if cls_name not in HIERARCHICAL]
    candidates += [("SupAPLoss", "naive dense", _dense("supap")), ("SmoothAPLoss", "naive dense", _dense("smoothap"))]
    candidates += [("SmoothAPLoss", "PML 2.9", _pml_smooth_ap())]
    for cls_name, kernel, fn in sorted(candidates, key=lambda c: KERNEL_LOSSES.index(c[0])):
        compile_s = None
        if kernel == "dense compiled":
            fn, compile_s = _compiled_kernel_loss(cls_name, setting, device)
        fn = fn or _kernel_loss(cls_name, kernel)
        emb, labels, ref, ref_labels = make_inputs(setting, device)
        emb = emb.clone().requires_grad_(True)
        counts = _profile_counts(fn, emb, labels, ref, ref_labels)
        rows.append({"loss": cls_name, "kernel": kernel, **counts, "compile_s": compile_s})
        comp = "–" if compile_s is None else f"{compile_s:.1f}"
        print(
            f"| {cls_name} | {kernel} | {counts['aten_ops']} | {counts['compute_ops']} | {counts['syncs']} | {comp} |",
            flush=True,
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each worker (default: torch's)")
    parser.add_argument("--dense-limit", type=float, default=4e7, help="skip dense rows when B·N² exceeds this")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    parser.add_argument("--rows", nargs="*", default=None, help="only these row names")
    parser.add_argument("--settings", nargs="*", default=None, help="only these setting names, e.g. 'B=256 N=4096'")
    parser.add_argument("--crossover", action="store_true", help="dense vs sorted kernel timings (one process)")
    parser.add_argument("--ops", action="store_true", help="aten op and host-sync counts per kernel (profiler)")
    parser.add_argument("--no-compile", action="store_true", help="--ops / --crossover: skip the torch.compile rows")
    args = parser.parse_args(argv)
    if args.crossover or args.ops:
        if args.threads:
            torch.set_num_threads(args.threads)
        out = {}
        if args.ops:
            out["ops"] = {dev: op_counts(dev, compiled=not args.no_compile) for dev in available_devices()}
        if args.crossover:
            repeats = args.repeats if args.repeats is not None else 3
            chosen = _select(CROSSOVER_SETTINGS, args.settings)
            out["crossover"] = crossover(args.device, repeats, compiled=not args.no_compile, settings=chosen)
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"bench_kernels_{args.device.split(':')[0]}.json"
        meta = {"torch": torch.__version__, "device": args.device, "threads": torch.get_num_threads()}
        path.write_text(json.dumps({"meta": meta, **out}, indent=1))
        print(f"wrote {path}")
        return out

    if args.quick:
        settings = [Setting("in-batch B=64", 64, None), Setting("B=64 N=1024", 64, 1024)]
    else:
        settings = [Setting(f"in-batch B={b}", b, None) for b in (64, 128, 256)]
        settings += [Setting(f"B=256 N={n}", 256, n) for n in (1024, 4096, 60000)]
    settings = _select(settings, args.settings)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    rows = [r for r in ROWS if args.rows is None or r.name in args.rows or r.name == "matmul"]

    results = []
    for setting in settings:
        n = setting.num_refs or setting.batch
        for row in rows:
            entry = {"setting": setting.name, "B": setting.batch, "N": n, "row": row.name, "kind": row.kind}
            if row.in_batch_only and setting.num_refs is not None:
                continue
            if row.dense and setting.batch * n * n > args.dense_limit:
                entry["skipped"] = f"B·N² = {setting.batch * n * n:.1e} > --dense-limit {args.dense_limit:.0e}"
            else:
                entry.update(run_row(row, setting, args.device, repeats, args.threads, args.timeout))
            results.append(entry)
            status = entry.get("error") or entry.get("skipped") or f"{entry['time_s']:.3f} s"
            print(f"  {setting.name:16s} {row.name:18s} {status}", flush=True)

    # ratio table
    def find(setting_name, row_name):
        return next((r for r in results if r["setting"] == setting_name and r["row"] == row_name), None)

    header = " | ".join(f"vs {b}" for b in ("matmul", "dense", "PML"))
    print(f"\n| setting | loss | time (s) | extra peak (MB) | {header} |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if r["kind"] != "ours" or "time_s" not in r:
            continue
        ratios = {}
        for base in COMPARE.get(r["row"], ["matmul"]):
            b = find(r["setting"], base)
            if b and "time_s" in b:
                key = "matmul" if base == "matmul" else ("PML" if base.startswith("PML") else "dense")
                ratios[key] = b["time_s"] / r["time_s"]
        r["speedup_vs"] = ratios
        cells = [
            f"{ratios[k]:.2f}×" if k in ratios else "–"
            for k in ("matmul", "dense", "PML")  # speed-up factors: baseline time / our time
        ]
        joined = " | ".join(cells)
        print(f"| {r['setting']} | {r['row']} | {r['time_s']:.3f} | {r['peak_extra_mb']:.0f} | {joined} |")
    print("\n(ratios are speed-ups: baseline time / our time; 'vs matmul' < 1 means slower than the bare matmul)")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"bench_losses{'_quick' if args.quick else ''}_{args.device.split(':')[0]}.json"
    meta = {
        "torch": torch.__version__,
        "device": args.device,
        "threads": args.threads or torch.get_num_threads(),
        "platform": platform.platform(),
        "repeats": repeats,
    }
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
