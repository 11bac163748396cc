"""Which loss should I use? Our rank losses against PML's baselines on real images, at an equal budget.

Omniglot (character → alphabet), **whole alphabets held out**: the 8 alphabets of ``../shared/data/omniglot_small``
sorted by name are split 3 / 2 / 3 into training, validation and test alphabets. Every loss trains the same small
timm CNN from scratch with the same images, sampler, augmentation, optimizer, schedule and number of steps as
``benchmarks/real_hierarchical_retrieval.py`` (its :class:`Protocol`, data decoding and evaluation are reused);
only the loss, its main hyper-parameter and the learning rate change.

1. **Selection** (seed 0): every loss trains on the training alphabets with each point of its grid (learning rate ×
   its main hyper-parameter) and is evaluated on the validation alphabets; the point with the best validation H-AP
   (``--select``; ties broken by fine AP) is kept.
2. **Test** (``--seeds``): every loss trains on training + validation alphabets with its selected point and is
   evaluated on the test alphabets (unseen characters of unseen alphabets: every image a query against all others).

Reported: fine AP, H-AP, NDCG, ASI, R@1 (mean ± std over seeds) and the training time per step, as a markdown
table, with the selected grid points; ``results.json`` under ``--output_dir`` holds every run.

    python benchmarks/compare_losses.py                          # the full comparison (about 1 h on one core)
    python benchmarks/compare_losses.py --steps 60 --seeds 0 --losses happier pml_contrastive   # a quick look
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - before torch: spinning OpenMP threads stall a shared CPU

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO_ROOT))


def _sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


RHR = _sibling("real_hierarchical_retrieval")
Protocol = RHR.Protocol

#: reported metrics (key, column label)
METRICS = (("ap_level0", "fine AP"), ("h_ap", "H-AP"), ("ndcg", "NDCG"), ("asi", "ASI"), ("recall_at_1", "R@1"))


@dataclass(frozen=True)
class Candidate:
    """A loss of the comparison: how to build it, whether it sees the alphabet level, and its grid."""

    build: Callable[[int, int, Any], tuple[Any, Any]]  # (num_classes, dim, hyper-parameter) -> (loss, miner)
    hierarchical: bool
    param: str  # name of the main hyper-parameter
    values: tuple[Any, ...]  # its grid
    ours: bool
    lrs: tuple[float, ...] = (1e-3, 3e-3)
    proxy_lr_factor: float | None = None  # proxies' learning rate = factor x lr (None: the protocol's lr_proxies)
    notes: str = ""


def _pml(name: str, param: str, miner: bool = False, proxies: bool = False, **fixed: Any) -> Callable:
    def build(num_classes: int, dim: int, value: Any) -> tuple[Any, Any]:
        from pytorch_metric_learning import losses, miners

        kwargs = {**fixed, param: value}
        if proxies:
            kwargs.update(num_classes=num_classes, embedding_size=dim)
        return getattr(losses, name)(**kwargs), (miners.MultiSimilarityMiner() if miner else None)

    return build


def candidates() -> dict[str, Candidate]:
    """The losses compared, with their main hyper-parameter grids (published defaults included)."""
    ours = {
        "smooth_ap": ("SmoothAPLoss", False, "temperature", (0.01, 0.05)),
        "sup_ap": ("SupAPLoss", False, "tau", (0.01, 0.05)),
        "roadmap": ("ROADMAPLoss", False, "decomposability_weight", (0.1, 0.5)),
        "sup_recall": ("SupRecallLoss", False, "temperature", (0.5, 1.0)),
        "sup_hap": ("SupHAPLoss", True, "tau", (0.01, 0.05)),
        "happier": ("HAPPIERLoss", True, "decomposability_weight", (0.1, 0.5)),
        "sup_ndcg": ("SupNDCGLoss", True, "tau", (0.01, 0.05)),
        "rod_ndcg": ("RODNDCGLoss", True, "decomposability_weight", (0.1, 0.5)),
    }
    out = {
        key: Candidate(build=_param_builder(cls, param), hierarchical=hier, param=param, values=values, ours=True)
        for key, (cls, hier, param, values) in ours.items()
    }
    out.update(
        pml_contrastive=Candidate(_pml("ContrastiveLoss", "neg_margin", pos_margin=0.0), False, "neg_margin",
                                  (0.5, 1.0), ours=False),
        pml_multi_similarity=Candidate(_pml("MultiSimilarityLoss", "base", miner=True), False, "base", (0.5, 0.8),
                                       ours=False, notes="with MultiSimilarityMiner"),
        pml_fast_ap=Candidate(_pml("FastAPLoss", "num_bins"), False, "num_bins", (10, 20), ours=False),
        pml_smooth_ap=Candidate(_pml("SmoothAPLoss", "temperature"), False, "temperature", (0.01, 0.05), ours=False),
        pml_arcface=Candidate(_pml("ArcFaceLoss", "margin", proxies=True), False, "margin", (28.6, 40.0), ours=False,
                              proxy_lr_factor=10.0),
        pml_proxy_anchor=Candidate(_pml("ProxyAnchorLoss", "alpha", proxies=True), False, "alpha", (16, 32),
                                   ours=False, proxy_lr_factor=100.0),
    )  # fmt: skip
    return out


def _param_builder(cls_name: str, param: str) -> Callable:
    def build(num_classes: int, dim: int, value: Any) -> tuple[Any, Any]:
        import inspect

        from pml_suprank import losses

        cls = getattr(losses, cls_name)
        kwargs = {param: value}
        if "num_classes" in inspect.signature(cls.__init__).parameters:
            kwargs.update(num_classes=num_classes, embedding_size=dim)
        return cls(**kwargs), None

    return build


# ------------------------------------------------------------------------------------------------------------- data
def load_alphabet_splits(root: str | Path, protocol: Protocol, split_sizes: Sequence[int] = (3, 2, 3)) -> dict:
    """The Omniglot images of every character, split by whole alphabets (sorted by name) into ``train`` / ``val`` /
    ``test`` (``split_sizes`` alphabets each); labels ``(N, 2)`` (character, alphabet) relabelled ``0..C-1`` per
    split. Also ``"train+val"`` (the training set of the test runs)."""
    parts = [RHR.load_split(root, split, protocol.image_size) for split in ("train", "test")]
    alphabets = [int(p[1][:, 1].max()) + 1 for p in parts]
    if alphabets[0] != alphabets[1]:
        raise ValueError(f"the Omniglot splits hold different alphabets ({alphabets}); expected the same in both")
    offset = int(parts[0][1][:, 0].max()) + 1
    images = torch.cat([parts[0][0], parts[1][0]])
    labels = torch.cat([parts[0][1], parts[1][1] + torch.tensor([offset, 0])])
    if sum(split_sizes) != alphabets[0]:
        raise ValueError(f"split_sizes must add up to the {alphabets[0]} alphabets; got {list(split_sizes)}")
    bounds = list(itertools.accumulate(split_sizes, initial=0))
    out = {}
    for name, (lo, hi) in zip(("train", "val", "test"), itertools.pairwise(bounds)):
        out[name] = _subset(images, labels, (labels[:, 1] >= lo) & (labels[:, 1] < hi))
    out["train+val"] = _subset(images, labels, labels[:, 1] < bounds[2])
    return out


def _subset(images: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    sub = labels[keep]
    return images[keep], torch.stack([torch.unique(col, return_inverse=True)[1] for col in sub.T], 1)


# ------------------------------------------------------------------------------------------------------------- runs
def one_run(name: str, value: Any, lr: float, seed: int, steps: int, train_data, eval_data, protocol) -> dict:
    """Train ``name`` with its hyper-parameter at ``value`` and learning rate ``lr``; evaluate on ``eval_data``."""
    cand = candidates()[name]
    lr_proxies = protocol.lr_proxies if cand.proxy_lr_factor is None else cand.proxy_lr_factor * lr
    run_protocol = replace(protocol, lr=lr, lr_proxies=lr_proxies)
    start = time.perf_counter()
    model, last = RHR.train_loss(
        lambda c, d: cand.build(c, d, value), cand.hierarchical, seed, steps, train_data, run_protocol
    )
    train_s = time.perf_counter() - start
    metrics = RHR.evaluate(model, *eval_data, run_protocol)
    return {"loss": name, cand.param: value, "lr": lr, "seed": seed, "steps": steps, "final_train_loss": last,
            "ms_per_step": 1000.0 * train_s / steps, **{k: metrics[k] for k, _ in METRICS}}  # fmt: skip


def select(name: str, splits: dict, steps: int, protocol, metric: str, log: Callable[[str], None]) -> dict:
    """The grid point of ``name`` with the best validation ``metric`` (seed 0); every point's record is kept."""
    cand = candidates()[name]
    records = []
    for value, lr in itertools.product(cand.values, cand.lrs):
        rec = one_run(name, value, lr, 0, steps, splits["train"], splits["val"], protocol)
        records.append(rec)
        log(f"  val {name:22s} {cand.param}={value!s:6} lr={lr:g}: " + _fmt_metrics(rec))
    best = max(records, key=lambda r: (r[metric], r["ap_level0"]))
    return {"param": cand.param, "value": best[cand.param], "lr": best["lr"], "grid": records}


def _fmt_metrics(rec: dict) -> str:
    return "  ".join(f"{label} {100 * rec[key]:.2f}" for key, label in METRICS)


def summarize(records: list[dict]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{loss: {metric or "ms_per_step": (mean, std)}}`` over the seeds (std 0 for one seed)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name in dict.fromkeys(r["loss"] for r in records):
        rows = [r for r in records if r["loss"] == name]
        out[name] = {}
        for key in [k for k, _ in METRICS] + ["ms_per_step"]:
            values = [float(r[key]) for r in rows]
            out[name][key] = (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0)
    return out


def markdown_table(summary: dict, chosen: dict[str, dict]) -> str:
    """Mean ± std (percent) per loss, its selected grid point and its time per step."""
    head = "| loss | library | selected | " + " | ".join(label for _, label in METRICS) + " | ms / step |"
    lines = [head, "|---" * (len(METRICS) + 4) + "|"]
    cands = candidates()
    for name, stats in sorted(summary.items(), key=lambda kv: -kv[1]["h_ap"][0]):
        pick = chosen[name]
        cells = [f"{100 * stats[k][0]:.2f} ± {100 * stats[k][1]:.2f}" for k, _ in METRICS]
        lib = "pml-suprank" if cands[name].ours else "PML"
        lines.append(f"| {name} | {lib} | {pick['param']}={pick['value']}, lr={pick['lr']:g} | " + " | ".join(cells)
                     + f" | {stats['ms_per_step'][0]:.0f} |")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = RHR.benchmark_parser(__doc__.split("\n\n")[0], list(candidates()), 200, "outputs/compare_losses")
    parser.add_argument("--select", default="h_ap", choices=[k for k, _ in METRICS], help="validation metric")
    return RHR.checked_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    protocol = Protocol()
    start = time.perf_counter()
    splits = load_alphabet_splits(args.data_root, protocol)
    print("omniglot by alphabet: " + ", ".join(
        f"{k} {len(v[0])} images / {int(v[1][:, 0].max()) + 1} characters / {int(v[1][:, 1].max()) + 1} alphabets"
        for k, v in splits.items() if k != "train+val"), flush=True)  # fmt: skip
    chosen, records = {}, []
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.losses:
        chosen[name] = select(name, splits, args.steps, protocol, args.select, print)
        for seed in args.seeds:
            rec = one_run(name, chosen[name]["value"], chosen[name]["lr"], seed, args.steps, splits["train+val"],
                          splits["test"], protocol)  # fmt: skip
            records.append(rec)
            print(f"test {name:22s} seed {seed}: {_fmt_metrics(rec)}  {rec['ms_per_step']:.0f} ms/step", flush=True)
        partial = {"args": vars(args), "chosen": chosen, "records": records}
        (out / "results.json").write_text(json.dumps(partial, indent=1))  # a long run keeps what it has
    summary = summarize(records)
    table = markdown_table(summary, chosen)
    total = time.perf_counter() - start
    print(
        f"\nOmniglot, whole alphabets held out, {len(args.seeds)} seeds x {args.steps} steps, {args.threads} "
        f"thread(s), torch {torch.__version__}, total {total:.0f} s (metrics in %, mean ± std over seeds)\n"
    )
    print(table)
    result = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "protocol": asdict(protocol),
        "torch": torch.__version__,
        "total_wall_s": total,
        "chosen": chosen,
        "records": records,
        "summary": {name: {k: {"mean": m, "std": s} for k, (m, s) in stats.items()} for name, stats in summary.items()},
        "table": table,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out / 'results.json'}")
    return result


if __name__ == "__main__":
    main()
