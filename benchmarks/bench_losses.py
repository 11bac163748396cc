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
    python benchmarks/bench_losses.py --crossover  # kernel="dense" vs "sorted" timings and the auto rule's choice
    python benchmarks/bench_losses.py --ops        # op / launch-proxy / host-sync counts per fwd+bwd, per kernel,
                                                   # on every available device, with the naive dense and PML rows

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
# host-synchronising aten ops (each drains an accelerator's queue); counted once per outermost call
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::unique")
SYNC_OPS += ("aten::_unique2", "aten::unique_consecutive", "aten::masked_select", "aten::equal")


def _kernel_loss(cls_name: str, kernel: str):
    """The loss with ``kernel=``; hierarchical losses get 2-level labels ``(fine, fine // 4)``."""
    if cls_name not in HIERARCHICAL:
        return _ours(cls_name, kernel=kernel)()
    fn = _ours(cls_name, kernel=kernel, **HIERARCHICAL[cls_name])()

    def two_levels(labels):
        return None if labels is None else torch.stack([labels, labels // 4], 1)

    return lambda emb, labels, ref, ref_labels: fn(emb, two_levels(labels), ref, two_levels(ref_labels))


def _time_in_process(fn, setting: Setting, device: str, repeats: int) -> float:
    emb, labels, ref, ref_labels = make_inputs(setting, device)
    emb = emb.clone().requires_grad_(True)
    times = []
    for _ in range(repeats + 1):
        emb.grad = None
        t0 = time.perf_counter()
        fn(emb, labels, ref, ref_labels).backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def crossover(device: str, repeats: int) -> list[dict]:
    """Time ``kernel="dense"`` against ``"sorted"`` (one process, median of ``repeats``) and print the table.

    The CPU rule of ``pml_suprank.ranking.choose_kernel`` (dense iff ``B·N² <= CPU_DENSE_MAX_WORK``) is read off
    this table: the largest ``B·N²`` at which dense is still faster for every loss.
    """
    from pml_suprank.ranking import choose_kernel

    rows = []
    print("\n| setting | B·N² | loss | dense (s) | sorted (s) | sorted/dense | auto picks |")
    print("|---|---|---|---|---|---|---|")
    for setting in CROSSOVER_SETTINGS:
        n = setting.num_refs or setting.batch
        for cls_name in KERNEL_LOSSES:
            t = {k: _time_in_process(_kernel_loss(cls_name, k), setting, device, repeats) for k in ("dense", "sorted")}
            auto = choose_kernel("auto", device, setting.batch, n)
            rows.append({"setting": setting.name, "B": setting.batch, "N": n, "loss": cls_name, **t, "auto": auto})
            ratio = t["sorted"] / t["dense"]
            print(
                f"| {setting.name} | {setting.batch * n * n:.1e} | {cls_name} | {t['dense']:.4f} | "
                f"{t['sorted']:.4f} | {ratio:.2f}× | {auto} |",
                flush=True,
            )
    faster = [r["B"] * r["N"] ** 2 for r in rows if r["dense"] < r["sorted"]]
    slower = [r["B"] * r["N"] ** 2 for r in rows if r["dense"] >= r["sorted"]]
    print(f"dense faster up to B·N² = {max(faster, default=0):.2e}; first slower at {min(slower, default=0):.2e}")
    return rows


# metadata-only aten ops (no kernel launch on an accelerator): excluded from the "compute ops" launch proxy
VIEW_OPS = frozenset(
    "aten::" + n
    for n in (
        "view unsqueeze squeeze slice select mT t transpose expand expand_as as_strided flatten detach lift_fresh "
        "alias reshape permute _unsafe_view empty empty_like empty_strided result_type"
    ).split()
)


def _profile_counts(fn, emb, labels, ref, ref_labels) -> dict:
    """Operator counts of one fwd+bwd after a warm-up (CPU profiler): top-level aten ops, compute ops (leaf aten
    ops that are not views/allocations: the number of kernels an accelerator would launch, approximately) and
    host-synchronising ops (not counting those nested in ``aten::_assert_async``, asynchronous on accelerators)."""
    from torch.profiler import ProfilerActivity, profile

    fn(emb, labels, ref, ref_labels).backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(emb, labels, ref, ref_labels).backward()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    children = {id(e.cpu_parent) for e in events if e.cpu_parent is not None}

    def nested_in(e, names) -> bool:
        while e.cpu_parent is not None:
            e = e.cpu_parent
            if e.name in names:
                return True
        return False

    top = [e for e in events if not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    leaves = [e for e in events if id(e) not in children and e.name not in VIEW_OPS]
    syncs = [
        e for e in events if e.name in SYNC_OPS and not nested_in(e, set(SYNC_OPS) | {"aten::_assert_async"})
    ]
    return {"aten_ops": len(top), "compute_ops": len(leaves), "syncs": len(syncs)}


def op_counts(device: str, batch: int = 256) -> list[dict]:
    """Per loss: our kernels (auto / dense / sorted), and for SupAP / Smooth-AP the naive dense formulation of the
    reference code and PML's SmoothAPLoss, at ``batch`` in-batch — operator and host-sync counts of one fwd+bwd."""
    setting = Setting(f"in-batch B={batch}", batch, None)
    rows = []
    print(f"\ndevice: {_device_name(device)}")
    print(f"| loss (B = {batch} in-batch) | kernel | top-level aten ops | compute ops (≈ launches) | host syncs |")
    print("|---|---|---|---|---|")
    candidates = [(cls_name, kernel, None) for cls_name in KERNEL_LOSSES for kernel in ("auto", "dense", "sorted")]
    candidates += [("SupAPLoss", "naive dense", _dense("supap")), ("SmoothAPLoss", "naive dense", _dense("smoothap"))]
    candidates += [("SmoothAPLoss", "PML 2.9", _pml_smooth_ap())]
    for cls_name, kernel, fn in sorted(candidates, key=lambda c: KERNEL_LOSSES.index(c[0])):
        fn = fn or _kernel_loss(cls_name, kernel)
        emb, labels, ref, ref_labels = make_inputs(setting, device)
        emb = emb.clone().requires_grad_(True)
        counts = _profile_counts(fn, emb, labels, ref, ref_labels)
        rows.append({"loss": cls_name, "kernel": kernel, **counts})
        print(f"| {cls_name} | {kernel} | {counts['aten_ops']} | {counts['compute_ops']} | {counts['syncs']} |")
    return rows


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def available_devices() -> list[str]:
    """The CPU, plus ``cuda`` when a GPU is visible."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each worker (default: torch's)")
    parser.add_argument("--dense-limit", type=float, default=4e7, help="skip dense rows when B·N² exceeds this")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    parser.add_argument("--rows", nargs="*", default=None, help="only these row names")
    parser.add_argument("--crossover", action="store_true", help="dense vs sorted kernel timings (one process)")
    parser.add_argument("--ops", action="store_true", help="aten op and host-sync counts per kernel (profiler)")
    args = parser.parse_args(argv)
    if args.crossover or args.ops:
        if args.threads:
            torch.set_num_threads(args.threads)
        out = {}
        if args.ops:
            out["ops"] = {dev: op_counts(dev) for dev in available_devices()}
        if args.crossover:
            out["crossover"] = crossover(args.device, args.repeats if args.repeats is not None else 3)
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
