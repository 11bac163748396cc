########################################################################
# Evaluate a trained retrieval model (a folder written by train_*.py / save_pretrained, or a Hub repo id) on a
# retrieval dataset: exact metrics over the whole gallery (AP, mAP@R, R@k, H-AP, NDCG, ASI, AP per level) with
# every query removed from its own gallery, plus the plots (precision-recall, hierarchical precision-recall,
# class-mean map, retrieval grid).
#
#   accelerate launch recipes/evaluate.py --model outputs/happier_synthetic/final
#   accelerate launch recipes/evaluate.py --model org/happier-sop --dataset <hub id> --label_columns a,b
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
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from pml_suprank.training import TrainingConfig  # noqa: E402
from pml_suprank.training.cli import add_option_arguments  # noqa: E402
from pml_suprank.training.options import DataOptions, RunOptions  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """``--model`` and ``--output_dir``, plus the shared data / evaluation / run options (generated)."""
    parser = argparse.ArgumentParser(
        description="Evaluate a retrieval model on a test set.", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", type=str, required=True, help="model folder (config.json) or Hub repo id")
    parser.add_argument("--output_dir", type=str, default=None, help="write metrics.json and plots here")
    add_option_arguments(
        parser,
        DataOptions,
        only=("dataset", "label_columns", "test_split", "num_per_class"),
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

    from pml_suprank import data, plots
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training import embed_loader, make_loader

    accelerator = common.make_accelerator(args, find_unused_parameters=False)
    model = RetrievalModel.from_pretrained(args.model)
    transform = data.build_transforms(model.data_config, train=False)
    if args.dataset == "synthetic":
        image_size = int(model.data_config["input_size"][-1])
        dataset = data.SyntheticShapes(
            args.test_split, num_per_class=args.num_per_class, image_size=image_size, seed=args.seed,
            transform=transform,
        )  # fmt: skip
    else:
        if not args.label_columns:
            parser.error(f"--label_columns is required with --dataset {args.dataset!r}")
        dataset = data.load_retrieval_dataset(
            args.dataset, args.label_columns, split=args.test_split, transform=transform
        )
    loader = make_loader(dataset, args.eval_batch_size)
    model, loader = accelerator.prepare(model, loader)
    emb, labels, idx = embed_loader(model, loader, accelerator, progress=True)
    metrics = RetrievalEvaluator(k_values=tuple(args.k_values), alpha=args.alpha).evaluate(emb, labels)
    metrics = {k: float(v) for k, v in metrics.items() if not hasattr(v, "numel") or v.numel() == 1}
    accelerator.print(f"{args.model} on {args.dataset} ({args.test_split}, {len(dataset)} images):")
    accelerator.print(common._one_column(metrics))
    if args.output_dir and accelerator.is_main_process:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
        if not args.no_plots:
            files = plots.plot_all(
                emb,
                labels,
                out,
                label_names=getattr(dataset, "label_names", None),
                image_dataset=dataset,
                indices=idx,
                seed=args.seed,
            )
            accelerator.print(f"metrics.json and {', '.join(files)} in {out}")
    accelerator.wait_for_everyone()
    return metrics


if __name__ == "__main__":
    main()
