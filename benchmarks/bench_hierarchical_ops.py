"""Launch and host-read budget of the rank losses against a memory: aten compute ops, host reads, peak extra memory
and time next to the bare score-matrix fwd+bwd, for the flat and the hierarchical losses (sorted kernel).

Each row runs in a fresh process: a small warm-up call, then one fwd+bwd sampled for peak resident memory, the score
matrix ``normalize(x) @ memory.T`` fwd+bwd and the loss fwd+bwd timed in the same process (median of ``--reps``;
the ratio is what to compare across machines), and one fwd+bwd under ``torch.profiler`` for the counts
(``_bench_common.profile_counts``: compute ops = leaf aten ops that are not views, ≈ kernel launches on a GPU;
host reads = synchronising aten ops + ``.tolist()``). Inputs as ``../shared/gpu/gpu_check.py``: random unit
embeddings (an untrained network), 4 queries per fine class, every query with positives in the memory, 8 fine
classes per coarse class (with 3 levels: 4 per middle class, 32 per coarse class).

    python benchmarks/bench_hierarchical_ops.py --quick            # B=32 vs 2,048: a smoke run (seconds)
    python benchmarks/bench_hierarchical_ops.py                    # B=256 vs 4,096 and 60,000, L = 2 and 3
    python benchmarks/bench_hierarchical_ops.py --sizes 256x60000 --levels 2 --losses SupHAPLoss
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import resource
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F
from _bench_common import median_time, profile_counts

FLAT = ("SupAPLoss", "SmoothAPLoss")
HIERARCHICAL = ("SupHAPLoss", "HAPPIERLoss", "SupNDCGLoss")


def make_inputs(batch_size: int, num_refs: int, num_levels: int, dim: int, seed: int = 0):
    """Query and memory embeddings and labels (``num_levels`` = 1: flat fine labels)."""
    g = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(batch_size, dim, generator=g), dim=1)
    fine = torch.arange(batch_size) // 4
    ref = F.normalize(torch.randn(num_refs, dim, generator=g), dim=1)
    ref_fine = torch.randint(0, max(num_refs // 8, batch_size // 4), (num_refs,), generator=g)
    ref_fine[:batch_size] = fine  # every query has positives in the memory
    if num_levels == 1:
        return emb, fine, ref, ref_fine

    def table(f):
        middle = [f // 4] if num_levels == 3 else []
        return torch.stack([f, *middle, f // (32 if num_levels == 3 else 8)], 1)

    return emb, table(fine), ref, table(ref_fine)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb(fn) -> float:
    """Peak resident-memory growth (MB) during ``fn()`` (RSS sampled every millisecond by a thread)."""
    try:  # glibc: large blocks by mmap, so that freed memory leaves the resident set at once
        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)
    except (OSError, AttributeError):
        pass
    base, peak, done = _rss_mb(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    fn()
    done.set()
    thread.join()
    return max(peak[0], _rss_mb()) - base


def child(loss_name: str, batch_size: int, num_refs: int, num_levels: int, dim: int, reps: int) -> dict:
    from pml_suprank import losses

    hier = loss_name in HIERARCHICAL
    emb, labels, ref, ref_labels = make_inputs(batch_size, num_refs, num_levels if hier else 1, dim)
    kwargs = {"num_classes": int(labels.max()) + 1, "embedding_size": dim} if loss_name == "HAPPIERLoss" else {}
    loss_fn = getattr(losses, loss_name)(kernel="sorted", **kwargs)
    x = emb.clone().requires_grad_(True)

    def step():
        x.grad = None
        loss_fn(x, labels, ref_emb=ref, ref_labels=ref_labels).backward()

    def matmul():
        x.grad = None
        (F.normalize(x, dim=1) @ ref.T).sum().backward()

    loss_fn(x[:4], labels[:4], ref_emb=ref[:500], ref_labels=ref_labels[:500]).backward()  # lazy initialisations
    t0 = time.perf_counter()
    peak = _peak_mb(step)
    first_s = time.perf_counter() - t0
    mm_s = median_time(matmul, "cpu", max(reps, 20))
    loss_s = median_time(step, "cpu", reps) if reps > 0 else first_s  # --reps 0: the sampled call's time
    counts = profile_counts(step, warm_up=False)
    return {
        "loss": loss_name,
        "B": batch_size,
        "N": num_refs,
        "levels": num_levels if hier else 1,
        "compute_ops": counts["compute_ops"],
        "host_reads": counts["syncs"],
        "peak_extra_mb": round(peak, 1),
        "loss_s": loss_s,
        "matmul_s": mm_s,
        "ratio": loss_s / mm_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="B=32 vs 2,048 only (smoke run)")
    parser.add_argument("--sizes", default="256x4096,256x60000", help="comma-separated BxN")
    parser.add_argument("--levels", default="2,3", help="comma-separated levels of the hierarchical losses")
    parser.add_argument("--losses", default=",".join(FLAT + HIERARCHICAL))
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument(
        "--reps", type=int, default=1, help="timed fwd+bwd per row (median); 0: time the memory-sampled call"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the rows as JSON")
    parser.add_argument("--child", nargs=6, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        name, b, n, lv, d, reps = args.child
        print(json.dumps(child(name, int(b), int(n), int(lv), int(d), int(reps))))
        return
    sizes = [(32, 2048)] if args.quick else [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    level_list = [int(v) for v in args.levels.split(",")]
    print(f"# torch {torch.__version__}, cpu ({platform.processor() or platform.machine()}, {args.threads} threads)")
    print("| loss | B | N | levels | compute ops | host reads | peak extra (MB) | fwd+bwd (s) | × score matrix |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for batch_size, num_refs in sizes:
        for name in args.losses.split(","):
            for num_levels in level_list if name in HIERARCHICAL else [1]:
                cmd = [sys.executable, __file__, "--threads", str(args.threads), "--child", name, str(batch_size)]
                cmd += [str(num_refs), str(num_levels), str(args.dim), str(args.reps)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
                r = json.loads(out[-1])
                rows.append(r)
                print(
                    f"| {r['loss']} | {r['B']} | {r['N']} | {r['levels']} | {r['compute_ops']} | {r['host_reads']} | "
                    f"{r['peak_extra_mb']:.0f} | {r['loss_s']:.2f} | {r['ratio']:.0f}× |",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
