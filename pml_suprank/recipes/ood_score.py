########################################################################
# Score images with the OOD guard of a retrieval model: one verdict per image.
#
#   python -m pml_suprank.recipes.ood_score --model outputs/run/final --images my_photos/ --output_dir ood_out
#   pml-suprank-ood-score --model org/model --images photo.jpg --output_dir ood_out --ood_threshold 1.5
#
# --model: a model folder (or Hub id) holding an OOD guard in ood/ (written by
#   `fit_heat --model RUN/final`). --images: a folder (flat or nested; searched recursively) or one image file.
# The rule: higher score = more OOD; an image is OOD when score > threshold (the guard's, or --ood_threshold).
#
# Writes to --output_dir: scores.csv (columns file,score,is_ood; one row per image; file relative to --images) and
# score_histogram.png (the scores with the threshold line). Any problem with the inputs: one `error:` line, exit 2.
########################################################################
from __future__ import annotations

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU; sleeping waits cost nothing on an
# idle one. Set before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

import argparse  # noqa: E402
import csv  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from pml_suprank.training import TrainingConfig  # noqa: E402
from pml_suprank.training.config import (  # noqa: E402
    is_str,
    option,
    optional,
    validate_options,  # noqa: E402
)
from pml_suprank.training.options import ModelUseOptions, RunOptions  # noqa: E402
from pml_suprank.training.spec import build_parser as spec_parser  # noqa: E402
from pml_suprank.training.spec import parse, shared  # noqa: E402

__all__ = [
    "OODScoreSpec",
    "build_parser",
    "guard_verdict",
    "main",
    "parse_args",
    "run",
    "write_histogram",
    "write_scores",
]


@dataclass
class OODScoreSpec:
    """Every option of the ``ood_score`` recipe."""

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

    def __post_init__(self) -> None:
        validate_options(self)


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`OODScoreSpec` field."""
    return spec_parser(OODScoreSpec)


def parse_args(argv: list[str] | None = None) -> OODScoreSpec:
    """The invocation's :class:`OODScoreSpec` (each flag checked by its option; exit 2 with the flag named)."""
    return parse(OODScoreSpec, argv)


def write_scores(path: Path, names: list[str], scores: torch.Tensor, is_ood: torch.Tensor) -> Path:
    """``scores.csv``: a header ``file,score,is_ood`` and one row per image (``is_ood`` = ``true`` / ``false``)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "score", "is_ood"])
        for name, score, flag in zip(names, scores.tolist(), is_ood.tolist(), strict=True):
            writer.writerow([name, f"{score:.6g}", "true" if flag else "false"])
    return path


def write_histogram(path: Path, scores: torch.Tensor, threshold: float, title: str) -> Path:
    """A histogram of the scores with the threshold as a vertical line (accepted left of it, rejected right)."""
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
    fig.tight_layout()
    fig.savefig(path)
    return path


def guard_verdict(model: Any, loader: Any, args: OODScoreSpec, device: torch.device) -> Any:
    """The guard's verdict on the loader's images; with ``--embedding_cache``, the features the guard's detector
    reads come from the cache (extracted and stored when missing)."""
    import inspect

    from pml_suprank.data import cached_features
    from pml_suprank.ood import OODFeatures
    from pml_suprank.ood.model_api import extract_model_features

    guard = model.ood_guard
    if args.embedding_cache is None or "model" in inspect.signature(type(guard.detector)).parameters:  # ODIN: images
        return guard.predict(model, loader, threshold=args.ood_threshold, device=device)
    guard.check_model(model)

    def extract(batches: Any) -> dict[str, torch.Tensor]:
        feats = extract_model_features(model, batches, device=device, features=guard.feature_kind)
        return {k: v for k, v in vars(feats).items() if v is not None and k != "labels"}

    found = cached_features(model, loader, args.embedding_cache, feature_kind=f"ood_{guard.feature_kind}",
                            extract=extract)  # fmt: skip
    feats = OODFeatures(**{"std_features": None, "logits": None, **found})
    return guard.verdict(guard.detector.score(**feats.as_kwargs()), args.ood_threshold)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from pml_suprank import data
    from pml_suprank._terminal import refuse, terminal_safe
    from pml_suprank.models import RetrievalModel
    from pml_suprank.search.image_files import ImageFiles

    out = Path(args.output_dir)
    if out.exists() and not out.is_dir():
        refuse(f"--output_dir {out} is a file, not a folder")
    try:
        model = RetrievalModel.from_pretrained(args.model)
    except (OSError, ValueError, TypeError) as e:
        refuse(f"--model {args.model}: {e}")
    if model.ood_guard is None:
        refuse(f"--model {args.model} has no OOD guard (ood/guard.json): fit one with "
                f"`pml-suprank-fit-heat --model {args.model}`")  # fmt: skip
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = model.to(device).eval()
    try:
        images = ImageFiles(args.images, data.build_transforms(model.data_config, train=False),
                            what=f"--images {args.images}")  # fmt: skip
    except ValueError as e:
        refuse(str(e))
    loader = torch.utils.data.DataLoader(images, batch_size=args.batch_size, collate_fn=data.collate)
    verdict = guard_verdict(model, loader, args, device)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = write_scores(out / "scores.csv", images.names, verdict.scores, verdict.is_ood)
    n_ood = int(verdict.is_ood.sum())
    plot = None
    if not args.no_plots:
        title = f"{len(images)} images, {n_ood} OOD ({model.ood_guard.detector_name} guard)"
        plot = write_histogram(out / "score_histogram.png", verdict.scores, verdict.threshold, title)
    source = "--ood_threshold" if args.ood_threshold is not None else "the guard's calibrated threshold"
    print(
        f"{len(images)} images: {n_ood} OOD, {len(images) - n_ood} in-distribution (score > "  # noqa: T201
        f"{verdict.threshold:.6g}, {source}); {csv_path.name}{', ' + plot.name if plot else ''} in {out}"
    )
    top = verdict.scores.argsort(descending=True)[: min(5, n_ood)].tolist()
    for i in top:
        print(f"  OOD  {verdict.scores[i].item():10.4g}  {terminal_safe(images.names[i])}")  # noqa: T201
    return {"scores": str(csv_path), "histogram": None if plot is None else str(plot), "num_images": len(images),
            "num_ood": n_ood, "threshold": verdict.threshold}  # fmt: skip


def run() -> None:
    """The console script ``pml-suprank-ood-score``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()
