"""Benchmark of ``pml_suprank.training.cached_backward``: one optimizer step on a batch of N images, plain vs cached.

Model: timm's ``test_resnet`` through ``RetrievalModel`` (embedding 128, BatchNorm frozen: eval mode in both
configurations), loss ``ROADMAPLoss`` (SupAP + calibration) on ``N`` images of ``N / 16`` classes, optimizer AdamW.
A step is ``zero_grad`` + forward/backward + ``step``:

* **plain**: ``loss_fn(model(images), labels).backward()`` — all activations of the ``N`` images alive at once;
* **cached**: ``cached_backward(model, loss_fn, images, labels, chunk_size=C)`` — the same gradient, one chunk of
  ``C`` images alive at a time, one extra forward.

Memory: each configuration runs in a fresh child process (peak-RSS readings never shrink inside a process); the
reported figure is the peak resident memory of the step above the resident memory just before it
(``ru_maxrss`` after − ``/proc/self/statm`` before), i.e. activations, gradients and temporaries, not the model,
the inputs or the interpreter. Time: measured in this process, the two configurations alternating, median of
``--reps`` steps each after one warm-up step of each; the shared machine is noisy, read the ratio. The script also
checks that both configurations give the same gradient (max relative difference, float32 rounding expected).

``--real`` instead trains on real data (the Omniglot protocol of ``benchmarks/real_hierarchical_retrieval.py``,
whose data loading, model, optimizer, augmentation and evaluation it reuses) with virtual batches of
``--virtual`` images (``cached_backward`` in chunks of ``--chunk``), every run seeing the same number of images
(``--images``; steps = images / virtual batch, the cosine schedule over those steps). HierarchicalSampler batches
of ``min(8, V / 32)`` alphabets × characters × 4 images. The protocol's BatchNorm layers train (batch statistics):
here they use the statistics of each chunk (``allow_batchnorm=True``), i.e. of 64 images in every configuration,
as in the protocol's 64-image batches; at ``V = 64`` the run is the protocol's plain step.

Usage: ``python benchmarks/bench_cached_backward.py [--n 1024] [--chunk 64] [--image-size 64] [--reps 3]
[--threads 2] [--json out.json]``; ``python benchmarks/bench_cached_backward.py --real [--losses roadmap happier]
[--virtual 64 256 1024] [--seeds 0 1 2] [--images 25600] [--threads 1] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO_ROOT))


def build(n: int, image_size: int, seed: int = 0):
    from pml_suprank import losses
    from pml_suprank.models import RetrievalModel

    torch.manual_seed(seed)
    model = RetrievalModel("test_resnet", embedding_size=128, image_size=image_size)
    model.train()
    for m in model.modules():  # frozen BatchNorm statistics (the recipes' retrieval default): exact under chunking
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    g = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(n, 3, image_size, image_size, generator=g)
    labels = torch.arange(n) // 16
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, losses.ROADMAPLoss(), images, labels, optimizer


def step(model, loss_fn, images, labels, optimizer, chunk: int | None) -> float:
    from pml_suprank.training import cached_backward

    optimizer.zero_grad(set_to_none=True)
    if chunk is None:
        loss = loss_fn(model(images), labels)
        loss.backward()
    else:
        loss = cached_backward(model, loss_fn, images, labels, chunk_size=chunk)
    optimizer.step()
    return float(loss.detach())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory_child(args: argparse.Namespace, chunk: int | None, queue) -> None:
    torch.set_num_threads(args.threads)
    model, loss_fn, images, labels, optimizer = build(args.n, args.image_size)
    # optimizer state allocated outside the measured step (AdamW's moments exist after the first step anyway)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    before = _rss_bytes()
    step(model, loss_fn, images, labels, optimizer, chunk)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put(max(peak - before, 0))


def peak_memory(args: argparse.Namespace, chunk: int | None) -> int:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_child, args=(args, chunk, queue))
    proc.start()
    value = queue.get()
    proc.join()
    return value


def gradient_difference(args: argparse.Namespace) -> float:
    """Max relative difference between the plain and the cached gradients (one step, same model)."""
    model, loss_fn, images, labels, _ = build(min(args.n, 256), args.image_size)
    loss_fn(model(images), labels).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    from pml_suprank.training import cached_backward

    cached_backward(model, loss_fn, images, labels, chunk_size=args.chunk)
    return max(
        float((p.grad - g).abs().max() / g.abs().max().clamp_min(1e-30))
        for p, g in zip(model.parameters(), plain, strict=True)
        if p.grad is not None
    )


def timings(args: argparse.Namespace) -> dict[str, float]:
    torch.set_num_threads(args.threads)
    model, loss_fn, images, labels, optimizer = build(args.n, args.image_size)
    times: dict[str, list[float]] = {"plain": [], "cached": []}
    for rep in range(args.reps + 1):
        for name, chunk in (("plain", None), ("cached", args.chunk)):
            t0 = time.perf_counter()
            step(model, loss_fn, images, labels, optimizer, chunk)
            if rep > 0:  # the first round warms up both
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def train_virtual(name: str, seed: int, virtual: int, args: argparse.Namespace, train_data, rhr) -> tuple:
    """A fresh model of the Omniglot protocol trained with ``name`` on virtual batches of ``virtual`` images for
    ``args.images // virtual`` steps; returns the model and the last training loss."""
    from pml_suprank.samplers import HierarchicalSampler
    from pml_suprank.training import TrainingConfig, build_optimizer, build_scheduler, cached_backward

    protocol, (images, labels) = rhr.Protocol(), train_data
    factory, hierarchical = rhr.LOSSES[name]
    model = rhr.build_model(protocol, seed)
    torch.manual_seed(seed)
    loss_fn, _ = factory(int(labels[:, 0].max()) + 1, protocol.embedding_size)
    config = TrainingConfig(optimizer="adam", lr_backbone=protocol.lr, lr_head=protocol.lr,
                            lr_proxies=protocol.lr_proxies, weight_decay=protocol.weight_decay,
                            proxies_weight_decay=0.0, seed=seed)  # fmt: skip
    steps = args.images // virtual
    optimizer = build_optimizer(model, loss_fn, config)
    scheduler = build_scheduler(optimizer, steps, config)
    k = min(8, virtual // 32)
    sampler = HierarchicalSampler(labels, batch_size=virtual, samples_per_class=protocol.samples_per_class,
                                  super_classes_per_batch=k, batches_per_super_tuple=1, seed=seed)  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    model.train()
    loss_fn.train()
    step, epoch, last = 0, 0, float("nan")
    while step < steps:
        sampler.set_epoch(epoch)
        for batch in sampler:
            if step == steps:
                break
            idx = torch.as_tensor(batch)
            y = labels[idx] if hierarchical else labels[idx, 0]
            x = rhr.to_input(rhr.random_shift(images[idx], protocol.max_shift, generator))
            optimizer.zero_grad(set_to_none=True)
            loss = cached_backward(model, loss_fn, x, y, chunk_size=args.chunk, allow_batchnorm=True)
            optimizer.step()
            scheduler.step()
            last, step = float(loss), step + 1
        epoch += 1
    return model, last, steps


def real(args: argparse.Namespace) -> dict:
    import real_hierarchical_retrieval as rhr

    torch.set_num_threads(args.threads)
    root = rhr.REPO_ROOT.parent / "shared" / "data" / "omniglot_small"
    protocol = rhr.Protocol()
    train_data = rhr.load_split(args.data_root or root, "train", protocol.image_size)
    test_data = rhr.load_split(args.data_root or root, "test", protocol.image_size)
    records = []
    for seed in args.seeds:
        for name in args.losses:
            for virtual in args.virtual:
                start = time.perf_counter()
                model, last, steps = train_virtual(name, seed, virtual, args, train_data, rhr)
                metrics = rhr.evaluate(model, *test_data, protocol)
                wall = time.perf_counter() - start
                records.append({"loss": f"{name} V={virtual}", "seed": seed, "steps": steps, "wall_s": wall,
                                "final_train_loss": last, **metrics})  # fmt: skip
                shown = "  ".join(f"{label} {100 * metrics[key]:.2f}" for key, label in rhr.METRICS)
                print(f"seed {seed} {name} V={virtual:5d} ({steps} steps) {wall:6.1f} s  loss {last:.4f}  {shown}",
                      flush=True)  # fmt: skip
    table = rhr.markdown_table(rhr.summarize(records))
    print(f"\nOmniglot open set, {len(args.seeds)} seed(s), {args.images} images per run, chunk {args.chunk}, "
          f"{args.threads} thread(s), torch {torch.__version__} (metrics in %, mean ± std over seeds)\n")  # fmt: skip
    print(table)
    return {"args": vars(args), "records": records, "table": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="images per optimizer step (the virtual batch)")
    parser.add_argument("--chunk", type=int, default=64, help="cached_backward chunk_size")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--real", action="store_true", help="train on Omniglot with virtual batches instead")
    parser.add_argument("--losses", nargs="+", default=["roadmap", "happier"], help="--real: losses")
    parser.add_argument("--virtual", type=int, nargs="+", default=[64, 256, 1024], help="--real: virtual batches")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--real: seeds")
    parser.add_argument("--images", type=int, default=25600, help="--real: training images per run")
    parser.add_argument("--data_root", default=None, help="--real: Omniglot folder (default ../shared/data/...)")
    args = parser.parse_args()
    if args.real:
        result = real(args)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return
    mem_plain, mem_cached = peak_memory(args, None), peak_memory(args, args.chunk)
    times = timings(args)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    result = {
        "n": args.n, "chunk": args.chunk, "image_size": args.image_size, "reps": args.reps, "threads": args.threads,
        "peak_extra_mb_plain": mem_plain / 2**20, "peak_extra_mb_cached": mem_cached / 2**20,
        "memory_ratio": mem_cached / max(mem_plain, 1), "time_s_plain": times["plain"],
        "time_s_cached": times["cached"], "time_ratio": times["cached"] / times["plain"],
        "max_rel_grad_diff": gradient_difference(args), "torch": torch.__version__, "device": "cpu",
        "cpu": platform.processor() or platform.machine(), "commit": commit,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }  # fmt: skip
    print(f"N={args.n} images of {args.image_size}px, chunk {args.chunk}, test_resnet + ROADMAP, AdamW, CPU "
          f"({args.threads} threads), torch {torch.__version__}, commit {commit}")  # fmt: skip
    print("| step | peak extra memory (MB) | time per step (s) |")
    print("|---|---:|---:|")
    print(f"| plain batch | {result['peak_extra_mb_plain']:.0f} | {times['plain']:.2f} |")
    print(f"| cached_backward | {result['peak_extra_mb_cached']:.0f} | {times['cached']:.2f} |")
    print(f"| ratio cached / plain | {result['memory_ratio']:.3f} | {result['time_ratio']:.2f} |")
    print(f"max relative gradient difference (N={min(args.n, 256)}): {result['max_rel_grad_diff']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
