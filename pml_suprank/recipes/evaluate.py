########################################################################
# Evaluate a trained retrieval model (a folder written by train_*.py / save_pretrained, or a Hub repo id) on a
# retrieval dataset: exact metrics over the whole gallery (AP, mAP@R, R@k, H-AP, NDCG, ASI, AP per level) with
# every query removed from its own gallery, plus the plots (precision-recall, hierarchical precision-recall,
# class-mean map, retrieval grid).
#
#   accelerate launch -m pml_suprank.recipes.evaluate --model outputs/happier_synthetic/final
#   accelerate launch -m pml_suprank.recipes.evaluate --model org/happier-sop --dataset <hub id> --label_columns a,b
#   accelerate launch -m pml_suprank.recipes.evaluate --model DIR --dataset sop \
#       --data_root /data/Stanford_Online_Products
#
# The paper benchmarks evaluated by their own protocol (--benchmark NAME --data_root DIR, the archive as distributed):
#   * dyml_vehicle / dyml_animal / dyml_product — the DyML protocol (HAPPIER Tab. 2, TPAMI Tab. VIII): each
#     granularity (fine, middle, coarse) has its own query / gallery sets; ap / asi / recall_at_1 / map_at_r per
#     granularity (`ap_fine`, ...) and their means over the three granularities (`ap`, `asi`, `recall_at_1`, ...).
#   * gldv2_hier — H-GLDv2 (TPAMI Tab. VII): the query split against the gallery (the GLDv2 index): map_at_100 is the
#     GLDv2 mAP@100 (pml_suprank.metrics.landmark.landmark_map_at_k), plus H-AP / ASI / NDCG and the other metrics.
#   * roxford5k / rparis6k — the revisited protocol: Easy / Medium / Hard mAP and mP@k with junk images removed
#     (revisited_map); images are only resized (longer side --max_side) and embedded one at a time (sizes vary).
#   Any other benchmark name is evaluated on its test split as a single test set; with --split, any split of any
#   benchmark is evaluated alone (each query against the others, with the plots).
#
# Embeddings are computed on every process's shard and collected with `accelerator.gather_for_metrics`
# (pml_suprank.training.embed_loader, the loop the trainer uses).
########################################################################
from __future__ import annotations

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU; sleeping waits cost nothing on an
# idle one. Set before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from pml_suprank.data.benchmarks import BENCHMARKS  # noqa: E402
from pml_suprank.metrics.report import one_column  # noqa: E402
from pml_suprank.training import TrainingConfig  # noqa: E402
from pml_suprank.training.cli import add_option_arguments  # noqa: E402
from pml_suprank.training.options import DataOptions, RunOptions  # noqa: E402
from pml_suprank.training.recipe import make_accelerator  # noqa: E402

#: benchmarks with their own protocol (not a single test set): name → mode
PROTOCOLS = {
    "dyml_vehicle": "dyml",
    "dyml_animal": "dyml",
    "dyml_product": "dyml",
    "gldv2_hier": "landmark",
    "roxford5k": "revisited",
    "rparis6k": "revisited",
}
DYML_GRANULARITIES = ("fine", "middle", "coarse")


def build_parser() -> argparse.ArgumentParser:
    """``--model`` and ``--output_dir``, plus the shared data / evaluation / run options (generated)."""
    parser = argparse.ArgumentParser(
        description="Evaluate a retrieval model on a test set.", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", type=str, required=True, help="model folder (config.json) or Hub repo id")
    parser.add_argument("--output_dir", type=str, default=None, help="write metrics.json and plots here")
    parser.add_argument(
        "--benchmark", type=str, default=None, choices=sorted(BENCHMARKS),
        help="a paper benchmark read from its archive under --data_root, evaluated by its protocol (DyML: per "
        "granularity; gldv2_hier: query vs gallery, mAP@100; roxford5k / rparis6k: revisited E/M/H mAP); other "
        "benchmarks: their test split",
    )  # fmt: skip
    parser.add_argument(
        "--max_side", type=int, default=None,
        help="roxford5k / rparis6k: resize each image so its longer side has this many pixels (default: the model's "
        "input size; the protocol's papers use 1024)",
    )  # fmt: skip
    add_option_arguments(
        parser,
        DataOptions,
        only=("dataset", "data_root", "label_columns", "test_split", "num_per_class"),
        flags={"test_split": ("--split", "--test_split")},
    )
    add_option_arguments(
        parser,
        TrainingConfig,
        only=("seed", "eval_batch_size", "k_values", "alpha"),
        flags={"eval_batch_size": ("--batch_size", "--eval_batch_size")},
    )
    add_option_arguments(parser, RunOptions, only=("no_plots", "mixed_precision", "cpu"))
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    name = args.benchmark or (args.dataset if args.dataset in BENCHMARKS else None)
    if name is not None and not args.data_root:
        parser.error(f"--data_root is required for benchmark {name} (expected: {BENCHMARKS[name].layout})")
    if name is None and args.dataset not in ("synthetic",) and not args.label_columns:
        parser.error(f"--label_columns is required with --dataset {args.dataset!r}")
    if name is not None and args.test_split is not None and args.test_split not in BENCHMARKS[name].splits:
        parser.error(f"--split must be a split of {name} {list(BENCHMARKS[name].splits)}; got {args.test_split!r}")

    from pml_suprank.models import RetrievalModel

    accelerator = make_accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision, output_dir=args.output_dir)
    model = accelerator.prepare(RetrievalModel.from_pretrained(args.model))
    mode = PROTOCOLS.get(name) if name is not None and args.test_split is None else None
    if mode is None:
        return evaluate_test_set(args, name, model, accelerator)
    protocol = {"dyml": evaluate_dyml, "landmark": evaluate_landmark, "revisited": evaluate_revisited}[mode]
    metrics = protocol(args, name, model, accelerator)
    accelerator.print(f"{args.model} on {name} ({mode} protocol):")
    accelerator.print(one_column(metrics))
    _write_metrics(args, metrics, accelerator)
    accelerator.wait_for_everyone()
    return metrics


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _embed(model: torch.nn.Module, dataset, batch_size: int, accelerator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embeddings (N, D), labels (N, L))`` of ``dataset`` in dataset order (every process gets all of them)."""
    from pml_suprank.training import embed_loader, make_loader

    loader = accelerator.prepare(make_loader(dataset, batch_size))
    emb, labels, _ = embed_loader(model, loader, accelerator, progress=True)
    return emb, labels


def _test_transform(model: torch.nn.Module):
    from pml_suprank import data

    return data.build_transforms(_unwrap(model).data_config, train=False)


def _write_metrics(args: argparse.Namespace, metrics: dict, accelerator) -> Path | None:
    if not args.output_dir or not accelerator.is_main_process:
        return None
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return out


def _floats(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if not hasattr(v, "numel") or v.numel() == 1}


def evaluate_dyml(args: argparse.Namespace, name: str, model: torch.nn.Module, accelerator) -> dict[str, float]:
    """The DyML protocol: for each granularity ``g``, ``query_g`` against ``gallery_g`` (queries are not in the
    gallery); ``<metric>_<g>`` per granularity and ``<metric>`` = the mean over the three granularities, for ``ap``
    (mAP), ``map_at_r``, ``asi`` and ``recall_at_1``."""
    from pml_suprank import data
    from pml_suprank.metrics import RetrievalEvaluator

    transform = _test_transform(model)
    evaluator = RetrievalEvaluator(k_values=tuple(sorted({1, *args.k_values})), alpha=args.alpha)
    keys = ("ap", "map_at_r", "asi", "recall_at_1")
    out: dict[str, float] = {}
    for g in DYML_GRANULARITIES:
        q, ql = _embed(model, data.load_benchmark(name, args.data_root, f"query_{g}", transform),
                       args.eval_batch_size, accelerator)  # fmt: skip
        r, rl = _embed(model, data.load_benchmark(name, args.data_root, f"gallery_{g}", transform),
                       args.eval_batch_size, accelerator)  # fmt: skip
        metrics = evaluator.evaluate(q, ql, r, rl)
        out.update({f"{k}_{g}": float(metrics[k]) for k in keys})
        out[f"num_queries_{g}"] = float(len(q))
    for k in keys:
        out[k] = sum(out[f"{k}_{g}"] for g in DYML_GRANULARITIES) / len(DYML_GRANULARITIES)
    return out


def evaluate_landmark(args: argparse.Namespace, name: str, model: torch.nn.Module, accelerator) -> dict[str, float]:
    """H-GLDv2: the ``query`` split against the ``gallery`` split; every metric of the standard evaluator (H-AP, ASI,
    NDCG on the 3 levels, ...) and ``map_at_100``, the GLDv2 mAP@100 (positives = gallery images of the query's
    landmark; it replaces the evaluator's value of that name)."""
    from pml_suprank import data
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.metrics.landmark import landmark_map_at_k

    transform = _test_transform(model)
    q, ql = _embed(model, data.load_benchmark(name, args.data_root, "query", transform), args.eval_batch_size,
                   accelerator)  # fmt: skip
    r, rl = _embed(model, data.load_benchmark(name, args.data_root, "gallery", transform), args.eval_batch_size,
                   accelerator)  # fmt: skip
    out = _floats(RetrievalEvaluator(k_values=tuple(args.k_values), alpha=args.alpha).evaluate(q, ql, r, rl))
    per_query = landmark_map_at_k(q @ r.T, ql[:, None, 0] == rl[None, :, 0], k=100)
    out["map_at_100"] = float(torch.nanmean(per_query))
    return out


def resize_only_transform(data_config: dict, max_side: int):
    """Resize so the longer side has ``max_side`` pixels (aspect ratio kept, no crop), ``ToTensor``, ``Normalize``
    with the model's mean / std: the revisited Oxford / Paris images keep their shape (batch size 1)."""
    from torchvision import transforms as T

    def resize(image):
        w, h = image.size
        scale = max_side / max(w, h)
        return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), resample=2)  # bilinear

    return T.Compose([T.Lambda(resize), T.ToTensor(), T.Normalize(data_config["mean"], data_config["std"])])


def evaluate_revisited(args: argparse.Namespace, name: str, model: torch.nn.Module, accelerator) -> dict[str, float]:
    """Revisited Oxford / Paris: the cropped queries against the database, ``revisited_map(q @ g.T, query.gnd)``
    (Easy / Medium / Hard mAP and mP@1/5/10, junk removed); resize-only transform, one image per batch."""
    from pml_suprank import data
    from pml_suprank.metrics.landmark import revisited_map

    config = _unwrap(model).data_config
    max_side = args.max_side or int(max(config["input_size"][1:]))
    transform = resize_only_transform(config, max_side)
    query = data.load_benchmark(name, args.data_root, "query", transform)
    q, _ = _embed(model, query, 1, accelerator)
    g, _ = _embed(model, data.load_benchmark(name, args.data_root, "gallery", transform), 1, accelerator)
    return _floats(revisited_map(q @ g.T, query.gnd))


def evaluate_test_set(args: argparse.Namespace, name: str | None, model: torch.nn.Module, accelerator) -> dict:
    """One test set (SyntheticShapes, a benchmark split, or a Hub / local dataset), each query against the others,
    with the plots."""
    from pml_suprank import data, plots
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.training import embed_loader, make_loader

    transform = _test_transform(model)
    split = args.test_split
    if name is not None:
        split = split or BENCHMARKS[name].test_split
        dataset = data.load_benchmark(name, args.data_root, split, transform)
    elif args.dataset == "synthetic":
        image_size = int(_unwrap(model).data_config["input_size"][-1])
        split = split or "test"
        dataset = data.SyntheticShapes(
            split, num_per_class=args.num_per_class, image_size=image_size, seed=args.seed, transform=transform
        )
    else:
        split = split or "test"
        try:  # a missing split, unusable images: the message, not a traceback
            dataset = data.load_retrieval_dataset(args.dataset, args.label_columns, split=split, transform=transform)
        except ValueError as e:
            raise SystemExit(f"--dataset {args.dataset} --split {split}: {e}") from None
    loader = accelerator.prepare(make_loader(dataset, args.eval_batch_size))
    emb, labels, idx = embed_loader(model, loader, accelerator, progress=True)
    metrics = _floats(RetrievalEvaluator(k_values=tuple(args.k_values), alpha=args.alpha).evaluate(emb, labels))
    accelerator.print(f"{args.model} on {name or args.dataset} ({split}, {len(dataset)} images):")
    accelerator.print(one_column(metrics))
    out = _write_metrics(args, metrics, accelerator)
    if out is not None and not args.no_plots:
        files = plots.plot_all(
            emb, labels, out, label_names=getattr(dataset, "label_names", None), image_dataset=dataset, indices=idx,
            seed=args.seed,
        )  # fmt: skip
        accelerator.print(f"metrics.json and {', '.join(files)} in {out}")
    accelerator.wait_for_everyone()
    return metrics


def run() -> None:
    """The console script ``pml-suprank-evaluate``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()
