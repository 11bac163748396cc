"""Benchmark of RankingMemory: B = 256 queries with a 60,000-slot memory (SOP "full memory", 512-d).

For every configuration a fresh process (so that peak-RSS readings do not leak between configurations) measures
the forward+backward time of one training step and, in the same process, the bare ``256 × 60,000`` similarity
matmul forward+backward (the baseline the ratios are taken against; target: stay within 10× of it, under 2 s
and 2 GB extra on the 2-core CPU). It also reports the bytes held by the memory's own buffers and the peak extra
resident memory of the step (``ru_maxrss`` after the step minus before it, i.e. the loss's and the memory's
temporaries). Machines are shared and noisy: read the ratios, not the absolute times.

Usage: ``python benchmarks/bench_memory.py [--memory-size 60000] [--batch-size 256] [--dim 512] [--reps 3]
[--json out.json] [--device cpu|cuda]``
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
    args = parser.parse_args()
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
