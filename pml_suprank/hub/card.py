"""Model cards (``README.md``) of saved retrieval models and OOD detectors: the one card writer.

A card is YAML metadata (``library_name``, tags, datasets, metrics — read by the Hub) followed by markdown: what the
model is, its training data (described by name, class names and counts — never by a local path), the results (our
numbers beside the paper's when the hub_config gives them), the metric definitions, the hyper-parameters, the compute,
the OOD guard when the folder has one, the plots, a usage snippet and the citations (BibTeX).
:func:`generate_model_card` picks the retrieval or the detector layout from ``config["task"]``.

Everything a card shows comes from the model folder's own files — ``config.json`` (its ``training`` metadata),
``metrics.json``, ``training_summary.json``, ``history.json``, ``ood/guard.json`` and the PNG plots — so a folder
saved again (``RetrievalModel.from_pretrained(final).save_pretrained(x)`` or ``.push_to_hub(id)``) gets the same card
as the training recipe wrote: :func:`carried_files` names what a re-save copies, :func:`read_card_files` reads it and
:func:`write_card` (re)writes the card of a folder.

Units: every metric on a card is a percentage (0-100), in the tables and in the ``model-index`` alike;
``metrics.json`` and the console keep fractions in [0, 1]. Names that come from user data (label columns, class names,
dataset names) are escaped for markdown and HTML.
"""

from __future__ import annotations

import html
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..metrics.report import metric_label
from . import _card_sections as sections
from ._card_sections import MAX_CLASSES_LISTED, REPO_URL
from .serialization import CONFIG_NAME, DETECTOR_TASK, LIBRARY_NAME, METRICS_NAME, MODEL_CARD_NAME, check_metrics

__all__ = [
    "CARD_FILES",
    "MAX_CLASSES_LISTED",
    "REPO_URL",
    "CardInputs",
    "carried_files",
    "generate_model_card",
    "read_card_files",
    "run_card_metadata",
    "write_card",
]

# the text helpers shared with the sections (markdown / HTML escaping, percent and number formats, tables)
_data_phrase, _md = sections._data_phrase, sections._md

logger = logging.getLogger(__name__)

#: the JSON files of a model folder a card reads besides ``config.json`` (relative paths)
CARD_FILES = (METRICS_NAME, "training_summary.json", "history.json", "ood/guard.json")
#: class names recorded per split in ``config.json`` (the card lists at most :data:`MAX_CLASSES_LISTED`)
_MAX_CLASSES_RECORDED = 200
_HUB_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


# ---------------------------------------------------------------------------------------------------- the folder
def read_card_files(folder: str | Path) -> dict[str, Any]:
    """The parsed JSON of the :data:`CARD_FILES` present in ``folder`` (``{relative name: value}``); a file that is
    unreadable or not JSON is left out (a card never fails on an optional file)."""
    from .._safe_json import load_json

    out: dict[str, Any] = {}
    for name in CARD_FILES:
        path = Path(folder) / name
        if path.is_file():
            try:
                out[name] = load_json(path, what=name)
            except (OSError, ValueError):
                continue
    return out


def carried_files(source: str | Path, target: str | Path, weights: Any = None) -> list[tuple[str, Path]]:
    """What a re-save of the model folder ``source`` into ``target`` copies so that its card stays whole:
    ``(path relative to the folder, file in source)`` of the :data:`CARD_FILES`, the PNG plots (at the top level and
    in ``plots/``) and the files of the OOD guard folder ``ood/`` — those ``target`` lacks. Nothing when both are the
    same folder, and nothing (with a logged warning) when ``weights`` (the module or ``{name: Tensor}`` being saved)
    differ from ``source/model.safetensors``: metrics, plots and a guard describe the weights they were made with.
    Only plain files inside ``source`` are named (no symlinks)."""
    source, target = Path(source), Path(target)
    if not source.is_dir() or (target.exists() and source.resolve() == target.resolve()):
        return []
    if weights is not None and not _same_weights(source, weights):
        logger.warning(
            "the weights saved differ from those loaded from %s: its metrics, plots and OOD guard are not carried "
            "into %s (the card shows what save_pretrained was given)",
            source,
            target,
        )
        return []
    candidates = [source / n for n in CARD_FILES if n != "ood/guard.json"]
    candidates += sorted(source.glob("*.png")) + sorted((source / "plots").glob("*.png"))
    if (source / "ood").is_dir():
        candidates += sorted(p for p in (source / "ood").rglob("*") if p.is_file())
    out = []
    for path in candidates:
        if path.is_symlink() or not path.is_file():
            continue
        rel = path.relative_to(source).as_posix()
        if not (target / rel).exists():
            out.append((rel, path))
    return out


def _same_weights(source: Path, weights: Any) -> bool:
    """``weights`` (a module or ``{name: Tensor}``) hold exactly the tensors of ``source/model.safetensors``."""
    import torch

    from .serialization import WEIGHTS_NAME, read_weights

    path = source / WEIGHTS_NAME
    if not path.is_file():
        return False
    state = weights.state_dict() if hasattr(weights, "state_dict") else dict(weights)
    try:
        saved = read_weights(path)
    except (OSError, ValueError):
        return False
    for name, tensor in state.items():
        if name in saved and not torch.equal(saved[name], tensor.detach().cpu()):
            return False
    return all(name in saved for name in state) or set(saved) <= set(state)


def _split_summary(dataset: Any) -> dict[str, Any] | None:
    """``{"images", "classes", "class_counts": {name: images}}`` of a dataset with ``labels`` ``(N,)`` / ``(N, L)``
    (fine = column 0) and optionally ``class_names`` ``{id: name}``; names of at most ``_MAX_CLASSES_RECORDED``
    classes, the most frequent first."""
    labels = getattr(dataset, "labels", None)
    if labels is None:
        return None
    try:
        import torch

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
    metadata (so that a re-saved model keeps it): the data summary (images, classes, class names and counts per
    split, and the kind of the run's ``dataset`` option — decided here, where a local folder exists, so that a card
    written later elsewhere never mistakes it for a Hub id), the compute (device, processes, precision, versions),
    the schedule (steps per epoch, total steps: the console's short-run warning) and the card fields of the
    hub_config (``hub.*``, ``name``)."""
    import platform

    import torch

    from ..version import __version__

    acc = getattr(trainer, "accelerator", None)
    device = getattr(acc, "device", None)
    device_type = getattr(device, "type", "cpu")
    name = None
    if device_type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(device)
    elif device_type == "cpu":
        name = f"{os.cpu_count()} CPU cores ({platform.machine()})"
    train = getattr(trainer, "train_dataset", None)
    train = getattr(train, "dataset", train)  # the training set inside its seeded-augmentation wrapper
    meta: dict[str, Any] = {
        "data_summary": {
            part: s
            for part, s in (
                ("train", _split_summary(train)),
                ("test", _split_summary(getattr(trainer, "test_dataset", None))),
            )  # fmt: skip
            if s is not None
        },
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
        meta["data_summary"]["kind"] = _dataset(dataset, [])[0]
    if hub_config:
        hub = dict(hub_config.get("hub") or {})
        keys = ("tags", "datasets", "license", "paper", "paper_url", "paper_results", "name")
        card = {k: hub[k] for k in keys if hub.get(k) is not None}
        if hub_config.get("name") is not None and "name" not in card:
            card["name"] = hub_config["name"]
        source = (hub_config.get("data") or {}).get("dataset") or (hub_config.get("data") or {}).get("source")
        if source is not None:
            card["source"] = source
        meta["card_hub"] = card
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
    from .serialization import read_config

    folder = Path(folder)
    config = read_config(folder / CONFIG_NAME)
    plots = [
        p.relative_to(folder).as_posix() for p in [*sorted(folder.glob("*.png")), *sorted(folder.glob("plots/*.png"))]
    ]
    files = read_card_files(folder)
    text = generate_model_card(
        config,
        metrics=files.get(METRICS_NAME) if isinstance(files.get(METRICS_NAME), dict) else None,
        hub_config=hub_config,
        plots=plots,
        repo_id=repo_id,
        description=description,
        folder=folder.resolve().name,
        files=files,
    )
    path = folder / MODEL_CARD_NAME
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------- inputs
def _dataset(source: Any, hub_datasets: Sequence[str]) -> tuple[str, str, str | None]:
    """``(kind, short name, Hub dataset id or None)`` of a run's ``dataset`` option: ``"synthetic"`` (built in),
    ``"benchmark"`` (a paper benchmark read from a local archive), ``"hub"`` (a Hub dataset id) or ``"local"`` (a
    folder or file on the training machine: only its last path component is named)."""
    from ..data.benchmarks.registry import BENCHMARKS

    if source is None:
        return "unknown", "its training data", hub_datasets[0] if hub_datasets else None
    text = str(source)
    if text.startswith("synthetic"):
        return "synthetic", text, None
    if text in BENCHMARKS:
        return "benchmark", text, hub_datasets[0] if hub_datasets else None
    looks_local = (
        os.path.isabs(text) or text.startswith((".", "~")) or "\\" in text or ".." in Path(text).parts
        or not _HUB_DATASET_ID.match(text) or os.path.exists(text)
    )  # fmt: skip
    if looks_local:
        name = Path(text.rstrip("/\\")).name or "local data"
        return "local", name, hub_datasets[0] if hub_datasets else None
    return "hub", text, text


@dataclass(frozen=True)
class CardInputs:
    """What a card is built from: the saved config, the folder's files and the optional metrics, hub_config, plots
    and repo id.

    Attributes:
        config: The ``config.json`` dict.
        metrics: Our metrics, values in [0, 1] (shown in percent).
        hub_config: Loaded hub_config; uses ``hub.tags``, ``hub.datasets`` (Hub dataset ids), ``hub.license``,
            ``hub.paper``, ``hub.paper_url`` and ``hub.paper_results`` (percent, keyed like the metrics). Without
            it the card fields recorded in ``config["training"]["card_hub"]`` are used.
        plots: Image paths relative to the card's folder.
        repo_id: Hub repo id (``"org/name"``) shown in the title and the usage snippet, when the folder is (or
            will be) pushed there.
        description: One paragraph on what the saved object computes (e.g. its class docstring summary).
        folder: Name of the folder the card is written into; without ``repo_id`` the usage snippet loads it as
            ``"./<folder>"`` (a local path, relative to the folder's parent).
        files: The folder's parsed :data:`CARD_FILES` (:func:`read_card_files`).
    """

    config: Mapping[str, Any]
    metrics: Mapping[str, float]
    hub_config: Mapping[str, Any]
    plots: Sequence[str]
    repo_id: str | None
    description: str | None
    folder: str | None = None
    files: Mapping[str, Any] = field(default_factory=dict)

    @property
    def load_target(self) -> str:
        """What the usage snippet passes to ``from_pretrained``: the repo id, else ``./<folder>``."""
        if self.repo_id:
            return self.repo_id
        return f"./{self.folder}" if self.folder else "path/to/folder"

    @property
    def load_comment(self) -> str:
        return "" if self.repo_id else "  # path of this folder"

    @property
    def training(self) -> dict[str, Any]:
        return dict(self.config.get("training") or {})

    @property
    def hub(self) -> dict[str, Any]:
        if self.hub_config:
            return dict(self.hub_config.get("hub") or {})
        return dict(self.training.get("card_hub") or {})

    @property
    def paper_results(self) -> dict[str, Any]:
        return {str(k): v for k, v in (self.hub.get("paper_results") or {}).items()}

    @property
    def source(self) -> Any:
        data = dict(self.hub_config.get("data") or {}) if self.hub_config else {}
        return data.get("dataset") or data.get("source") or self.training.get("dataset") or self.hub.get("source")

    @property
    def dataset(self) -> tuple[str, str, str | None]:
        """``(kind, display name, Hub dataset id or None)`` of the training data."""
        ids = [str(d) for d in (self.hub.get("datasets") or []) if _HUB_DATASET_ID.match(str(d))]
        kind, name, hub_id = _dataset(self.source, ids)
        recorded = (self.training.get("data_summary") or {}).get("kind")
        if recorded == "local" and kind == "hub":  # a relative folder ("data/photos") seen where it does not exist
            return "local", Path(name).name, ids[0] if ids else None
        return kind, name, hub_id

    @property
    def datasets(self) -> list[str]:
        """The front matter's ``datasets``: real Hub dataset ids only (``hub.datasets``, or a Hub id as source)."""
        ids = [str(d) for d in (self.hub.get("datasets") or []) if _HUB_DATASET_ID.match(str(d))]
        kind, _, hub_id = self.dataset
        if not ids and kind == "hub" and hub_id:
            ids = [hub_id]
        return ids

    @property
    def summary(self) -> dict[str, Any]:
        value = self.files.get("training_summary.json")
        return dict(value) if isinstance(value, Mapping) else {}

    @property
    def history(self) -> list[Mapping[str, Any]]:
        value = self.files.get("history.json")
        return [r for r in value if isinstance(r, Mapping)] if isinstance(value, list) else []

    @property
    def guard(self) -> dict[str, Any] | None:
        value = self.files.get("ood/guard.json")
        return dict(value) if isinstance(value, Mapping) else None

    def title(self, default: str) -> str:
        """The repo id, else the hub_config's name, else ``default`` (never the folder's name: "final" says
        nothing)."""
        return self.repo_id or str(self.hub.get("name") or (self.hub_config or {}).get("name") or default)

    def yaml(
        self,
        tags: Sequence[Any],
        metrics: Sequence[str],
        pipeline_tag: str | None,
        last_tags: Sequence[Any] = (),
        *,
        model_name: str | None = None,
        base_model: str | None = None,
        task_type: str | None = None,
    ) -> str:
        """The card's YAML metadata; tags are ``tags``, then ``hub.tags``, then ``last_tags`` (duplicates dropped).

        With ``model_name`` and ``task_type``, the measured ``metrics`` (percent) also go into ``model-index`` (the
        Hub's evaluation results), on the test split of the card's dataset.
        """
        from huggingface_hub import ModelCardData

        all_tags: list[str] = []
        for t in [*tags, *(self.hub.get("tags") or []), *last_tags]:
            if t and str(t) not in all_tags:
                all_tags.append(str(t))
        card_data = ModelCardData(
            library_name=LIBRARY_NAME,
            license=self.hub.get("license") or "mit",
            tags=all_tags,
            datasets=self.datasets or None,
            metrics=list(metrics) or None,
            pipeline_tag=pipeline_tag,
            base_model=base_model,
            model_name=html.escape(model_name) if model_name else self.repo_id,
            eval_results=self.eval_results(metrics, task_type) if model_name and task_type else None,
        )
        return card_data.to_yaml()

    def eval_results(self, keys: Sequence[str], task_type: str) -> list[Any] | None:
        """``huggingface_hub.EvalResult`` of each measured metric in ``keys`` (percent), or None when none is.

        The dataset ``type`` is the Hub dataset id when there is one; otherwise the description of the data, which
        holds a space and so can never name (and link) an unrelated Hub dataset."""
        from huggingface_hub import EvalResult

        kind, short, hub_id = self.dataset
        name = _data_phrase(kind, short)
        results = [
            EvalResult(
                task_type=task_type,
                dataset_type=hub_id or html.escape(name),
                dataset_name=html.escape(name),
                dataset_split="test",
                metric_type=k,
                metric_name=html.escape(metric_label(k, self.training.get("label_names"))),
                metric_value=round(100.0 * float(self.metrics[k]), 2),
            )
            for k in keys
            if k in self.metrics and math.isfinite(float(self.metrics[k]))
        ]
        return results or None

    def plot_lines(self) -> list[str]:
        lines: list[str] = []
        if self.plots:
            lines += ["## Plots", ""]
            for p in self.plots:
                lines += [f"![{_md(Path(p).stem)}]({p})", ""]
        return lines


def generate_model_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str] | None = None,
    repo_id: str | None = None,
    description: str | None = None,
    folder: str | None = None,
    files: Mapping[str, Any] | None = None,
) -> str:
    """Model card text (``README.md``): YAML metadata, the training data, results, hyper-parameters, compute, the
    OOD guard, plots, usage and citations.

    Detector configs (``config["task"] == "ood-detection"``) get the detector layout, the others (also configs
    written before ``task`` existed) the retrieval-model layout. Arguments as the attributes of :class:`CardInputs`;
    without ``metrics`` those of ``files["metrics.json"]`` are shown.
    """
    files = dict(files or {})
    if not metrics and isinstance(files.get(METRICS_NAME), Mapping):
        metrics = {k: v for k, v in files[METRICS_NAME].items() if isinstance(v, (int, float))}
    inputs = CardInputs(
        config=config,
        metrics=check_metrics(metrics),
        hub_config=dict(hub_config or {}),
        plots=list(plots or []),
        repo_id=repo_id,
        description=description,
        folder=folder,
        files=files,
    )
    return sections.detector_card(inputs) if config.get("task") == DETECTOR_TASK else sections.retrieval_card(inputs)
