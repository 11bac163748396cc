"""Your own images as a retrieval dataset: recognise the layout of a local image folder and split it by class.

Three layouts are read by :func:`pml_suprank.data.load_retrieval_dataset` (the ``imagefolder`` builder of Hugging
Face ``datasets``) without naming a label column:

* ``"split_folders"``: ``root/train/<class>/*`` and ``root/test/<class>/*``: one label level, ``label`` (the class
  folder names);
* ``"metadata"``: images anywhere under ``root`` with a ``metadata.csv`` (or ``metadata.jsonl``) whose ``file_name``
  column names each image; every other column is a label level, in file order, **finest first** (string or integer
  values). ``train/`` and ``test/`` folders, when present, are the splits;
* ``"class_folders"``: ``root/<class>/*`` with no split: the classes are split in two
  (:func:`class_split`, seeded, open set: no class on both sides).

:func:`image_folder_layout` tells which (by reading the folder names and the metadata header only; no image is
opened), :func:`class_split` draws the seeded class split and :func:`class_split_side` keeps one side of it.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from .._safe_json import loads_json

__all__ = [
    "CLASS_SPLIT_FRACTION",
    "FolderLayout",
    "class_split",
    "class_names_of",
    "class_split_side",
    "image_folder_layout",
]

#: the share of the classes that train when a folder without a split is split by class
CLASS_SPLIT_FRACTION = 0.5

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
_METADATA = ("metadata.csv", "metadata.jsonl")
_SPLITS = ("train", "test")


@dataclass(frozen=True)
class FolderLayout:
    """What a local image folder holds.

    Attributes:
        root: The folder.
        kind: ``"split_folders"``, ``"metadata"`` or ``"class_folders"`` (see the module docstring).
        label_columns: The label levels, finest first (``("label",)`` for class folders).
        splits: The splits found (``("train", "test")``), or ``("train",)`` when there is none.
    """

    root: Path
    kind: Literal["split_folders", "metadata", "class_folders"]
    label_columns: tuple[str, ...]
    splits: tuple[str, ...]

    @property
    def needs_class_split(self) -> bool:
        """No test split: the classes are split in two (:func:`class_split`)."""
        return "test" not in self.splits

    def describe(self) -> str:
        """One line: the layout and where the labels come from."""
        where = {
            "split_folders": "train/ and test/ class folders",
            "metadata": f"metadata file, label levels {', '.join(self.label_columns)} (finest first)",
            "class_folders": "class folders",
        }[self.kind]
        if self.kind == "metadata" and not self.needs_class_split:
            where += ", train/ and test/ folders"
        return where + (", no split: classes split in two (seeded, open set)" if self.needs_class_split else "")


def _images(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES]


def _metadata_columns(path: Path) -> list[str]:
    """The columns of a ``metadata.csv`` header or of the first record of a ``metadata.jsonl``."""
    with path.open(newline="", encoding="utf-8") as f:
        if path.suffix == ".csv":
            return [c.strip() for c in next(csv.reader(f), [])]
        first = f.readline()
    try:
        record = loads_json(first, "the line", what="metadata.jsonl record") if first.strip() else {}
    except ValueError as e:
        raise ValueError(f"{path}: the first line is not a JSON object ({e})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: the first line is not a JSON object")
    return list(record)


def image_folder_layout(root: str | Path) -> FolderLayout | None:
    """The :class:`FolderLayout` of a local image folder; ``None`` when ``root`` is not a folder of images (a Hub id,
    parquet files, a ``save_to_disk`` folder).

    Raises:
        ValueError: A folder of images whose labels cannot be read: images with no class folder and no metadata
            file, metadata files with different columns, a metadata file with no ``file_name`` or no label column.
    """
    root = Path(root)
    if not root.is_dir() or (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
        return None
    images = _images(root)
    if not images:
        return None
    splits = tuple(s for s in _SPLITS if (root / s).is_dir()) if (root / "test").is_dir() else ("train",)
    metadata = sorted(p for name in _METADATA for p in root.rglob(name))
    if metadata:
        headers = {p: _metadata_columns(p) for p in metadata}
        first = headers[metadata[0]]
        for path, columns in headers.items():
            if columns != first:
                raise ValueError(
                    f"{root}: metadata files disagree on their columns ({metadata[0]}: {first}; {path}: {columns})"
                )
        if "file_name" not in first:
            raise ValueError(f"{metadata[0]}: no 'file_name' column (the image path); got columns {first}")
        levels = tuple(c for c in first if c != "file_name")
        if not levels:
            raise ValueError(f"{metadata[0]}: no label column besides 'file_name'; add one column per label level")
        return FolderLayout(root, "metadata", levels, splits)
    base = [root / s for s in splits] if "test" in splits else [root]
    loose = [p for p in images if p.parent in base]
    if loose:
        raise ValueError(
            f"{root}: {len(loose)} images (e.g. {loose[0]}) lie outside a class folder and there is no metadata.csv; "
            "put every image in a folder named after its class, or list the labels in a metadata.csv "
            "(file_name plus one column per label level, finest first)"
        )
    return FolderLayout(root, "split_folders" if "test" in splits else "class_folders", ("label",), splits)


def class_split(labels: Tensor, *, seed: int, fraction: float = CLASS_SPLIT_FRACTION) -> tuple[Tensor, Tensor]:
    """A seeded open-set split of the fine classes (column 0) of ``labels`` ``(N, L)`` / ``(N,)``: a random
    ``round(fraction * C)`` of the ``C`` classes train, the others test (at least one class each side).

    Returns:
        ``(train_classes, test_classes)``: sorted 1-D LongTensors of fine label ids.
    """
    labels = torch.as_tensor(labels)
    fine = torch.unique(labels if labels.dim() == 1 else labels[:, 0])
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1); got {fraction!r}")
    if len(fine) < 2:
        raise ValueError(f"a split by class needs at least 2 classes; got {len(fine)}")
    n_train = min(max(int(round(fraction * len(fine))), 1), len(fine) - 1)
    order = torch.randperm(len(fine), generator=torch.Generator().manual_seed(int(seed)))
    return torch.sort(fine[order[:n_train]]).values, torch.sort(fine[order[n_train:]]).values


def class_split_side(dataset: Any, part: str, *, seed: int, fraction: float = CLASS_SPLIT_FRACTION) -> Any:
    """The ``part`` (``"train"`` / ``"test"``) side of :func:`class_split` of an
    :class:`~pml_suprank.data.HFRetrievalDataset`: a new dataset of the items of that side's classes (same label
    ids, class names and transform)."""
    from .loading import HFRetrievalDataset

    if part not in _SPLITS:
        raise ValueError(f"part must be 'train' or 'test'; got {part!r}")
    train, test = class_split(dataset.labels, seed=seed, fraction=fraction)
    keep = torch.nonzero(torch.isin(dataset.labels[:, 0], train if part == "train" else test)).flatten()
    return HFRetrievalDataset(
        dataset.hf_dataset.select(keep.tolist()), dataset.label_names, dataset.image_column, dataset.labels[keep],
        transform=dataset.transform, class_names=dataset.class_names,
    )  # fmt: skip


def class_names_of(dataset: Any, classes: Sequence[int] | Tensor) -> list[str]:
    """The names of fine label ids (the ids themselves as text when the dataset has no names)."""
    names = getattr(dataset, "class_names", {}) or {}
    return [str(names.get(int(c), int(c))) for c in classes]
