"""Benchmark of RankingMemory: B = 256 queries with a 60,000-slot memory (SOP "full memory", 512-d).

For every configuration a fresh process (so that peak-RSS readings do not leak between configurations) measures
the forward+backward time of one training step and, in the same process, the bare ``256 × 60,000`` similarity
matmul forward+backward (the baseline the ratios are taken against; target: stay within 10× of it, under 2 s
and 2 GB extra on the 2-core CPU). It also reports the bytes held by the memory's own buffers and the peak extra
resident memory of the step (``ru_maxrss`` after the step minus before it, i.e. the loss's and the memory's
temporaries). Machines are shared and noisy: read the ratios, not the absolute times.

``--syncs`` instead counts, per flat rank loss with ``kernel="sorted"`` (SupAP, ROADMAP, Smooth-AP, Sup-R@k), the
top-level aten ops and the host-synchronising ops of one forward+backward (torch.profiler on the CPU, as
``bench_losses.py --ops``; Python-level host reads such as ``.tolist()``, which the CPU profiler does not see, are
counted too) for B = 256 queries against the batch itself and against memories of 4,096 and 60,000 items, both for
the whole loss and for its rank kernel alone (the :mod:`pml_suprank.ranking.flat` calls on a precomputed score
matrix), with the fwd+bwd time of one call. ``--compare PATH`` runs the same counts with the ``pml_suprank``
package found under ``PATH`` (e.g. an older checkout) and prints it as the "before" column.

Usage: ``python benchmarks/bench_memory.py [--memory-size 60000] [--batch-size 256] [--dim 512] [--reps 3]
[--json out.json] [--device cpu|cuda]``; ``python benchmarks/bench_memory.py --syncs [--sizes 4096 60000]
[--compare /path/to/other/checkout]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from _bench_common import profile_counts

CONFIGS = {
    "loss_only_SupAP(ref=memory)": "direct SupAPLoss(include_self=True) call with ref_emb = the 60k memory",
    "memory_SupAP_include_self": "RankingMemory(SupAPLoss(include_self=True), mode='index'): batch + memory terms",
    "memory_SupAP": "RankingMemory(SupAPLoss(), mode='index'): self copy removed through pair indices",
    "memory_ROADMAP": "RankingMemory(ROADMAPLoss(), mode='index') (SupAP + calibration L_DG)",
    "memory_HAPPIER": "RankingMemory(HAPPIERLoss(), mode='index'), 2-level labels (SOP-like 12 super-classes)",
    "memory_SupAP_fifo": "RankingMemory(SupAPLoss(), mode='fifo'), full queue",
    "memory_SupAP_fifo_get_first": "RankingMemory(SupAPLoss(), mode='fifo', get_first=True): no pair list",
}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, reps: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _dataset_labels(n: int, seed: int = 0) -> torch.Tensor:
    """SOP-like labels: classes of ~5 images, 12 super-classes; (n, 2) = (fine, coarse)."""
    g = torch.Generator().manual_seed(seed)
    fine = torch.arange(n) // 5
    coarse = torch.randint(0, 12, (int(fine.max()) + 1,), generator=g)[fine]
    return torch.stack([fine, coarse], 1)


def _batch(labels: torch.Tensor, batch_size: int, m: int = 4, seed: int = 1) -> torch.Tensor:
    """Indices of batch_size / m classes × m images (m-per-class batch)."""
    g = torch.Generator().manual_seed(seed)
    classes = torch.randperm(int(labels[:, 0].max()) + 1, generator=g)[: batch_size // m]
    return torch.cat([torch.nonzero(labels[:, 0] == c)[:m, 0] for c in classes])


def run_config(name: str, memory_size: int, batch_size: int, dim: int, reps: int, device_name: str, queue) -> None:
    from pml_suprank import losses
    from pml_suprank.memory import RankingMemory

    torch.manual_seed(0)
    device = torch.device(device_name)
    labels = _dataset_labels(memory_size)
    idx = _batch(labels, batch_size)
    hierarchical = name == "memory_HAPPIER"
    batch_labels = (labels[idx] if hierarchical else labels[idx, 0]).to(device)
    mem_labels = labels if hierarchical else labels[:, 0]

    if name == "loss_only_SupAP(ref=memory)" or name.startswith("memory_SupAP") and "include_self" in name:
        loss_fn = losses.SupAPLoss(include_self=True)
    elif name in ("memory_SupAP", "memory_SupAP_fifo", "memory_SupAP_fifo_get_first"):
        loss_fn = losses.SupAPLoss()
    elif name == "memory_ROADMAP":
        loss_fn = losses.ROADMAPLoss()
    else:
        loss_fn = losses.HAPPIERLoss(num_classes=int(labels[:, 0].max()) + 1, embedding_size=dim)
    loss_fn = loss_fn.to(device)
    mode = "fifo" if "fifo" in name else "index"
    memory = RankingMemory(loss_fn, dim, memory_size, mode=mode, device=device, get_first=name.endswith("get_first"))
    with torch.no_grad():  # fill in chunks (keeps the baseline RSS honest)
        for lo in range(0, memory_size, 4096):
            hi = min(lo + 4096, memory_size)
            chunk = F.normalize(torch.randn(hi - lo, dim, device=device), dim=1)
            memory.enqueue(chunk, mem_labels[lo:hi].to(device), torch.arange(lo, hi, device=device))
    memory_bytes = sum(b.numel() * b.element_size() for b in memory.buffers())
    base = F.normalize(torch.randn(batch_size, dim, device=device), dim=1)
    weight = torch.randn(dim, dim, device=device) / dim**0.5
    weight.requires_grad_(True)
    ref = memory.embeddings

    def matmul_step():
        q = base @ weight
        (q @ ref.t()).sum().backward()
        weight.grad = None

    def step():
        emb = F.normalize(base @ weight, dim=1)
        if name.startswith("loss_only"):
            out = loss_fn(emb, batch_labels, None, ref, mem_labels.to(device))
        else:
            out = memory(emb, batch_labels, idx.to(device))
        out.backward()
        weight.grad = None

    t_matmul = _timed(matmul_step, reps, device)
    rss_before = _rss_mb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        alloc_before = torch.cuda.memory_allocated()
    t_step = _timed(step, reps, device)
    extra = _rss_mb() - rss_before
    if device.type == "cuda":
        extra = (torch.cuda.max_memory_allocated() - alloc_before) / 2**20
    queue.put(
        {
            "name": name,
            "step_s": t_step,
            "matmul_s": t_matmul,
            "ratio_vs_matmul": t_step / t_matmul,
            "memory_buffers_mb": memory_bytes / 2**20,
            "peak_extra_mb": extra,
        }
    )


# ------------------------------------------------------------------------------------------------ --syncs
SYNC_LOSSES = ("SupAPLoss", "ROADMAPLoss", "SmoothAPLoss", "SupRecallLoss")


# host-synchronising aten ops (the list of bench_losses.py); counted once per outermost call
def count_ops(fn) -> dict:
    """Top-level aten ops, host syncs (``_bench_common.profile_counts``: outermost sync ops plus ``.tolist()``-style
    reads) and wall time of one call of ``fn``; the timed call is the profile's warm-up."""
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    counts = profile_counts(fn, warm_up=False)
    return {"aten_ops": counts["aten_ops"], "syncs": counts["syncs"], "seconds": seconds}


def _sync_inputs(batch_size: int, memory_size: int | None, dim: int):
    """``(emb (B, D), labels (B,), ref (N, D) | None, ref_labels (N,) | None)``: an m-per-class batch of SOP-like
    labels (4 per class) against itself or against a memory of ``memory_size`` items (5 per class)."""
    g = torch.Generator().manual_seed(0)
    labels = _dataset_labels(max(memory_size or 0, 4 * batch_size))[:, 0]
    idx = _batch(labels[:, None], batch_size)
    emb = F.normalize(torch.randn(batch_size, dim, generator=g), dim=1)
    if memory_size is None:
        return emb, labels[idx], None, None
    ref = F.normalize(torch.randn(memory_size, dim, generator=g), dim=1)
    return emb, labels[idx], ref, labels[:memory_size]


def _kernel_step(cls_name: str, emb, labels, ref, ref_labels):
    """The rank-kernel calls of ``cls_name``'s sorted path on a fixed score matrix, fwd+bwd (a closure)."""
    from pml_suprank import ranking

    same = ref is None
    scores = (emb @ (emb if same else ref).t()).requires_grad_(True)
    valid = torch.ones(scores.shape, dtype=torch.bool)
    if same:
        valid.fill_diagonal_(False)
    positives = valid & (labels[:, None] == (labels if same else ref_labels)[None, :])
    negatives = valid & ~positives
    q, i = torch.nonzero(positives, as_tuple=True)  # the loss's pair list (outside the kernel)

    def step():
        scores.grad = None
        if cls_name == "SmoothAPLoss":
            pos_sum, all_sum = ranking.flat.sigmoid_rank_sums(scores, q, i, valid, 0.01)
            ((1.0 + pos_sum) / (1.0 + all_sum)).sum().backward()
            return
        rank_plus = 1.0 + ranking.flat.heaviside_positive_count(scores, q, i)
        rank = rank_plus + ranking.flat.suprank_negative_sum(scores, q, i, negatives, ranking.SupRankStep())
        (rank_plus / rank).sum().backward()

    return step


def _loss_step(cls_name: str, emb, labels, ref, ref_labels):
    from pml_suprank import losses

    loss_fn = getattr(losses, cls_name)(kernel="sorted")
    emb = emb.clone().requires_grad_(True)
    kwargs = {} if ref is None else {"ref_emb": ref, "ref_labels": ref_labels}

    def step():
        emb.grad = None
        loss_fn(emb, labels, **kwargs).backward()

    return step


def sync_counts(batch_size: int, sizes: list[int], dim: int, package_path: str | None, queue) -> None:
    """Worker: ``count_ops`` of every loss of ``SYNC_LOSSES`` (kernel part and whole loss) per setting."""
    import sys

    if package_path:
        sys.path.insert(0, package_path)
    torch.manual_seed(0)
    rows = []
    for memory_size in [None, *sizes]:
        inputs = _sync_inputs(batch_size, memory_size, dim)
        for cls_name in SYNC_LOSSES:
            row = {"loss": cls_name, "memory": memory_size or "in-batch"}
            row["kernel"] = count_ops(_kernel_step(cls_name, *inputs))
            row["loss_total"] = count_ops(_loss_step(cls_name, *inputs))
            rows.append(row)
    import pml_suprank

    queue.put({"package": pml_suprank.__file__, "rows": rows})


def _spawn_sync_counts(args, package_path: str | None) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=sync_counts, args=(args.batch_size, args.sizes, args.dim, package_path, queue))
    proc.start()
    proc.join(args.timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise RuntimeError(f"--syncs: timeout after {args.timeout:.0f} s")
    if queue.empty():
        raise RuntimeError(f"--syncs: the worker exited with code {proc.exitcode}")
    return queue.get()


def print_sync_counts(args) -> dict:
    """Run the ``--syncs`` counts (and those of ``--compare``) and print one table; returns the raw rows."""
    after = _spawn_sync_counts(args, None)
    before = _spawn_sync_counts(args, args.compare) if args.compare else None
    print(f"sorted kernel, B={args.batch_size}, one fwd+bwd (after warm-up): top-level aten ops / host syncs / seconds")
    if before:
        print(f"before = {before['package']}, after = {after['package']}")
    cols = ["kernel ops", "kernel syncs", "loss ops", "loss syncs", "kernel s", "loss s"]
    print("| loss | references | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for k, row in enumerate(after["rows"]):
        old = before["rows"][k] if before else None
        cells = []
        for part, key in [("kernel", "aten_ops"), ("kernel", "syncs"), ("loss_total", "aten_ops")]:
            cells.append(_before_after(old and old[part][key], row[part][key], "{}"))
        cells.append(_before_after(old and old["loss_total"]["syncs"], row["loss_total"]["syncs"], "{}"))
        for part in ("kernel", "loss_total"):
            cells.append(_before_after(old and old[part]["seconds"], row[part]["seconds"], "{:.3f}"))
        print(f"| {row['loss']} | {row['memory']} | " + " | ".join(cells) + " |", flush=True)
    print("(seconds: one call each, in separate processes: an order of magnitude, not a timing comparison)")
    return {"after": after, "before": before}


def _before_after(old, new, fmt: str) -> str:
    return fmt.format(new) if old is None else f"{fmt.format(old)} → {fmt.format(new)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory-size", type=int, default=60_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    parser.add_argument("--syncs", action="store_true", help="aten op and host-sync counts of the sorted kernels")
    parser.add_argument("--sizes", nargs="*", type=int, default=[4096, 60_000], help="memory sizes for --syncs")
    parser.add_argument("--compare", default=None, help="--syncs: also count with the package under this path")
    args = parser.parse_args()
    if args.syncs:
        out = print_sync_counts(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), **out}, f, indent=1)
        return
    ctx = mp.get_context("spawn")
    rows = []
    print(
        f"RankingMemory: B={args.batch_size}, memory={args.memory_size}, d={args.dim}, device={args.device}, "
        f"threads={torch.get_num_threads()}"
    )
    print(
        f"{'configuration':32s} {'step s':>8s} {'matmul s':>9s} {'ratio':>7s} {'buffers MB':>11s} {'peak+ MB':>9s}",
        flush=True,
    )
    for name in args.configs:
        queue = ctx.Queue()
        proc = ctx.Process(
            target=run_config,
            args=(name, args.memory_size, args.batch_size, args.dim, args.reps, args.device, queue),
        )
        proc.start()
        proc.join(args.timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            res = {"name": name, "error": f"timeout after {args.timeout:.0f} s"}
        else:
            res = queue.get() if not queue.empty() else {"name": name, "error": f"exit code {proc.exitcode}"}
        rows.append(res)
        if "error" in res:
            print(f"{name:32s} {res['error']}", flush=True)
            continue
        print(
            f"{name:32s} {res['step_s']:8.3f} {res['matmul_s']:9.3f} {res['ratio_vs_matmul']:7.1f} "
            f"{res['memory_buffers_mb']:11.1f} {res['peak_extra_mb']:9.1f}",
            flush=True,
        )
    for name, what in CONFIGS.items():
        if name in args.configs:
            print(f"  {name}: {what}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
