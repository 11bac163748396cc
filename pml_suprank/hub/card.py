"""Model cards (``README.md``) of saved retrieval models and OOD detectors: the one card writer.

Everything on a card comes from the folder's own files (``config.json`` and its ``training`` metadata,
:data:`CARD_FILES`, the PNG plots); the text is :mod:`._card_sections`'s.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch

from .._safe_json import load_json
from ..version import __version__
from ._card_sections import CardInputs, describe_dataset, detector_card, retrieval_card
from .serialization import (
    CONFIG_NAME,
    DETECTOR_TASK,
    METRICS_NAME,
    MODEL_CARD_NAME,
    WEIGHTS_NAME,
    check_state,
    read_config,
    read_weights,
)

__all__ = ["carried_files", "folder_plots", "generate_model_card", "read_card_files", "run_card_metadata", "write_card"]

logger = logging.getLogger(__name__)

#: the JSON files of a model folder a card reads besides ``config.json`` (relative paths)
CARD_FILES = (METRICS_NAME, "training_summary.json", "history.json", "ood/guard.json")
#: class names recorded per split in ``config.json``
_MAX_CLASSES_RECORDED = 200


# ---------------------------------------------------------------------------------------------------- the folder
def read_card_files(folder: str | Path) -> dict[str, Any]:
    """The parsed JSON of the :data:`CARD_FILES` present in ``folder`` (``{relative name: value}``); a file that is
    unreadable or not JSON is left out (a card never fails on an optional file)."""
    out: dict[str, Any] = {}
    for name in CARD_FILES:
        if (Path(folder) / name).is_file():
            with suppress(OSError, ValueError):
                out[name] = load_json(Path(folder) / name, what=name)
    return out


def folder_plots(folder: Path) -> list[str]:
    """The PNG plots at the top level of ``folder`` and in its ``plots/`` (sorted paths relative to ``folder``)."""
    return [p.relative_to(folder).as_posix() for glob in ("*.png", "plots/*.png") for p in sorted(folder.glob(glob))]


def carried_files(source: str | Path, target: str | Path, weights: Any = None) -> list[tuple[str, Path]]:
    """What a re-save of the model folder ``source`` into ``target`` copies so that its card stays whole:
    ``(path relative to the folder, file in source)`` of the :data:`CARD_FILES`, the PNG plots (at the top level and
    in ``plots/``) and the files of the OOD guard folder ``ood/`` — those ``target`` lacks. Nothing when both are the
    same folder, and nothing (with a logged warning) when ``weights`` (the module or ``{name: Tensor}`` being saved)
    differ from ``source/model.safetensors``. Only plain files inside ``source`` are named: no symlink, and no file
    reached through a linked folder (``ood`` or ``plots`` linked elsewhere would copy, and a push upload, files from
    outside the model folder)."""
    source, target = Path(source), Path(target)
    if not source.is_dir() or (target.exists() and source.resolve() == target.resolve()):
        return []
    if weights is not None and not _same_weights(source, weights):
        logger.warning("the weights saved differ from those loaded from %s: its metrics, plots and OOD guard are not "
                       "carried into %s (the card shows what save_pretrained was given)", source, target)  # fmt: skip
        return []
    names = [n for n in CARD_FILES if not n.startswith("ood/")] + folder_plots(source)
    candidates = [source / n for n in names] + sorted(source.glob("ood/**/*"))
    out, inside = [], source.resolve()
    for path in candidates:
        rel = path.relative_to(source).as_posix()
        if path.is_file() and not path.is_symlink() and path.resolve() == inside / rel and not (target / rel).exists():
            out.append((rel, path))
    return out


def _same_weights(source: Path, weights: Any) -> bool:
    """``weights`` (a module or ``{name: Tensor}``) hold exactly the tensors of ``source/model.safetensors``: the
    same names (a tied tensor saved once under one of its names) and equal values."""
    state = weights.state_dict() if hasattr(weights, "state_dict") else dict(weights)
    try:
        saved = read_weights(source / WEIGHTS_NAME)
        problems = check_state(saved, source, expected=state)
    except (OSError, ValueError):
        return False
    return not problems and all(torch.equal(t, state[name].detach().cpu()) for name, t in saved.items())


def _split_summary(dataset: Any) -> dict[str, Any] | None:
    """``{"images", "classes", "class_counts": {name: images}}`` of a dataset with ``labels`` ``(N,)`` / ``(N, L)``
    (fine = column 0) and optionally ``class_names`` ``{id: name}``; names of at most ``_MAX_CLASSES_RECORDED``
    classes, the most frequent first."""
    labels = getattr(dataset, "labels", None)
    if labels is None:
        return None
    try:
        fine = torch.as_tensor(labels)
        fine = fine[:, 0] if fine.dim() == 2 else fine
        ids, counts = torch.unique(fine, return_counts=True)
    except (TypeError, ValueError, RuntimeError):
        return None
    names = getattr(dataset, "class_names", None) or {}
    order = sorted(zip(ids.tolist(), counts.tolist()), key=lambda t: (-t[1], t[0]))
    class_counts = {str(names.get(int(i), int(i))): int(n) for i, n in order[:_MAX_CLASSES_RECORDED]}
    return {"images": int(fine.numel()), "classes": int(ids.numel()), "class_counts": class_counts}


def run_card_metadata(trainer: Any, hub_config: Mapping[str, Any] | None = None, dataset: Any = None) -> dict[str, Any]:
    """What a card needs from a training run that no file of the folder holds, for ``config.json``'s ``training``
    metadata: the data summary (images, classes, class names and counts per split, the kind of the ``dataset``
    option), the compute (device, processes, precision, versions), the schedule (steps per epoch, total steps) and
    the card fields of the hub_config (``hub.*``, ``name``)."""
    acc = getattr(trainer, "accelerator", None)
    device_type = getattr(getattr(acc, "device", None), "type", "cpu")
    name = f"{os.cpu_count()} CPU cores ({platform.machine()})" if device_type == "cpu" else None
    if device_type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(acc.device)
    train = getattr(trainer, "train_dataset", None)
    train = getattr(train, "dataset", train)  # the training set inside its seeded-augmentation wrapper
    splits = (("train", _split_summary(train)), ("test", _split_summary(getattr(trainer, "test_dataset", None))))
    meta: dict[str, Any] = {
        "data_summary": {part: s for part, s in splits if s is not None},
        "compute": {
            "device": device_type,
            "device_name": name,
            "num_processes": int(getattr(acc, "num_processes", 1)),
            "mixed_precision": str(getattr(acc, "mixed_precision", "no")),
            "torch": torch.__version__,
            "pml_suprank": __version__,
        },
        "schedule": {
            "steps_per_epoch": int(getattr(trainer, "steps_per_epoch", 0) or 0),
            "total_steps": int(getattr(trainer, "total_steps", 0) or 0),
        },
    }
    if dataset is not None:
        meta["data_summary"]["kind"] = describe_dataset(dataset, [])[0]
    if hub_config:
        hub, data = dict(hub_config.get("hub") or {}), dict(hub_config.get("data") or {})
        card = {"name": hub_config.get("name"), "source": data.get("dataset") or data.get("source")}
        keys = ("tags", "datasets", "license", "paper", "paper_url", "paper_results", "name")  # hub.name first
        card |= {k: hub[k] for k in keys if hub.get(k) is not None}
        meta["card_hub"] = {k: v for k, v in card.items() if v is not None}
    return meta


def write_card(
    folder: str | Path,
    *,
    repo_id: str | None = None,
    hub_config: Mapping[str, Any] | None = None,
    description: str | None = None,
) -> Path:
    """(Re)write ``folder/README.md`` from the folder's own files (``config.json``, :data:`CARD_FILES`, the PNG
    plots at its top level and in ``plots/``). Returns the card's path.

    Raises:
        FileNotFoundError: ``folder`` has no ``config.json``.
    """
    from huggingface_hub import ModelCard

    folder = Path(folder)
    config = read_config(folder / CONFIG_NAME)
    text = generate_model_card(config, hub_config=hub_config, plots=folder_plots(folder), repo_id=repo_id,
                               description=description, folder=folder.resolve().name,
                               files=read_card_files(folder))  # fmt: skip
    ModelCard(text).save(folder / MODEL_CARD_NAME)  # as HubMixin.save_pretrained writes it
    return folder / MODEL_CARD_NAME


def generate_model_card(config: Mapping[str, Any], **inputs: Any) -> str:
    """Model card text (``README.md``) of the ``config.json`` dict ``config``: the detector layout for
    ``config["task"] == "ood-detection"``, else (also configs older than ``task``) the retrieval-model layout.

    Keyword arguments: ``metrics`` (values in [0, 1], shown in percent; default: ``files["metrics.json"]``),
    ``hub_config`` (its ``hub`` section: ``tags``, ``datasets``, ``license``, ``paper``, ``paper_url``,
    ``paper_results`` in percent; default: ``config["training"]["card_hub"]``), ``plots`` (paths relative to the
    folder), ``repo_id`` (the Hub repo, shown in the title and the usage snippet, which else loads ``"./<folder>"``),
    ``description`` (a paragraph on what the object computes), ``folder``, ``files`` (:func:`read_card_files`).
    """
    card = CardInputs(config, **inputs)
    return (detector_card(card) if config.get("task") == DETECTOR_TASK else retrieval_card(card)) + "\n"
