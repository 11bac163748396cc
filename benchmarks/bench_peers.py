"""Benchmark: pml-suprank side by side with its peers on the same inputs, in one process. Prints one JSON object.

**Evaluation** (every item a query against all the others, itself removed), on ``labelled`` embeddings of
``benchmarks/bench_scale.py`` (``--dim``-d, ~20 items per class, fine labels only):

* ours: ``RetrievalEvaluator().evaluate`` — the exact full ranking, every metric group (AP, mAP@R, R@k, ...);
* PML: ``AccuracyCalculator(include=("mean_average_precision_at_r", "precision_at_1"), k="max_bin_count")`` with its
  default faiss k-NN (``faiss-cpu``: an exact ``IndexFlatL2`` search of the largest class size);
* torchmetrics: ``RetrievalMAP`` (AP over the full ranking) on the ``N·(N−1)`` (query, item) pairs, only where those
  fit in ``--torchmetrics-max-gb`` (about 13 bytes per pair plus its sort; ``null`` otherwise).

Keys ``eval_<n>_{ours,pml,torchmetrics}_s`` (seconds), ``eval_<n>_mapr_abs_diff`` / ``eval_<n>_p1_abs_diff``
(ours vs PML), ``eval_<n>_ap_abs_diff_torchmetrics`` (our AP vs torchmetrics' mAP), ``mapr_abs_diff`` (the largest).

**Losses**, forward + backward, median of ``--repeats``: ours ``SmoothAPLoss`` / ``SupAPLoss`` vs PML
``SmoothAPLoss`` / ``FastAPLoss`` / ``MultiSimilarityLoss`` at ``B = --batch`` in-batch (``--batch // 4`` classes of 4)
and against a ``--memory``-item reference set (``ref_emb``, about 4 items per class, so a query has a few positives
in it as in a real memory; ``null`` with the reason where a loss refuses it), as
seconds and as multiples of the score matrix alone (``emb @ ref.T`` forward + backward) timed in the same process.

Threads: ``--threads`` for torch, numba and faiss alike (default 1, so that a shared machine affects each peer the
same way). Absolute seconds hold only for the machine and load they were taken on; compare within one run.

    PYTHONPATH=. python benchmarks/bench_peers.py                 # N = 5,000 (with torchmetrics), 20,000, 100,000
    PYTHONPATH=. python benchmarks/bench_peers.py --sizes 20000 --memory 10000
    PYTHONPATH=. python benchmarks/bench_peers.py --dry-run       # tiny sizes (the test runs this)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import _commit, _tag, _warm_up, labelled  # noqa: E402

TORCHMETRICS_BYTES_PER_PAIR = 40  # preds float32 + target bool + indexes int64, and the copies of its sort / split


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
    except ImportError:
        pass


# --------------------------------------------------------------------------------------------------- evaluation
def ours(emb: torch.Tensor, fine: torch.Tensor) -> tuple[float, dict]:
    from pml_suprank.metrics import RetrievalEvaluator

    t0 = time.perf_counter()
    out = RetrievalEvaluator().evaluate(emb, fine)
    return time.perf_counter() - t0, out


def pml(emb: torch.Tensor, fine: torch.Tensor) -> tuple[float, dict]:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(include=("mean_average_precision_at_r", "precision_at_1"), k="max_bin_count",
                              device=torch.device("cpu"))  # fmt: skip
    t0 = time.perf_counter()
    out = calc.get_accuracy(emb, fine)  # reference = query, the query removed from its own neighbours
    return time.perf_counter() - t0, out


def torchmetrics_map(emb: torch.Tensor, fine: torch.Tensor) -> tuple[float, float]:
    from torchmetrics.retrieval import RetrievalMAP

    n = emb.shape[0]
    t0 = time.perf_counter()
    scores = emb @ emb.T
    off = ~torch.eye(n, dtype=torch.bool)
    preds = scores[off]
    target = (fine[:, None] == fine[None, :])[off]
    indexes = torch.arange(n)[:, None].expand(n, n)[off]
    del scores
    value = float(RetrievalMAP()(preds, target, indexes=indexes))
    return time.perf_counter() - t0, value


def evaluation(n: int, dim: int, seed: int, tm_max_gb: float) -> dict:
    emb, labels = labelled(n, dim, seed)
    fine = labels[:, 0].clone()
    tag = _tag(n)
    t_ours, r_ours = ours(emb, fine)
    t_pml, r_pml = pml(emb, fine)
    row = {
        f"eval_{tag}_n": n,
        f"eval_{tag}_ours_s": round(t_ours, 3),
        f"eval_{tag}_pml_s": round(t_pml, 3),
        f"eval_{tag}_pml_over_ours": round(t_pml / t_ours, 3),
        f"eval_{tag}_mapr_ours": r_ours["map_at_r"],
        f"eval_{tag}_mapr_abs_diff": abs(r_ours["map_at_r"] - float(r_pml["mean_average_precision_at_r"])),
        f"eval_{tag}_p1_abs_diff": abs(r_ours["precision_at_1"] - float(r_pml["precision_at_1"])),
        f"eval_{tag}_torchmetrics_s": None,
    }
    if n * (n - 1) * TORCHMETRICS_BYTES_PER_PAIR / 1e9 <= tm_max_gb:
        t_tm, m_tm = torchmetrics_map(emb, fine)
        row[f"eval_{tag}_torchmetrics_s"] = round(t_tm, 3)
        row[f"eval_{tag}_ap_abs_diff_torchmetrics"] = abs(r_ours["ap"] - m_tm)
    else:
        row[f"eval_{tag}_torchmetrics_skipped"] = (
            f"needs ~{n * (n - 1) * TORCHMETRICS_BYTES_PER_PAIR / 1e9:.0f} GB for the N(N-1) pairs "
            f"(> --torchmetrics-max-gb {tm_max_gb})"
        )
    return row


# --------------------------------------------------------------------------------------------------- losses
def loss_table(batch: int, memory: int, dim: int, repeats: int, seed: int) -> dict:
    from pytorch_metric_learning import losses as pml_losses

    from pml_suprank import losses as our_losses

    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch // 4).repeat_interleave(4)
    base = torch.nn.functional.normalize(torch.randn(batch, dim, generator=g), dim=1)
    ref = torch.nn.functional.normalize(torch.randn(memory, dim, generator=g), dim=1)
    ref_labels = torch.randint(0, max(batch // 4, memory // 4), (memory,), generator=g)  # ~4 items per class
    candidates = {
        "ours_SmoothAPLoss": lambda: our_losses.SmoothAPLoss(),
        "ours_SupAPLoss": lambda: our_losses.SupAPLoss(),
        "pml_SmoothAPLoss": lambda: pml_losses.SmoothAPLoss(),
        "pml_FastAPLoss": lambda: pml_losses.FastAPLoss(),
        "pml_MultiSimilarityLoss": lambda: pml_losses.MultiSimilarityLoss(),
    }

    def timed(fn) -> float:
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            emb = base.clone().requires_grad_(True)
            t0 = time.perf_counter()
            fn(emb).backward()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    out: dict = {"loss_batch": batch, "loss_memory": memory}
    floor_batch = timed(lambda e: (e @ e.T).sum())
    floor_memory = timed(lambda e: (e @ ref.T).sum())
    out["loss_floor_batch_s"], out["loss_floor_memory_s"] = floor_batch, floor_memory
    for name, make in candidates.items():
        loss = make()
        s = timed(lambda e, loss=loss: loss(e, labels))
        out[f"loss_{name}_b{batch}_s"] = round(s, 5)
        out[f"loss_{name}_b{batch}_x_matmul"] = round(s / floor_batch, 1)
        try:
            s = timed(lambda e, loss=loss: loss(e, labels, ref_emb=ref, ref_labels=ref_labels))
        except (ValueError, TypeError, NotImplementedError, RuntimeError) as err:  # the peer refuses a reference set
            out[f"loss_{name}_m{memory}_s"] = None
            out[f"loss_{name}_m{memory}_unsupported"] = f"{type(err).__name__}: {str(err)[:120]}"
            continue
        out[f"loss_{name}_m{memory}_s"] = round(s, 5)
        out[f"loss_{name}_m{memory}_x_matmul"] = round(s / floor_memory, 1)
        print(json.dumps({k: v for k, v in out.items() if name in k}), file=sys.stderr)  # noqa: T201 - progress
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20_000, 100_000], help="evaluation N")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--torchmetrics-max-gb", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--memory", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-losses", action="store_true", help="the evaluation part only")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes (seconds): checks that every part runs")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.sizes, args.dim, args.batch, args.memory, args.repeats = [300], 16, 32, 500, 1
    set_threads(args.threads)
    _warm_up()
    result: dict = {
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "threads": args.threads,
        "torch": torch.__version__,
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "dry_run": args.dry_run,
    }
    try:
        import faiss
        import pytorch_metric_learning
        import torchmetrics

        result["versions"] = {"pytorch_metric_learning": pytorch_metric_learning.__version__,
                              "faiss": faiss.__version__, "torchmetrics": torchmetrics.__version__}  # fmt: skip
    except ImportError as e:
        raise SystemExit(f"bench_peers needs pytorch-metric-learning, faiss-cpu and torchmetrics: {e}") from None
    diffs = []
    for n in args.sizes:
        row = evaluation(n, args.dim, args.seed, args.torchmetrics_max_gb)
        print(json.dumps(row), file=sys.stderr)  # noqa: T201 - progress
        diffs.append(row[f"eval_{_tag(n)}_mapr_abs_diff"])
        result.update(row)
    result["mapr_abs_diff"] = max(diffs)
    if not args.no_losses:
        result.update(loss_table(args.batch, args.memory, args.dim, args.repeats, args.seed))
    print(json.dumps(result))  # noqa: T201 - the benchmark's output
    return result


if __name__ == "__main__":
    main()
