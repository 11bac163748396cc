"""The final, Hub-ready folder of a training run (weights, config, model card, metrics, history, plots)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from .checkpoint import jsonable

__all__ = ["write_final_folder"]


def _try_plot(what: str, draw: Any) -> Any:
    """``draw()``, or ``None`` with a warning when it raises: the final folder never depends on a figure."""
    try:
        return draw()
    except Exception as e:  # any failure of a figure: skipped, said once
        warnings.warn(f"{what} skipped: {type(e).__name__}: {str(e)[:300]}", RuntimeWarning, stacklevel=3)
        return None


def write_final_folder(
    save_directory: Path,
    model: nn.Module,
    *,
    config: dict[str, Any],
    history: list[dict[str, Any]],
    metrics: dict[str, float] | None = None,
    summary: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    hub_config: dict[str, Any] | None = None,
    embeddings: tuple[tuple[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor] | None] | None = None,
    image_dataset: Any = None,
    label_names: list[str] | None = None,
    seed: int = 0,
    repo_id: str | None = None,
    replace: bool = False,
) -> Path:
    """Write the Hub-ready folder ``save_directory`` (on one process): what ``save_pretrained`` writes
    (``config.json``, ``model.safetensors``, ``README.md``, ``metrics.json``), ``training_summary.json``,
    ``history.json``, ``training_config.json``, ``data_spec.json`` (from ``metadata["data"]``) and, with
    ``embeddings = (last, first)``, the plots (a figure that fails is skipped with a warning). ``replace=True``
    writes it aside and renames it into place, replacing a previous folder whole.
    """
    save_directory = Path(save_directory)
    if replace:
        return _replace_folder(save_directory, lambda tmp: write_final_folder(
            tmp, model, config=config, history=history, metrics=metrics, summary=summary, metadata=metadata,
            hub_config=hub_config, embeddings=embeddings, image_dataset=image_dataset, label_names=label_names,
            seed=seed, repo_id=repo_id,
        ))  # fmt: skip
    save_directory.mkdir(parents=True, exist_ok=True)
    plot_files: list[Path] = []
    if embeddings is not None:  # a figure that fails is skipped with a warning: it never costs the model
        from .. import plots

        (emb, labels, idx), first = embeddings
        compare = {"before training": first[0]} if first is not None and first is not embeddings[0] else None
        plot_files = _try_plot("the plots", lambda: [save_directory / n for n in plots.plot_all(
            emb, labels, save_directory, label_names=label_names, image_dataset=image_dataset, indices=idx,
            compare=compare, seed=seed)])  # fmt: skip
        if plot_files is None:  # the figures drawn before the failure are kept
            plot_files = sorted(p for p in save_directory.glob("*.png") if p.name != "training_curves.png")
        if any("loss" in r or any(str(k).startswith("eval/") for k in r) for r in history):
            curves = _try_plot("training_curves.png", lambda: plots.plot_training_curves(
                history, save_directory / "training_curves.png", label_names=label_names))  # fmt: skip
            if curves is not None:
                plot_files.insert(0, curves)
    (save_directory / "training_summary.json").write_text(json.dumps(jsonable(summary or {}), indent=1))
    (save_directory / "history.json").write_text(json.dumps(jsonable(history), indent=1))
    from ..hub.local_names import without_local_paths

    config_file = without_local_paths(config) if isinstance(config, dict) else config  # no local path in the folder
    (save_directory / "training_config.json").write_text(json.dumps(jsonable(config_file), indent=1))
    metadata = dict(metadata or {})
    section = metadata.pop("data", None)
    class_split = metadata.pop("class_split", None)
    if section is not None:
        from ..data.data_spec import DATA_SPEC_FILE, data_spec

        spec = data_spec(section, seed=config.get("seed", 0), k_values=config.get("k_values", (1, 10)),
                         alpha=config.get("alpha", 1.0), label_names=metadata.get("label_names"),
                         class_split=class_split)  # fmt: skip
        (save_directory / DATA_SPEC_FILE).write_text(json.dumps(jsonable(spec), indent=1))
    flat = {k: float(v) for k, v in (metrics or {}).items()}
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(
            save_directory,
            metrics=flat,
            metadata=jsonable(metadata),
            hub_config=hub_config,
            plots=plot_files,
            repo_id=repo_id,
        )
    else:
        from safetensors.torch import save_file

        save_file(
            {k: v.detach().contiguous() for k, v in model.state_dict().items()},
            str(save_directory / "model.safetensors"),
        )
        (save_directory / "metrics.json").write_text(json.dumps(flat, indent=1))
    return save_directory


def _replace_folder(target: Path, write: Any) -> Path:
    """``write(staged)`` into a hidden sibling, then two renames put it in place of ``target`` (untouched on an
    error: a failed second rename puts the previous folder back; a crash between the two leaves it as
    ``.old-<name>-<pid>``, which the next run's lock restores, :func:`~.run_folder.remove_stale_temporaries`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    old = target.with_name(f".old-{target.name}-{os.getpid()}")
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    staged = tmp / target.name
    try:
        write(staged)
        if target.exists():
            os.replace(target, old)
        try:
            os.replace(staged, target)
        except BaseException:
            if old.exists() and not target.exists():
                os.replace(old, target)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return target
