########################################################################
# Evaluate a trained retrieval model (a folder written by train_*.py / save_pretrained, or a Hub repo id) on a
# retrieval dataset: exact metrics over the whole gallery (AP, mAP@R, R@k, H-AP, NDCG, ASI, AP per level) with
# every query removed from its own gallery, plus the plots (precision-recall, hierarchical precision-recall,
# class-mean map, retrieval grid).
#
#   accelerate launch recipes/evaluate.py --model outputs/happier_synthetic/final
#   accelerate launch recipes/evaluate.py --model org/happier-sop --dataset <hub id> --label_columns a,b
#
# Embeddings are computed on every process's shard and collected with `accelerator.gather_for_metrics`.
########################################################################
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Evaluate a retrieval model on a test set.")
    parser.add_argument("--model", type=str, required=True, help="model folder (config.json) or Hub repo id")
    parser.add_argument("--dataset", type=str, default="synthetic", help="'synthetic', a Hub dataset id or a path")
    parser.add_argument("--label_columns", type=common.str_list, default=None, help="label columns fine→coarse")
    parser.add_argument("--split", type=str, default="test", help="split to evaluate")
    parser.add_argument("--num_per_class", type=int, default=32, help="SyntheticShapes: images per fine class")
    parser.add_argument("--seed", type=int, default=0, help="SyntheticShapes seed and plot sampling")
    parser.add_argument("--batch_size", type=int, default=256, help="images per forward pass per process")
    parser.add_argument("--k_values", type=common.int_list, default=[1, 10], help="Recall@k values")
    parser.add_argument("--alpha", type=float, default=1.0, help="H-AP relevance exponent")
    parser.add_argument("--output_dir", type=str, default=None, help="write metrics.json and plots here")
    parser.add_argument("--no_plots", action="store_true", help="do not draw plots")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16"])
    parser.add_argument("--cpu", action="store_true", help="evaluate on the CPU")
    args = parser.parse_args(argv)

    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from pml_suprank import data, plots
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training import embed_loader

    kwargs = {"cpu": args.cpu}
    if args.mixed_precision is not None:
        kwargs["mixed_precision"] = args.mixed_precision
    accelerator = Accelerator(**kwargs)
    model = RetrievalModel.from_pretrained(args.model)
    transform = data.build_transforms(model.data_config, train=False)
    if args.dataset == "synthetic":
        image_size = int(model.data_config["input_size"][-1])
        dataset = data.SyntheticShapes(
            args.split, num_per_class=args.num_per_class, image_size=image_size, seed=args.seed, transform=transform
        )
    else:
        if not args.label_columns:
            parser.error(f"--label_columns is required with --dataset {args.dataset!r}")
        dataset = data.load_retrieval_dataset(args.dataset, args.label_columns, split=args.split, transform=transform)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, collate_fn=data.collate)
    model, loader = accelerator.prepare(model, loader)
    emb, labels, idx = embed_loader(model, loader, accelerator, progress=True)
    metrics = RetrievalEvaluator(k_values=tuple(args.k_values), alpha=args.alpha).evaluate(emb, labels)
    metrics = {k: float(v) for k, v in metrics.items() if not hasattr(v, "numel") or v.numel() == 1}
    accelerator.print(f"{args.model} on {args.dataset} ({args.split}, {len(dataset)} images):")
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
