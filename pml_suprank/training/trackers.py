"""The experiment trackers of a recipe run: ``--report_to`` becomes ``Accelerator(log_with=...)``; the options
(:func:`flat_config`), metrics and the final folder's plots (:func:`log_plots`) go to them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["REPORT_TO", "flat_config", "log_config_text", "log_plots", "resolve_report_to"]

#: the choices of ``--report_to``
REPORT_TO = ("none", "tensorboard", "wandb", "mlflow", "all")


def resolve_report_to(report_to: str, *, required: bool = True) -> str | None:
    """The ``log_with`` of ``Accelerator`` for ``report_to`` (``None``: no tracker); a tracker whose package is
    missing logs nowhere unless ``required`` (the user asked for it).

    Raises:
        ValueError: An unknown name, or a required tracker whose package is not installed.
    """
    if report_to not in REPORT_TO:
        raise ValueError(f"--report_to must be one of {', '.join(REPORT_TO)}; got {report_to!r}")
    if report_to == "none":
        return None
    if report_to == "all":
        return "all"
    from accelerate.utils import is_mlflow_available, is_tensorboard_available, is_wandb_available

    available = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available, "mlflow": is_mlflow_available}
    if not available[report_to]():
        if required:
            raise ValueError(
                f"--report_to {report_to} needs the {report_to} package: pip install {report_to} (or --report_to none)"
            )
        return None
    return report_to


def flat_config(values: Mapping[str, Any]) -> dict[str, int | float | str | bool]:
    """Option values as tracker hyper-parameters (scalars and strings: ``None`` → ``"none"``, lists comma-joined,
    mappings as JSON)."""
    out: dict[str, int | float | str | bool] = {}
    for key, value in values.items():
        if value is None:
            out[key] = "none"
        elif isinstance(value, (bool, int, float, str)):
            out[key] = value
        elif isinstance(value, (list, tuple)):
            out[key] = ",".join(map(str, value))
        else:
            out[key] = json.dumps(value, sort_keys=True, default=str)
    return out


def log_config_text(accelerator: Any, config: Mapping[str, Any]) -> None:
    """The config as one JSON text entry ``run_spec`` of the TensorBoard tracker (readable in its Text tab)."""
    for tracker in getattr(accelerator, "trackers", []):
        if tracker.name == "tensorboard" and accelerator.is_main_process:
            tracker.writer.add_text("run_spec", "    " + json.dumps(dict(config), indent=1).replace("\n", "\n    "))
            tracker.writer.flush()


def log_plots(accelerator: Any, paths: Iterable[str | Path], step: int) -> int:
    """Send image files to the trackers that take images (TensorBoard, W&B, MLflow); the number sent per tracker."""
    paths = [Path(p) for p in paths if Path(p).suffix.lower() in (".png", ".jpg", ".jpeg")]
    if not paths or not accelerator.is_main_process:
        return 0
    import numpy as np
    from PIL import Image

    sent = 0
    for tracker in getattr(accelerator, "trackers", []):
        if tracker.name == "tensorboard":
            for p in paths:
                with Image.open(p) as im:
                    tracker.writer.add_image(f"plots/{p.stem}", np.asarray(im.convert("RGB")), step,
                                             dataformats="HWC")  # fmt: skip
            tracker.writer.flush()
        elif tracker.name == "wandb":
            import wandb

            tracker.log_images({f"plots/{p.stem}": [wandb.Image(str(p))] for p in paths}, step=step)
        elif tracker.name == "mlflow":
            import mlflow

            for p in paths:
                mlflow.log_artifact(str(p), artifact_path="plots")
        else:
            continue
        sent = len(paths)
    return sent
