"""Real-data benchmark: hierarchical vs flat metric-learning losses on Omniglot (character → alphabet), open set.

Every loss trains the same small timm CNN from scratch (``test_resnet`` in a
:class:`~pml_suprank.models.RetrievalModel`, 64-d embeddings, 32×32 images) with the same batches, optimizer,
schedule, number of steps and evaluation; only the loss (and, for PML's triplet / multi-similarity losses, the miner
PML pairs them with) changes. The test split holds the *unseen* half of every alphabet's characters, so the fine
level measures generalisation to new characters and the coarse level whether an unseen character lands next to
its alphabet — the setting where hierarchical rank losses (HAPPIER) should pay off on H-AP / NDCG / ASI.

    python benchmarks/real_hierarchical_retrieval.py                       # 3 seeds, every loss, default steps
    python benchmarks/real_hierarchical_retrieval.py --steps 200 --seeds 0 --losses happier pml_triplet

Protocol (fixed once, before any result was seen; identical for every loss and not tuned on the test split):

* data: ``pml_suprank.data.load_benchmark("omniglot", --data_root, split)``; images decoded once to 32×32 grey
  levels (ink = 1), repeated over 3 channels, scaled to [-1, 1]; training augmentation = random translation by up to
  2 pixels per image;
* batches: :class:`~pml_suprank.samplers.HierarchicalSampler`, 64 images = 2 alphabets × 8 characters × 4 images
  (hierarchical batches: several characters of the same alphabet, so that the coarse level has in-batch positives);
  each batch is sorted by character (PML's SmoothAPLoss needs contiguous, equal-sized classes; the other losses do
  not depend on the order);
* optimizer: Adam, lr 1e-3 for the network (trunk and head), weight decay 1e-4, lr 10 without weight decay for the
  proxies of HAPPIER's ClusterLoss (the reference value), cosine decay to 0 over ``--steps``
  (:func:`pml_suprank.training.build_optimizer` / ``build_scheduler``); the seed fixes the initialisation, the
  batches and the augmentation;
* losses with their published / library defaults: ``happier`` = HAPPIERLoss (α = 1, λ = 0.1, 2-level labels),
  ``roadmap`` = ROADMAPLoss (calibration, λ = 0.1), ``smooth_ap`` = SmoothAPLoss (τ = 0.01), ``sup_ap`` = SupAPLoss;
  PML: ``pml_triplet`` = TripletMarginLoss (margin 0.05) on the triplets of a MultiSimilarityMiner (ε = 0.1), the
  pairing of PML's own mining example; ``pml_multi_similarity`` = MultiSimilarityLoss (2, 50, 0.5) with
  MultiSimilarityMiner (ε = 0.1), as in the MS paper; ``pml_fast_ap`` = FastAPLoss (10 bins);
  ``pml_smooth_ap`` = PML SmoothAPLoss (τ = 0.01). Only HAPPIER sees the alphabet labels;
* evaluation: :class:`~pml_suprank.metrics.RetrievalEvaluator` (exact, full ranking, α = 1) on the whole test split
  (every image a query against all the others): fine AP (``ap_level0``), coarse AP (``ap_level1``), H-AP, NDCG, ASI,
  R@1 (fine). The ``untrained`` row is the randomly initialised network of each seed.

Prints a markdown table of mean ± std over the seeds and writes ``results.json`` under ``--output_dir``. Cost with
``--threads 1``: about 20 s per run of 400 steps on an idle core (the PML SmoothAP loss, B³ memory, a little more);
the defaults (3 seeds × 8 losses) took 17 min on a busy, shared 2-core machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - before torch: spinning OpenMP threads stall a shared CPU

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

METRICS = (
    ("ap_level0", "fine AP"),
    ("ap_level1", "coarse AP"),
    ("h_ap", "H-AP"),
    ("ndcg", "NDCG"),
    ("asi", "ASI"),
    ("recall_at_1", "R@1"),
)


@dataclass(frozen=True)
class Protocol:
    """What every loss shares (documented in the module docstring; not tuned per loss)."""

    image_size: int = 32
    embedding_size: int = 64
    backbone: str = "test_resnet"
    batch_size: int = 64
    samples_per_class: int = 4
    super_classes_per_batch: int = 2
    lr: float = 1e-3
    weight_decay: float = 1e-4
    lr_proxies: float = 10.0
    max_shift: int = 2
    eval_batch_size: int = 256


# ----------------------------------------------------------------------------------------------------------- losses
def _pml():
    from pytorch_metric_learning import losses, miners

    return losses, miners


def _happier(num_classes: int, dim: int):
    from pml_suprank import losses

    return losses.HAPPIERLoss(num_classes=num_classes, embedding_size=dim), None


def _roadmap(num_classes: int, dim: int):
    from pml_suprank import losses

    return losses.ROADMAPLoss(), None


def _smooth_ap(num_classes: int, dim: int):
    from pml_suprank import losses

    return losses.SmoothAPLoss(), None


def _sup_ap(num_classes: int, dim: int):
    from pml_suprank import losses

    return losses.SupAPLoss(), None


def _pml_triplet(num_classes: int, dim: int):
    losses, miners = _pml()
    return losses.TripletMarginLoss(), miners.MultiSimilarityMiner()


def _pml_multi_similarity(num_classes: int, dim: int):
    losses, miners = _pml()
    return losses.MultiSimilarityLoss(), miners.MultiSimilarityMiner()


def _pml_fast_ap(num_classes: int, dim: int):
    losses, _ = _pml()
    return losses.FastAPLoss(), None


def _pml_smooth_ap(num_classes: int, dim: int):
    losses, _ = _pml()
    return losses.SmoothAPLoss(), None


# name → (factory(num_train_characters, embedding_size) -> (loss, miner or None), takes 2-level labels)
LOSSES: dict[str, tuple[Callable, bool]] = {
    "happier": (_happier, True),
    "roadmap": (_roadmap, False),
    "smooth_ap": (_smooth_ap, False),
    "sup_ap": (_sup_ap, False),
    "pml_triplet": (_pml_triplet, False),
    "pml_multi_similarity": (_pml_multi_similarity, False),
    "pml_fast_ap": (_pml_fast_ap, False),
    "pml_smooth_ap": (_pml_smooth_ap, False),
}


# ------------------------------------------------------------------------------------------------------------- data
def load_split(root: str | Path, split: str, image_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Omniglot ``split`` decoded once: images ``(N, 1, S, S)`` float in [0, 1] (ink = 1), labels ``(N, 2)``
    (character, alphabet), relabelled to ``0..C-1`` per level."""
    from PIL import Image

    from pml_suprank.data import load_benchmark

    def decode(img) -> torch.Tensor:
        grey = img.convert("L").resize((image_size, image_size), Image.Resampling.BOX)
        ink = 1.0 - torch.from_numpy(np.asarray(grey, dtype=np.float32)) / 255.0
        return ink.view(1, image_size, image_size)

    ds = load_benchmark("omniglot", root, split, transform=decode)
    images = torch.stack([ds[i]["image"] for i in range(len(ds))])
    labels = torch.stack([torch.unique(col, return_inverse=True)[1] for col in ds.labels.T], 1)
    return images, labels


def to_input(grey: torch.Tensor) -> torch.Tensor:
    """``(B, 1, S, S)`` ink in [0, 1] → network input ``(B, 3, S, S)`` in [-1, 1]."""
    return (grey * 2.0 - 1.0).expand(-1, 3, -1, -1)


def random_shift(grey: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate every image of ``(B, 1, S, S)`` by its own random offset in ``[-max_shift, max_shift]²``."""
    if max_shift == 0:
        return grey
    size = grey.shape[-1]
    padded = torch.nn.functional.pad(grey, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (grey.shape[0], 2), generator=generator).tolist()
    return torch.stack([padded[i, :, y : y + size, x : x + size] for i, (y, x) in enumerate(offsets)])


# ------------------------------------------------------------------------------------------------------------- runs
def build_model(protocol: Protocol, seed: int):
    from pml_suprank.models import RetrievalModel

    torch.manual_seed(seed)
    return RetrievalModel(protocol.backbone, embedding_size=protocol.embedding_size, image_size=protocol.image_size)


@torch.no_grad()
def evaluate(model, images: torch.Tensor, labels: torch.Tensor, protocol: Protocol) -> dict[str, float]:
    """The reported metrics of ``model`` on a whole split (every image queried against all the others)."""
    from pml_suprank.metrics import RetrievalEvaluator

    model.eval()
    chunks = [
        model(to_input(images[i : i + protocol.eval_batch_size]))
        for i in range(0, len(images), protocol.eval_batch_size)
    ]
    out = RetrievalEvaluator(k_values=(1,), metrics=("ap_level", "h_ap", "ndcg", "asi", "recall_at_k")).evaluate(
        torch.cat(chunks), labels
    )
    return {key: float(out[key]) for key, _ in METRICS}


def train(
    loss_name: str,
    seed: int,
    steps: int,
    train_data: tuple[torch.Tensor, torch.Tensor],
    protocol: Protocol,
):
    """Train a fresh model with ``loss_name`` for ``steps`` steps; returns the model and the last training loss."""
    factory, hierarchical = LOSSES[loss_name]
    return train_loss(factory, hierarchical, seed, steps, train_data, protocol)


def train_loss(
    factory: Callable,
    hierarchical: bool,
    seed: int,
    steps: int,
    train_data: tuple[torch.Tensor, torch.Tensor],
    protocol: Protocol,
):
    """Train a fresh model with the loss of ``factory(num_classes, embedding_size) -> (loss, miner or None)``
    (given ``(N, 2)`` labels when ``hierarchical``, else the fine column) for ``steps`` steps under ``protocol``;
    returns the model and the last training loss."""
    from pml_suprank.samplers import HierarchicalSampler
    from pml_suprank.training import TrainingConfig, build_optimizer, build_scheduler

    images, labels = train_data
    model = build_model(protocol, seed)
    torch.manual_seed(seed)
    loss_fn, miner = factory(int(labels[:, 0].max()) + 1, protocol.embedding_size)
    config = TrainingConfig(
        optimizer="adam",
        lr_backbone=protocol.lr,
        lr_head=protocol.lr,
        lr_proxies=protocol.lr_proxies,
        weight_decay=protocol.weight_decay,
        proxies_weight_decay=0.0,
        seed=seed,
    )
    optimizer = build_optimizer(model, loss_fn, config)
    scheduler = build_scheduler(optimizer, steps, config)
    sampler = HierarchicalSampler(
        labels,
        batch_size=protocol.batch_size,
        samples_per_class=protocol.samples_per_class,
        super_classes_per_batch=protocol.super_classes_per_batch,
        batches_per_super_tuple=1,
        seed=seed,
    )
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
            idx = idx[torch.sort(labels[idx, 0], stable=True).indices]  # contiguous classes (PML SmoothAP)
            y = labels[idx] if hierarchical else labels[idx, 0]
            emb = model(to_input(random_shift(images[idx], protocol.max_shift, generator)))
            loss = loss_fn(emb, y, miner(emb, y)) if miner is not None else loss_fn(emb, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            last = float(loss.detach())
            step += 1
        epoch += 1
    return model, last


def run_benchmark(
    train_data: tuple[torch.Tensor, torch.Tensor],
    test_data: tuple[torch.Tensor, torch.Tensor],
    loss_names: Sequence[str],
    seeds: Sequence[int],
    steps: int,
    protocol: Protocol = Protocol(),
    log: Callable[[str], None] = print,
) -> list[dict]:
    """One record per (loss, seed): metrics on ``test_data``, final training loss and wall time (plus an
    ``untrained`` record per seed)."""
    unknown = [n for n in loss_names if n not in LOSSES]
    if unknown:
        raise ValueError(f"losses must be among {sorted(LOSSES)}; got {unknown}")
    records = []
    for seed in seeds:
        start = time.perf_counter()
        metrics = evaluate(build_model(protocol, seed), *test_data, protocol)
        records.append({"loss": "untrained", "seed": seed, "steps": 0, "wall_s": time.perf_counter() - start,
                        "final_train_loss": None, **metrics})  # fmt: skip
        for name in loss_names:
            start = time.perf_counter()
            model, last = train(name, seed, steps, train_data, protocol)
            metrics = evaluate(model, *test_data, protocol)
            wall = time.perf_counter() - start
            records.append({"loss": name, "seed": seed, "steps": steps, "wall_s": wall, "final_train_loss": last,
                            **metrics})  # fmt: skip
            log(f"seed {seed} {name:22s} {wall:6.1f} s  loss {last:.4f}  "
                + "  ".join(f"{label} {100 * metrics[key]:.2f}" for key, label in METRICS))  # fmt: skip
    return records


def summarize(records: list[dict]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{loss: {metric or "wall_s": (mean, std)}}`` over the seeds (std 0 for a single seed)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name in dict.fromkeys(r["loss"] for r in records):
        rows = [r for r in records if r["loss"] == name]
        out[name] = {}
        for key in [k for k, _ in METRICS] + ["wall_s"]:
            values = [r[key] for r in rows]
            out[name][key] = (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0)
    return out


def markdown_table(summary: dict[str, dict[str, tuple[float, float]]]) -> str:
    """Mean ± std (in %) of every metric per loss, and the mean wall time per run."""
    head = "| loss | " + " | ".join(label for _, label in METRICS) + " | s / run |"
    lines = [head, "|---" * (len(METRICS) + 2) + "|"]
    for name, stats in summary.items():
        cells = [f"{100 * stats[k][0]:.2f} ± {100 * stats[k][1]:.2f}" for k, _ in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {stats['wall_s'][0]:.0f} |")
    return "\n".join(lines)


def benchmark_parser(description: str, losses: Sequence[str], steps: int, output_dir: str) -> argparse.ArgumentParser:
    """The options every Omniglot benchmark script shares (data, seeds, steps, losses, threads, output folder)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data_root", default=str(REPO_ROOT.parent / "shared" / "data" / "omniglot_small"),
                        help="folder with the Omniglot images_background*.zip archives")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed and loss")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps per run (same for every loss)")
    parser.add_argument("--losses", nargs="+", default=list(losses), choices=list(losses), help="losses to train")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--output_dir", default=output_dir, help="results.json goes here")
    return parser


def checked_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with ``--steps`` and ``--threads`` checked (>= 1)."""
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1; got {args.steps}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1; got {args.threads}")
    return args


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__.split("\n\n")[0], list(LOSSES), 400, "outputs/real_hierarchical_retrieval")
    return checked_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    protocol = Protocol()
    start = time.perf_counter()
    train_data = load_split(args.data_root, "train", protocol.image_size)
    test_data = load_split(args.data_root, "test", protocol.image_size)
    print(f"omniglot: train {len(train_data[0])} images / {int(train_data[1][:, 0].max()) + 1} characters, "
          f"test {len(test_data[0])} / {int(test_data[1][:, 0].max()) + 1}, decoded in "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    records = run_benchmark(train_data, test_data, args.losses, args.seeds, args.steps, protocol)
    summary = summarize(records)
    table = markdown_table(summary)
    total = time.perf_counter() - start
    print(f"\nOmniglot open set, {len(args.seeds)} seeds, {args.steps} steps, {args.threads} thread(s), "
          f"total {total:.0f} s (metrics in %, mean ± std over seeds)\n")  # fmt: skip
    print(table)
    result = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "protocol": asdict(protocol),
        "torch_threads": torch.get_num_threads(),
        "total_wall_s": total,
        "records": records,
        "summary": {name: {k: {"mean": m, "std": s} for k, (m, s) in stats.items()} for name, stats in summary.items()},
        "table": table,
    }
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out / 'results.json'}")
    return result


if __name__ == "__main__":
    main()
