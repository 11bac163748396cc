"""Score images with the OOD guard of a retrieval model (``ood/``, written by ``fit_heat --model``): one verdict
per image, OOD when score > threshold (the guard's, or ``--ood_threshold``)::

    pml-suprank-ood-score --model outputs/run/final --images my_photos/ --output_dir ood_out

Writes to ``--output_dir``: ``scores.csv`` (``file,score,is_ood``, one row per image, ``file`` relative to
``--images``) and ``score_histogram.png`` (the scores with the threshold line).
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pml_suprank._validation import is_str, optional
from pml_suprank.plots import save_figure
from pml_suprank.training import TrainingConfig
from pml_suprank.training.config import option
from pml_suprank.training.options import ModelUseOptions, RunOptions
from pml_suprank.training.spec import build_parser as spec_parser
from pml_suprank.training.spec import parse, shared

from ._common import console_script, device, load_model, ood_features, output_folder, refuse, test_transform


@dataclass
class OODScoreSpec:
    REQUIRED = ("model", "images", "output_dir")
    DESCRIPTION = "Score images with a model's OOD guard; write scores.csv (file,score,is_ood) and a histogram."

    model: str | None = shared(ModelUseOptions, "model", None,
                               "model folder or Hub id with an OOD guard (ood/guard.json) (required)")  # fmt: skip
    images: str | None = option(None, "a folder of images (flat or nested) or one image file (required)",
                                check=optional(is_str()))  # fmt: skip
    output_dir: str | None = shared(TrainingConfig, "output_dir", None,
                                    "where scores.csv and score_histogram.png go (required)")  # fmt: skip
    ood_threshold: float | None = shared(ModelUseOptions, "ood_threshold")
    batch_size: int = shared(ModelUseOptions, "batch_size")
    no_plots: bool = shared(RunOptions, "no_plots", False, "do not write the histogram")
    device: str | None = shared(ModelUseOptions, "device")
    embedding_cache: str | None = shared(ModelUseOptions, "embedding_cache")


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(OODScoreSpec)


def parse_args(argv: list[str] | None = None) -> OODScoreSpec:
    return parse(OODScoreSpec, argv)


def write_scores(path: Path, names: list[str], scores: torch.Tensor, is_ood: torch.Tensor) -> Path:
    """``scores.csv``: ``file,score,is_ood`` (``true`` / ``false``), one row per image."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "score", "is_ood"])
        for name, score, flag in zip(names, scores.tolist(), is_ood.tolist(), strict=True):
            writer.writerow([name, f"{score:.6g}", "true" if flag else "false"])
    return path


def write_histogram(path: Path, scores: torch.Tensor, threshold: float, title: str) -> Path:
    """A histogram of the scores with the threshold as a vertical line."""
    from matplotlib.figure import Figure

    values = scores.double().numpy()
    fig = Figure(figsize=(7, 3.6), dpi=150)
    ax = fig.subplots()
    ax.hist(values, bins=max(10, min(60, len(values) // 2)), color="#4c72b0", alpha=0.85)
    ax.axvline(threshold, color="#c44e52", linewidth=2, label=f"threshold {threshold:.4g} (OOD when score > it)")
    ax.set_xlabel("OOD score (higher = more out-of-distribution)")
    ax.set_ylabel("images")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def guard_verdict(model: Any, loader: Any, args: OODScoreSpec, device: torch.device) -> Any:
    """The guard's verdict on the loader's images (its features through ``--embedding_cache`` when given)."""
    from pml_suprank.ood.model_api import extract_model_features

    guard = model.ood_guard
    if args.embedding_cache is None or guard.detector._scores_images():  # ODIN: images
        return guard.predict(model, loader, threshold=args.ood_threshold, device=device)
    guard.check_model(model)

    def extract(batches: Any) -> Any:
        return extract_model_features(model, batches, device=device, features=guard.feature_kind)

    feats = ood_features(model, loader, args.embedding_cache, f"ood_{guard.feature_kind}", extract, drop=("labels",))
    return guard.verdict(guard.detector.score(**feats.as_kwargs()), args.ood_threshold)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from pml_suprank import data
    from pml_suprank._terminal import terminal_safe
    from pml_suprank.search.image_files import ImageFiles

    dev = device(args.device)
    inputs = {"--model": args.model, "--images": args.images}
    output_folder(args.output_dir, inputs, create=False)  # before the model is read
    model = load_model(args.model, dev, "--model")  # a model without an OOD guard: refused before any file is written
    try:
        images = ImageFiles(args.images, test_transform(model), what=f"--images {args.images}")
    except ValueError as e:
        refuse(str(e))
    out = output_folder(args.output_dir, inputs)  # after the last refusal
    loader = torch.utils.data.DataLoader(images, batch_size=args.batch_size, collate_fn=data.collate)
    verdict = guard_verdict(model, loader, args, dev)
    csv_path = write_scores(out / "scores.csv", images.names, verdict.scores, verdict.is_ood)
    n_ood = int(verdict.is_ood.sum())
    plot = None
    if not args.no_plots:
        title = f"{len(images)} images, {n_ood} OOD ({model.ood_guard.detector_name} guard)"
        plot = write_histogram(out / "score_histogram.png", verdict.scores, verdict.threshold, title)
    source = "--ood_threshold" if args.ood_threshold is not None else "the guard's calibrated threshold"
    print(
        f"{len(images)} images: {n_ood} OOD, {len(images) - n_ood} in-distribution (score > "
        f"{verdict.threshold:.6g}, {source}); {csv_path.name}{', ' + plot.name if plot else ''} in {out}"
    )
    for i in verdict.scores.argsort(descending=True)[: min(5, n_ood)].tolist():
        print(f"  OOD  {verdict.scores[i].item():10.4g}  {terminal_safe(images.names[i])}")
    return {"scores": str(csv_path), "histogram": None if plot is None else str(plot), "num_images": len(images),
            "num_ood": n_ood, "threshold": verdict.threshold}  # fmt: skip


run = console_script(main)  #: the console script ``pml-suprank-ood-score``

if __name__ == "__main__":
    run()
