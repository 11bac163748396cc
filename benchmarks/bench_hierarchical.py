"""Benchmark of the hierarchical rank losses (HAPPIER = 0.9·Sup-H-AP + 0.1·ClusterLoss, Sup-NDCG) against a dense
``B × N × N`` implementation written from the same definitions (what the reference code materialises).

Prints ratios measured in the same process (the machine is shared: absolute times are noisy) and writes JSON.

    python benchmarks/bench_hierarchical.py                 # in-batch B=256 (L=2, 3) + memory case
    python benchmarks/bench_hierarchical.py --quick         # smaller sizes, for a smoke run
    python benchmarks/bench_hierarchical.py --out results.json

Cases:
* in-batch B = 256, 512-d, 4 images per fine class, classes drawn from 2 coarse classes per batch (as PML's
  HierarchicalSampler / the SOP recipe), L = 2 and L = 3 levels; two embedding regimes: ``random`` (untrained
  network: all scores within ±0.2, i.e. every pair inside the sigmoid window) and ``clustered`` (trained-like:
  classes and super-classes separated);
* B = 256 queries with a 4,096-item memory and 3 levels: time and peak extra memory (resident memory of a fresh
  subprocess sampled every millisecond during one forward + backward, minus the resident memory before it).
  The dense implementation would need B·N² ≈ 4.3e9 elements
  (~35 bytes each in the reference, i.e. > 100 GB), so only ours is run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

from pml_suprank import losses
from pml_suprank.ranking import SupRankStep
from pml_suprank.relevance import level_counts, level_matrix, pop_relevance


# ----------------------------------------------------------------------------- dense B×N×N baseline
def dense_happier(emb, labels, ref, ref_labels, proxies, *, alpha=1.0, lam=0.1, step=None, include_self=False):
    """HAPPIER with every (query, item, item) triple materialised, as the reference ``quick_forward`` does."""
    step = step or SupRankStep()
    num_levels = labels.shape[1]
    same = ref is emb
    cos_emb = F.normalize(emb, dim=1)  # cosine similarity, as the losses' default distance
    scores = cos_emb @ (cos_emb if same else F.normalize(ref, dim=1)).T  # (B, N)
    levels = level_matrix(labels, ref_labels)
    valid = torch.ones_like(levels, dtype=torch.bool)
    if same and not include_self:
        valid = valid & ~torch.eye(levels.shape[0], levels.shape[1], dtype=torch.bool)
    rel_tab = pop_relevance(level_counts(levels, num_levels, mask=valid), alpha, dtype=scores.dtype)
    rel = torch.gather(rel_tab, 1, levels) * valid
    diff = scores.unsqueeze(1) - scores.unsqueeze(2)  # (B, N, N): s_j − s_i
    n = scores.shape[1]
    pair_ok = valid.unsqueeze(1) & ~torch.eye(n, dtype=torch.bool).unsqueeze(0)
    heav = (diff.detach() >= 0).to(scores.dtype)
    inferior = levels.unsqueeze(1) < levels.unsqueeze(2)
    h = torch.where(inferior, step.value(diff), heav)
    rank = 1 + (h * pair_ok).sum(-1)
    rank_plus = rel + (heav * torch.minimum(rel.unsqueeze(2), rel.unsqueeze(1)) * pair_ok).sum(-1)
    pos = valid & (levels > 0)
    hap = (torch.where(pos, rank_plus / rank, torch.zeros_like(rank))).sum(1) / rel.sum(1)
    sup_hap = (1 - hap[pos.any(1)]).mean()
    cluster = F.cross_entropy(emb @ F.normalize(proxies, dim=-1).T / 0.05, labels[:, 0])
    return (1 - lam) * sup_hap + lam * cluster


# ----------------------------------------------------------------------------- data
def make_batch(batch_size, num_levels, dim, regime, seed, per_class=4):
    g = torch.Generator().manual_seed(seed)
    num_fine = batch_size // per_class
    fine = torch.arange(num_fine).repeat_interleave(per_class)
    coarse = (torch.arange(num_fine) >= num_fine // 2).long()  # 2 super-classes per batch
    if num_levels == 2:
        table = torch.stack([torch.arange(num_fine), coarse], 1)
    else:
        middle = torch.arange(num_fine) // 8  # 8 fine classes per middle class
        table = torch.stack([torch.arange(num_fine), middle, coarse], 1)
    labels = table[fine]
    if regime == "random":
        emb = torch.randn(batch_size, dim, generator=g)
    else:  # trained-like: super-class, middle and class centres plus noise
        centres = [torch.randn(int(labels[:, c].max()) + 1, dim, generator=g) for c in range(num_levels)]
        emb = sum(centres[c][labels[:, c]] * (0.6 + 0.4 * c) for c in range(num_levels))
        emb = emb + 1.2 * torch.randn(batch_size, dim, generator=g)
    return F.normalize(emb, dim=1), labels, num_fine


def timeit(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_in_batch(batch_size, num_levels, regime, dim, reps):
    emb, labels, num_fine = make_batch(batch_size, num_levels, dim, regime, seed=0)
    ours = losses.HAPPIERLoss(num_classes=num_fine, embedding_size=dim)
    proxies = ours.decomposability_loss.proxies

    def run_ours():
        x = emb.clone().requires_grad_(True)
        ours(x, labels).backward()
        return x.grad

    def run_dense():
        x = emb.clone().requires_grad_(True)
        dense_happier(x, labels, x, labels, proxies).backward()
        return x.grad

    def run_matmul():
        x = emb.clone().requires_grad_(True)
        (x @ x.T).sum().backward()

    g_ours, g_dense = run_ours(), run_dense()
    max_grad_diff = float((g_ours - g_dense).abs().max())
    t_ours, t_dense, t_mm = timeit(run_ours, reps), timeit(run_dense, reps), timeit(run_matmul, reps)
    return {
        "case": f"HAPPIER in-batch B={batch_size} L={num_levels} {regime}",
        "ours_s": t_ours,
        "dense_s": t_dense,
        "speedup_vs_dense": t_dense / t_ours,
        "ours_over_matmul": t_ours / t_mm,
        "max_abs_grad_diff_vs_dense": max_grad_diff,
    }


def _memory_child(batch_size, memory_size, dim, regime):
    """Run in a fresh process: one forward + backward with a memory; print JSON with time and max-RSS growth."""
    torch.manual_seed(0)
    emb, labels, num_fine = make_batch(batch_size, 3, dim, regime, seed=1)
    mem, mem_labels, _ = make_batch(memory_size, 3, dim, regime, seed=2)
    mem_labels = mem_labels.clone()
    mem_labels[:, 0] = mem_labels[:, 0] % num_fine  # memory items share the batch's classes
    table = torch.unique(labels, dim=0)
    mem_labels = table[mem_labels[:, 0]]
    loss_fn = losses.HAPPIERLoss(num_classes=num_fine, embedding_size=dim)
    x = emb.clone().requires_grad_(True)
    baseline = _rss_mb()
    peak = [baseline]
    done = threading.Event()

    def sample():  # current RSS every millisecond (max RSS of the process would include earlier peaks)
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    loss_fn(x, labels, ref_emb=mem, ref_labels=mem_labels).backward()
    elapsed = time.perf_counter() - t0
    done.set()
    sampler.join()
    peak_mb = max(peak[0], _rss_mb())
    print(json.dumps({"time_s": elapsed, "peak_extra_mb": peak_mb - baseline}))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def bench_memory(batch_size, memory_size, dim, regime, threads):
    cmd = [sys.executable, __file__, "--threads", str(threads), "--child", str(batch_size), str(memory_size)]
    cmd += [str(dim), regime, "x"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    res = json.loads(out)
    dense_bytes = 35 * batch_size * memory_size**2  # reference: ~35 bytes per B·N² element (spec §6)
    return {
        "case": f"HAPPIER B={batch_size} memory={memory_size} L=3 {regime}",
        "ours_s": res["time_s"],
        "peak_extra_mb": res["peak_extra_mb"],
        "dense_reference_estimate_gb": dense_bytes / 1e9,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    parser.add_argument("--out", default=None, help="write the results as JSON to this path")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable numbers on a shared CPU)")
    parser.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        b, m, d, regime, _ = args.child
        _memory_child(int(b), int(m), int(d), regime)
        return
    batch_size, memory_size, dim = (64, 512, 128) if args.quick else (256, 4096, 512)
    results = []
    for regime in ("random", "clustered"):
        for num_levels in (2, 3):
            r = bench_in_batch(batch_size, num_levels, regime, dim, args.reps)
            results.append(r)
            print(
                f"{r['case']:<42} ours {r['ours_s'] * 1e3:8.1f} ms  dense {r['dense_s'] * 1e3:8.1f} ms  "
                f"speed-up x{r['speedup_vs_dense']:.1f}  ours/matmul {r['ours_over_matmul']:.1f}  "
                f"|grad diff| {r['max_abs_grad_diff_vs_dense']:.1e}"
            )
    for regime in ("random", "clustered"):
        r = bench_memory(batch_size, memory_size, dim, regime, args.threads)
        results.append(r)
        print(
            f"{r['case']:<42} ours {r['ours_s']:.2f} s  peak extra memory {r['peak_extra_mb']:.0f} MB  "
            f"(dense reference would need ~{r['dense_reference_estimate_gb']:.0f} GB)"
        )
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "quick": args.quick}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
