"""The flat sorted kernels' block size as a CPU proxy of GPU launches: operator and host-read counts (and CPU time)
of one fwd+bwd of SupAP's negative sum and Smooth-AP's rank sums, with ``CHUNK_SIZE`` (the CPU's blocks, and every
device's before ``ACCELERATOR_CHUNK_SIZE``) and with ``ACCELERATOR_CHUNK_SIZE`` (the accelerators' blocks).

B queries with 4 items per class against N items with 5 items per class (SOP-like), float32, scores ~ N(0, 0.1²).

Usage::

    python benchmarks/bench_flat_blocks.py              # B = 256, N = 60,000
    python benchmarks/bench_flat_blocks.py --refs 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _bench_common import profile_counts

from pml_suprank.ranking import ACCELERATOR_CHUNK_SIZE, CHUNK_SIZE, SupRankStep
from pml_suprank.ranking.flat import positive_pair_groups, sigmoid_rank_sums, suprank_negative_sum


def problem(batch: int, refs: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, refs, generator=g) * 0.1
    positives = (torch.arange(batch) // 4)[:, None] == (torch.randperm(refs, generator=g) // 5)[None]
    return scores, positives, torch.ones_like(positives)


def suprank_step(scores, positives, valid, chunk):
    x, step = scores.clone().requires_grad_(True), SupRankStep(offset=1.4933)

    def run():
        q, i, groups = positive_pair_groups(positives)
        suprank_negative_sum(x, q, i, valid & ~positives, step, chunk_elements=chunk, groups=groups).sum().backward()

    return run


def smooth_ap_step(scores, positives, valid, chunk):
    x = scores.clone().requires_grad_(True)

    def run():
        q, i, groups = positive_pair_groups(positives)
        pos, full = sigmoid_rank_sums(x, q, i, valid, 0.01, chunk_elements=chunk, groups=groups)
        (pos / (1 + full)).sum().backward()

    return run


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--refs", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    scores, positives, valid = problem(args.batch, args.refs)
    rows = []
    print(f"| B = {args.batch}, N = {args.refs} | block size | top-level aten ops | compute ops | host reads | CPU s |")
    print("|---|---|---|---|---|---|")
    for name, make in (("SupAP negative sum", suprank_step), ("Smooth-AP rank sums", smooth_ap_step)):
        for label, chunk in (("CHUNK_SIZE", CHUNK_SIZE), ("ACCELERATOR_CHUNK_SIZE", ACCELERATOR_CHUNK_SIZE)):
            run = make(scores, positives, valid, chunk)
            counts = profile_counts(run)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            rows.append({"kernel": name, "block": label, **counts, "cpu_s": statistics.median(times)})
            print(
                f"| {name} | {label} | {counts['aten_ops']} | {counts['compute_ops']} | {counts['syncs']} "
                f"| {statistics.median(times):.3f} |",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
