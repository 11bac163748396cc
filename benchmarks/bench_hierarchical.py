"""Benchmark of the hierarchical rank losses (HAPPIER = 0.9·Sup-H-AP + 0.1·ClusterLoss, Sup-NDCG) against a dense
``B × N × N`` implementation written from the same definitions (what the reference code materialises).

Prints ratios measured in the same process (the machine is shared: absolute times are noisy) and writes JSON.

    python benchmarks/bench_hierarchical.py                 # in-batch B=256 (L=2, 3) + memory case
    python benchmarks/bench_hierarchical.py --quick         # smaller sizes, for a smoke run
    python benchmarks/bench_hierarchical.py --out results.json
    python benchmarks/bench_hierarchical.py --quick --no-compile  # without the torch.compile rows (no compile time)
    python benchmarks/bench_hierarchical.py --large 256x20000,64x60000  # large memories: peak memory, x score matrix

Cases:
* kernels table (issue 13), per available device (CPU, and CUDA when visible), in-batch ``random`` regime, L = 2
  (and 3 without ``--quick``): for SupHAPLoss, HAPPIERLoss and SupNDCGLoss, the naive ``B × N × N`` formulation,
  our kernels ``auto`` (with the kernel it resolves to) / ``dense`` / ``sorted``, and ``dense compiled``
  (``torch.compile(loss, fullgraph=True, dynamic=False)``; compile time printed apart, excluded from the timing,
  which starts after a warm-up). Columns: median time of ``max(--reps, 10)`` fwd+bwd, speed-up vs naive dense,
  top-level aten ops, compute ops (leaf non-view aten ops ≈ kernel launches), host-synchronising ops (profiler,
  see ``_bench_common``), |loss − naive loss|. PML's SmoothAPLoss does not apply (flat AP, 1-D labels): said so;
* in-batch B = 256, 512-d, 4 images per fine class, classes drawn from 2 coarse classes per batch (as PML's
  HierarchicalSampler / the SOP recipe), L = 2 and L = 3 levels; two embedding regimes: ``random`` (untrained
  network: all scores within ±0.2, i.e. every pair inside the sigmoid window) and ``clustered`` (trained-like:
  classes and super-classes separated);
* B = 256 queries with a 4,096-item memory and 3 levels: time and peak extra memory (resident memory of a fresh
  subprocess sampled every millisecond during one forward + backward, minus the resident memory before it).
  The dense implementation would need B·N² ≈ 4.3e9 elements
  (~35 bytes each in the reference, i.e. > 100 GB), so only ours is run;
* ``--large BxN,...`` (issue 19) only: Sup-H-AP / HAPPIER / Sup-NDCG, sorted kernel, against SOP-like memories
  (N / 5 fine classes, 12 super-classes), each row in a fresh process: peak resident-memory growth of one fwd+bwd
  and its time next to the score-matrix fwd+bwd of the same shapes in the same process; ``--block-elements 0,-1``
  compares the default blocks of queries with all queries in one block (the kernel before blocking).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F
from _bench_common import available_devices, compile_loss, device_name, median_time, profile_counts

from pml_suprank import losses
from pml_suprank.ranking import SupRankStep, choose_kernel
from pml_suprank.relevance import level_counts, level_matrix, pop_relevance


# ----------------------------------------------------------------------------- dense B×N×N baselines
def _dense_ranks(emb, labels, ref, ref_labels, *, step, include_self):
    """Scores, levels, valid mask and the level-aware SupRank rank of every item, with every (query, item, item)
    triple materialised: ``rank_i = 1 + Σ_{j≠i} h(s_j − s_i)``, ``h = H⁻`` towards strictly less relevant items,
    Heaviside otherwise (SupRank Eq. 19). Also returns the ``(B, N, N)`` Heaviside and pair mask for ``rank⁺``."""
    same = ref is emb
    cos_emb = F.normalize(emb, dim=1)  # cosine similarity, as the losses' default distance
    scores = cos_emb @ (cos_emb if same else F.normalize(ref, dim=1)).T  # (B, N)
    levels = level_matrix(labels, ref_labels)
    valid = torch.ones_like(levels, dtype=torch.bool)
    if same and not include_self:
        valid = valid & ~torch.eye(levels.shape[0], levels.shape[1], dtype=torch.bool, device=levels.device)
    diff = scores.unsqueeze(1) - scores.unsqueeze(2)  # (B, N, N): s_j − s_i
    n = scores.shape[1]
    pair_ok = valid.unsqueeze(1) & ~torch.eye(n, dtype=torch.bool, device=scores.device).unsqueeze(0)
    heav = (diff.detach() >= 0).to(scores.dtype)
    inferior = levels.unsqueeze(1) < levels.unsqueeze(2)
    h = torch.where(inferior, step.value(diff), heav)
    rank = 1 + (h * pair_ok).sum(-1)
    return scores, levels, valid, rank, heav, pair_ok


def dense_sup_hap(emb, labels, ref, ref_labels, *, alpha=1.0, step=None, include_self=False):
    """Sup-H-AP (SupRank Eq. 20-21) from ``B × N × N`` tensors, as the reference ``quick_forward`` computes it."""
    step = step or SupRankStep()
    scores, levels, valid, rank, heav, pair_ok = _dense_ranks(
        emb, labels, ref, ref_labels, step=step, include_self=include_self
    )
    num_levels = labels.shape[1]
    rel_tab = pop_relevance(level_counts(levels, num_levels, mask=valid), alpha, dtype=scores.dtype)
    rel = torch.gather(rel_tab, 1, levels) * valid
    rank_plus = rel + (heav * torch.minimum(rel.unsqueeze(2), rel.unsqueeze(1)) * pair_ok).sum(-1)
    pos = valid & (levels > 0)
    hap = (torch.where(pos, rank_plus / rank, torch.zeros_like(rank))).sum(1) / rel.sum(1)
    return (1 - hap[pos.any(1)]).mean()


def dense_happier(emb, labels, ref, ref_labels, proxies, *, alpha=1.0, lam=0.1, step=None, include_self=False):
    """HAPPIER = ``(1 − λ)·Sup-H-AP + λ·ClusterLoss`` with every (query, item, item) triple materialised."""
    sup_hap = dense_sup_hap(emb, labels, ref, ref_labels, alpha=alpha, step=step, include_self=include_self)
    cluster = F.cross_entropy(emb @ F.normalize(proxies, dim=-1).T / 0.05, labels[:, 0])
    return (1 - lam) * sup_hap + lam * cluster


def dense_sup_ndcg(emb, labels, ref, ref_labels, *, step=None, include_self=False):
    """Sup-NDCG (SupRank Eq. 24) from ``B × N × N`` tensors: ``1 − DCG_s / iDCG`` with gains ``2^l − 1``, ``DCG_s``
    over the level-aware ranks and ``iDCG`` from the valid items sorted by decreasing level."""
    step = step or SupRankStep()
    scores, levels, valid, rank, _, _ = _dense_ranks(emb, labels, ref, ref_labels, step=step, include_self=include_self)
    gains = (torch.pow(2.0, levels.to(scores.dtype)) - 1.0) * valid
    dcg = (gains / torch.log2(1.0 + rank)).sum(1)
    ideal = torch.sort(gains, dim=1, descending=True).values
    positions = torch.arange(1, ideal.shape[1] + 1, dtype=scores.dtype, device=scores.device)
    idcg = (ideal / torch.log2(1.0 + positions)).sum(1)
    has_pos = (valid & (levels > 0)).any(1)
    return (1 - dcg[has_pos] / idcg[has_pos]).mean()


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


# ----------------------------------------------------------------------------- kernels table (issue 13)
KERNEL_LOSSES = ("SupHAPLoss", "HAPPIERLoss", "SupNDCGLoss")
KERNEL_ROWS = ("naive dense", "auto", "dense", "sorted", "dense compiled")
PML_NOTE = (
    "PML SmoothAPLoss: not applicable (flat binary-relevance AP; it takes 1-D labels and has no hierarchical "
    "relevance, so it computes neither Sup-H-AP, HAPPIER nor Sup-NDCG)"
)


def _kernel_fn(cls_name, kernel, num_fine, dim, proxies):
    """``f(x, labels) -> loss``: our loss with ``kernel=`` (in-batch), or the naive ``B × N × N`` formulation."""
    if kernel == "naive dense":
        if cls_name == "SupHAPLoss":
            return lambda x, labels: dense_sup_hap(x, labels, x, labels)
        if cls_name == "SupNDCGLoss":
            return lambda x, labels: dense_sup_ndcg(x, labels, x, labels)
        return lambda x, labels: dense_happier(x, labels, x, labels, proxies)
    extra = {"num_classes": num_fine, "embedding_size": dim} if cls_name == "HAPPIERLoss" else {}
    fn = getattr(losses, cls_name)(kernel=kernel.removesuffix(" compiled"), **extra)
    if cls_name == "HAPPIERLoss":  # the same proxies as the naive formulation (same loss value)
        fn.decomposability_loss.proxies = proxies
    return lambda x, labels: fn(x, labels)


def _kernel_row(cls_name, kernel, emb, labels, proxies, device, reps):
    """Time, loss value, profiler counts (and compile time) of one (loss, kernel) fwd+bwd on ``emb``."""
    fn = _kernel_fn(cls_name, kernel, int(labels[:, 0].max()) + 1, emb.shape[1], proxies)
    x = emb.clone().requires_grad_(True)

    def step_with(f):
        def step():
            x.grad = None
            proxies.grad = None
            loss = f(x, labels)
            loss.backward()
            return loss

        return step

    row = {"loss": cls_name, "kernel": kernel}
    if kernel.endswith("compiled"):
        try:
            fn, row["compile_s"] = compile_loss(fn, lambda f: step_with(f)(), device)
        except Exception as exc:  # e.g. no C compiler for inductor: reported in the table
            return {**row, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"}
    step = step_with(fn)
    row["value"] = float(step().detach())
    row["time_s"] = median_time(step, device, reps)
    return {**row, **profile_counts(step)}


def kernel_table(device, batch_size, num_levels, dim, reps, compiled=True):
    """Per hierarchical loss, in-batch (``random`` regime): the naive dense formulation, our kernels auto / dense /
    sorted and dense under ``torch.compile(fullgraph=True)``; time, speed-up vs naive dense, top-level aten ops,
    compute ops (≈ launches), host syncs (profiler), compile time apart. Prints a markdown table."""
    emb, labels, num_fine = make_batch(batch_size, num_levels, dim, "random", seed=0)
    emb, labels = emb.to(device), labels.to(device)
    print(f"\ndevice: {device_name(device)} — in-batch B={batch_size} L={num_levels} {dim}-d random")
    print(
        "| loss | kernel | time (ms) | speed-up vs naive dense | top-level aten ops | compute ops (≈ launches) "
        "| host syncs | compile (s) | |Δ loss| vs naive |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    kernels = [k for k in KERNEL_ROWS if compiled or not k.endswith("compiled")]
    for cls_name in KERNEL_LOSSES:
        proxies = torch.nn.Parameter(torch.randn(num_fine, dim, generator=torch.Generator().manual_seed(1)).to(device))
        naive = None
        for kernel in kernels:
            r = _kernel_row(cls_name, kernel, emb, labels, proxies, device, reps)
            r.update(case=f"kernels B={batch_size} L={num_levels}", device=device)
            rows.append(r)
            if "error" in r:
                print(f"| {cls_name} | {kernel} | {r['error']} | | | | | | |", flush=True)
                continue
            naive = naive or r
            picked = choose_kernel("auto", device, batch_size, batch_size, levels=num_levels)
            label = f"auto (→ {picked})" if kernel == "auto" else kernel
            comp = f"{r['compile_s']:.1f}" if "compile_s" in r else "–"
            print(
                f"| {cls_name} | {label} | {r['time_s'] * 1e3:.2f} | {naive['time_s'] / r['time_s']:.2f}× | "
                f"{r['aten_ops']} | {r['compute_ops']} | {r['syncs']} | {comp} | "
                f"{abs(r['value'] - naive['value']):.1e} |",
                flush=True,
            )
    print(PML_NOTE)
    return rows


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


# ----------------------------------------------------------------------------- large memories (issue 19)
LARGE_LOSSES = ("SupHAPLoss", "HAPPIERLoss", "SupNDCGLoss")


def _sop_like(num_items, num_levels, dim, seed, num_fine):
    """SOP-like items: ``num_fine`` fine classes, 12 super-classes (and, with 3 levels, 4 fine classes per middle
    class), random unit embeddings (an untrained network: every score inside the sigmoid window)."""
    g = torch.Generator().manual_seed(seed)
    fine = torch.randint(0, num_fine, (num_items,), generator=g)
    cols = [fine] + ([fine // 4] if num_levels == 3 else []) + [fine % 12]
    return F.normalize(torch.randn(num_items, dim, generator=g), dim=1), torch.stack(cols, 1)


def _peak_run(fn):
    """Time (s) and peak resident-memory growth (MB) of ``fn()``: current RSS sampled every millisecond by a thread
    (after :func:`_mmap_large_blocks`, so that memory freed before ``fn`` is not silently reused by it)."""
    baseline = _rss_mb()
    peak, done = [baseline], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t0
    done.set()
    sampler.join()
    return elapsed, max(peak[0], _rss_mb()) - baseline


def _mmap_large_blocks() -> None:
    """glibc: serve every allocation above 64 KiB by ``mmap`` (``mallopt(M_MMAP_THRESHOLD, 65536)``), so that a freed
    block leaves the resident set at once and the RSS delta measures the peak honestly; no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD = -3
    except (OSError, AttributeError):
        pass


def _large_child(loss_name, batch_size, memory_size, num_levels, dim, block_elements):
    """Fresh process: fwd+bwd of the score matrix, then of ``loss_name`` (sorted kernel) against a memory of
    ``memory_size`` items; ``block_elements``: 0 the default blocks, < 0 all queries in one block (unbounded)."""
    import pml_suprank.ranking.query_blocks as qb

    _mmap_large_blocks()
    if block_elements < 0:
        qb.BLOCK_BYTES_CPU = 1 << 62
    elif block_elements > 0:
        qb.BLOCK_BYTES_CPU = block_elements * qb.BYTES_PER_ELEMENT
    num_fine = max(memory_size // 5, 12)
    mem, mem_labels = _sop_like(memory_size, num_levels, dim, 2, num_fine)
    emb, labels = _sop_like(batch_size, num_levels, dim, 1, num_fine)
    kwargs = {"num_classes": num_fine, "embedding_size": dim} if loss_name == "HAPPIERLoss" else {}
    loss_fn = getattr(losses, loss_name)(kernel="sorted", **kwargs)
    x = emb.clone().requires_grad_(True)
    loss_fn(x[:4], labels[:4], ref_emb=mem[:500], ref_labels=mem_labels[:500]).backward()  # warm-up (lazy inits)
    x.grad = None
    mm_s, mm_mb = _peak_run(lambda: (F.normalize(x, dim=1) @ mem.T).sum().backward())
    loss_s, loss_mb = _peak_run(lambda: loss_fn(x, labels, ref_emb=mem, ref_labels=mem_labels).backward())
    print(json.dumps({"matmul_s": mm_s, "matmul_mb": mm_mb, "loss_s": loss_s, "loss_mb": loss_mb}))


def bench_large(loss_name, batch_size, memory_size, num_levels, dim, threads, block_elements):
    """One row of the large-memory table, measured in a fresh subprocess (``_large_child``)."""
    cmd = [sys.executable, __file__, "--threads", str(threads), "--large-child", loss_name, str(batch_size)]
    cmd += [str(memory_size), str(num_levels), str(dim), str(block_elements)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    res = json.loads(out)
    blocks = "one block" if block_elements < 0 else f"blocks of {block_elements or 'default'}"
    return {
        "case": f"{loss_name} B={batch_size} memory={memory_size} L={num_levels} sorted, {blocks}",
        **res,
        "time_over_matmul": res["loss_s"] / res["matmul_s"],
    }


def large_table(sizes, num_levels, dim, threads, block_elements_list):
    """Peak extra memory and time of the sorted hierarchical losses against large memories."""
    print("\n| case | peak extra (MB) | fwd+bwd (s) | score matrix fwd+bwd (s) | ratio |")
    print("|---|---|---|---|---|")
    rows = []
    for batch_size, memory_size in sizes:
        for loss_name in LARGE_LOSSES:
            for block_elements in block_elements_list:
                r = bench_large(loss_name, batch_size, memory_size, num_levels, dim, threads, block_elements)
                rows.append(r)
                print(
                    f"| {r['case']} | {r['loss_mb']:.0f} | {r['loss_s']:.2f} | {r['matmul_s']:.3f} | "
                    f"{r['time_over_matmul']:.0f}x |",
                    flush=True,
                )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    parser.add_argument("--out", default=None, help="write the results as JSON to this path")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable numbers on a shared CPU)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows of the kernels table")
    parser.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--large-child", nargs=6, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--large",
        default=None,
        help="only the large-memory table: comma-separated BxN sizes, e.g. 256x20000,64x60000 (sorted kernel, "
        "SupHAP / HAPPIER / SupNDCG, peak extra memory and time vs the score matrix, fresh process per row)",
    )
    parser.add_argument("--levels", type=int, default=2, help="levels of the --large table (2 or 3)")
    parser.add_argument(
        "--block-elements",
        default="0,-1",
        help="--large: comma-separated block sizes in (query, list, item) elements (0: the default byte budget; "
        "-1: all queries in one block, "
        "i.e. the unbounded kernel as before blocking)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        b, m, d, regime, _ = args.child
        _memory_child(int(b), int(m), int(d), regime)
        return
    if args.large_child:
        name, b, m, lv, d, be = args.large_child
        _large_child(name, int(b), int(m), int(lv), int(d), int(be))
        return
    if args.large:
        sizes = [tuple(int(v) for v in size.split("x")) for size in args.large.split(",")]
        block_list = [int(v) for v in args.block_elements.split(",")]
        rows = large_table(sizes, args.levels, 512, args.threads, block_list)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"meta": {"torch": torch.__version__, "threads": args.threads}, "results": rows}, f, indent=2)
        return
    batch_size, memory_size, dim = (64, 512, 128) if args.quick else (256, 4096, 512)
    results = []
    for device in available_devices():
        for num_levels in (2,) if args.quick else (2, 3):
            reps = max(args.reps, 10)  # a few ms each: more repetitions for stable medians on a shared machine
            results += kernel_table(device, batch_size, num_levels, dim, reps, compiled=not args.no_compile)
    print()
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
    meta["devices"] = [device_name(d) for d in available_devices()]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
