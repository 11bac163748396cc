"""Your own images as a retrieval dataset: the layout of a local image folder (:func:`image_folder_layout`) and its
seeded split by class (:func:`class_split`). Layouts: ``"split_folders"`` (``train/<class>/*`` and
``test/<class>/*``), ``"metadata"`` (a ``metadata.csv`` / ``.jsonl``: ``file_name`` inside the folder, then one column
per level, finest first; optional ``train/`` / ``test/``) and ``"class_folders"`` (``<class>/*``, split by class).
Nested class folders ``<group>/<class>/*`` give the levels ``label`` = ``"<group>/<class>"`` and ``group``
(deeper: ``group_1`` ...).
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
from .._validation import check_choice, check_probability
from .paths import PathConfiner

__all__ = [
    "CLASS_SPLIT_FRACTION",
    "IMAGE_SUFFIXES",
    "FolderLayout",
    "class_split",
    "class_names_of",
    "folder_splits",
    "has_dataset_files",
    "class_split_side",
    "image_folder_layout",
    "metadata_splits",
]

#: the share of the classes that train when a folder without a split is split by class
CLASS_SPLIT_FRACTION = 0.5

#: the file suffixes read as images (lower case)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
_METADATA = ("metadata.csv", "metadata.jsonl")
_SPLITS = ("train", "test")


@dataclass(frozen=True)
class FolderLayout:
    """A local image folder: ``root``, ``kind``, ``label_columns`` (finest first), ``splits`` (``("train", "test")``
    or ``("train",)``) and the class folders' ``depth`` (1: ``<class>/*``, 2: ``<group>/<class>/*``)."""

    root: Path
    kind: Literal["split_folders", "metadata", "class_folders"]
    label_columns: tuple[str, ...]
    splits: tuple[str, ...]
    depth: int = 1

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
        if self.depth > 1:
            nesting = "/".join(["<group>"] * (self.depth - 1) + ["<class>"])
            where += f" {nesting}, label levels {', '.join(self.label_columns)} (finest first)"
        if self.kind == "metadata" and not self.needs_class_split:
            where += ", train/ and test/ folders"
        return where + (", no split: classes split in two (seeded, open set)" if self.needs_class_split else "")


def has_dataset_files(root: str | Path, *, saved: bool = False) -> bool:
    """Whether the folder ``root`` holds a ``datasets.save_to_disk`` dataset or (``saved=False``) any other dataset
    source files (a metadata file, parquet files)."""
    markers = ("dataset_dict.json", "state.json") + (() if saved else (*_METADATA, "dataset_info.json"))
    root = Path(root)
    return any((root / m).is_file() for m in markers) or (not saved and any(root.glob("*.parquet")))


def _images(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]


def _metadata_records(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns (CSV header, or the first JSONL record's keys) and the records of a metadata file."""
    with path.open(newline="", encoding="utf-8") as f:
        if path.suffix == ".csv":
            reader = csv.DictReader(f)
            records = [{k.strip(): v for k, v in r.items() if k is not None} for r in reader]
            return [c.strip() for c in reader.fieldnames or []], records
        lines = [line for line in f if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = loads_json(line, f"{path}, line {number}", what="metadata.jsonl record")
        except ValueError as e:
            raise ValueError(f"{path}, line {number}: not a JSON object ({e})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {number}: not a JSON object (got {type(record).__name__})")
        records.append(record)
    return (list(records[0]) if records else []), records


def _check_metadata_files(path: Path, names: list[Any]) -> None:
    """Every ``file_name`` of the metadata file ``path`` names an existing image inside its folder."""
    confine = PathConfiner(path.parent)
    for row, name in enumerate(names, start=1):
        where = f"{path}, row {row} (column 'file_name')"
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}: expected the relative path of an image; got {name!r}")
        file = Path(confine(name, where=where))
        if file.suffix.lower() not in IMAGE_SUFFIXES or not file.is_file():
            state = "is not an image file" if file.is_file() else "does not exist"
            raise ValueError(
                f"{where}: {name!r} {state} ({file}); file_name must be the path of an image "
                f"({', '.join(sorted(IMAGE_SUFFIXES))}) relative to the folder of {path.name}"
            )


def _level_names(depth: int) -> tuple[str, ...]:
    """The label levels of class folders ``depth`` deep, finest first."""
    return ("label", "group") if depth == 2 else ("label", *(f"group_{i}" for i in range(1, depth)))


_LAYOUTS = (
    "class folders <class>/* (one label level), nested class folders <group>/<class>/* with every image at the same "
    "depth (levels label = <group>/<class> and group), train/ and test/ folders holding either, or a metadata.csv "
    "(file_name plus one column per label level, finest first)"
)


def _split_folders(root: Path, splits: tuple[str, ...], images: list[Path]) -> list[Path]:
    """The folders holding the class folders: ``root/train`` and ``root/test``; ``root/train`` when it holds every
    image; else ``root``."""
    if "test" in splits:
        return [root / s for s in splits]
    train = root / "train"
    return [train] if train.is_dir() and all(train in p.parents for p in images) else [root]


def _class_folder_depth(root: Path, base: list[Path], images: list[Path]) -> int:
    """The one depth (folders between a split / ``root`` and the image) of every image; ``ValueError`` for loose
    images or images at different depths."""
    first: dict[int, Path] = {}
    for image in images:
        where = next((b for b in base if b in image.parents), None)
        if where is not None:
            first.setdefault(len(image.relative_to(where).parts) - 1, image)
    if 0 in first:
        loose = [p for p in images if p.parent in base]
        raise ValueError(
            f"{root}: {len(loose)} images (e.g. {loose[0]}) lie outside a class folder and there is no metadata.csv; "
            f"put every image in a folder named after its class; the layouts that work: {_LAYOUTS}"
        )
    if len(first) > 1:
        (a, pa), (b, pb) = sorted(first.items())[:2]
        raise ValueError(
            f"{root}: images lie at different folder depths (e.g. {pa}: {a} folder(s) deep; {pb}: {b}), so their "
            f"classes are ambiguous; the layouts that work: {_LAYOUTS}"
        )
    return next(iter(first), 1)


def image_folder_layout(root: str | Path) -> FolderLayout | None:
    """The :class:`FolderLayout` of a local image folder, read from folder names and metadata files only; ``None``
    when ``root`` is not a folder of images (a Hub id, parquet files, a ``save_to_disk`` folder).

    Raises:
        ValueError: Labels that cannot be read: loose images without a metadata file, class folders at different
            depths, metadata files with different columns or without ``file_name`` / a label column, a
            ``file_name`` that is not an image inside the folder.
    """
    root = Path(root)
    if not root.is_dir() or has_dataset_files(root, saved=True):
        return None
    images = _images(root)
    if not images:
        return None
    splits = tuple(s for s in _SPLITS if (root / s).is_dir()) if (root / "test").is_dir() else ("train",)
    metadata = sorted(p for name in _METADATA for p in root.rglob(name))
    if metadata:
        headers = {p: _metadata_records(p) for p in metadata}
        first = headers[metadata[0]][0]
        for path, (columns, _) in headers.items():
            if columns != first:
                raise ValueError(
                    f"{root}: metadata files disagree on their columns ({metadata[0]}: {first}; {path}: {columns})"
                )
        if "file_name" not in first:
            raise ValueError(f"{metadata[0]}: no 'file_name' column (the image path); got columns {first}")
        levels = tuple(c for c in first if c != "file_name")
        if not levels:
            raise ValueError(f"{metadata[0]}: no label column besides 'file_name'; add one column per label level")
        for path, (_, records) in headers.items():
            _check_metadata_files(path, [r.get("file_name") for r in records])
        return FolderLayout(root, "metadata", levels, splits)
    depth = _class_folder_depth(root, _split_folders(root, splits, images), images)
    kind = "split_folders" if "test" in splits else "class_folders"
    return FolderLayout(root, kind, _level_names(depth), splits, depth)


def folder_splits(layout: FolderLayout) -> dict[str, Any]:
    """``{split: datasets.Dataset}`` of nested class folders: ``image`` (the sorted files, by path) and one string
    column per level: ``label`` = the image's folder relative to the split (``"<group>/<class>"``), then the parents."""
    import datasets

    if layout.kind == "metadata":
        raise ValueError(f"{layout.root}: a metadata layout is read by the imagefolder builder, not folder_splits")
    out = {}
    for split in layout.splits:
        files = sorted(_images(layout.root))
        base = next(b for b in _split_folders(layout.root, layout.splits, files) if b.name == split or b == layout.root)
        files = [p for p in files if base in p.parents]
        folders = [p.parent.relative_to(base).parts for p in files]
        columns: dict[str, list[str]] = {"image": [str(p) for p in files]}
        for level, name in enumerate(layout.label_columns):
            columns[name] = ["/".join(parts[: len(parts) - level]) for parts in folders]
        out[split] = datasets.Dataset.from_dict(columns).cast_column("image", datasets.Image())
    return out


def _cell(value: str) -> int | str:
    text = value.strip()
    return int(text) if text.lstrip("-").isdigit() else text


def metadata_splits(layout: FolderLayout) -> dict[str, Any] | None:
    """``{split: datasets.Dataset}`` (``image`` by path, the levels; integer CSV cells as ints) of a metadata file
    above ``train/`` and ``test/`` (which ``imagefolder`` does not pair), each row in the split its file lies in;
    ``None`` for any other layout. ``ValueError``: a row in no split folder, an empty split."""
    import datasets

    root = layout.root
    files = [root / name for name in _METADATA if (root / name).is_file()]
    if layout.kind != "metadata" or layout.needs_class_split or not files:
        return None
    rows: dict[str, dict[str, list[Any]]] = {s: {"image": [], **{c: [] for c in layout.label_columns}}
                                              for s in layout.splits}  # fmt: skip
    for path in files:
        for number, record in enumerate(_metadata_records(path)[1], start=1):
            name = str(record["file_name"])
            split = Path(name).parts[0] if Path(name).parts else ""
            if split not in rows:
                raise ValueError(f"{path}, row {number}: {name!r} lies in no split folder ({', '.join(layout.splits)})")
            rows[split]["image"].append(str(root / name))
            for column in layout.label_columns:
                value = record.get(column)
                rows[split][column].append(_cell(value or "") if path.suffix == ".csv" else value)
    empty = [s for s, r in rows.items() if not r["image"]]
    if empty:
        raise ValueError(f"{files[0]}: no row names an image of the split folder(s) {empty}")
    return {s: datasets.Dataset.from_dict(r).cast_column("image", datasets.Image()) for s, r in rows.items()}


def class_split(labels: Tensor, *, seed: int, fraction: float = CLASS_SPLIT_FRACTION) -> tuple[Tensor, Tensor]:
    """``(train_classes, test_classes)``, sorted 1-D LongTensors: a seeded random ``round(fraction * C)`` of the ``C``
    fine classes (column 0 of ``labels`` ``(N, L)`` / ``(N,)``) train, the others test (at least one each side)."""
    labels = torch.as_tensor(labels)
    fine = torch.unique(labels if labels.dim() == 1 else labels[:, 0])
    check_probability("fraction", fraction, closed=False)
    if len(fine) < 2:
        raise ValueError(f"a split by class needs at least 2 classes; got {len(fine)}")
    n_train = min(max(int(round(fraction * len(fine))), 1), len(fine) - 1)
    order = torch.randperm(len(fine), generator=torch.Generator().manual_seed(int(seed)))
    return torch.sort(fine[order[:n_train]]).values, torch.sort(fine[order[n_train:]]).values


def class_split_side(dataset: Any, part: str, *, seed: int, fraction: float = CLASS_SPLIT_FRACTION) -> Any:
    """The ``part`` (``"train"`` / ``"test"``) side of :func:`class_split` of an ``HFRetrievalDataset``: its items of
    that side's classes (same label ids, class names and transform)."""
    check_choice("part", part, _SPLITS)
    train, test = class_split(dataset.labels, seed=seed, fraction=fraction)
    keep = torch.nonzero(torch.isin(dataset.labels[:, 0], train if part == "train" else test)).flatten()
    return type(dataset)(
        dataset.hf_dataset.select(keep.tolist()), dataset.label_names, dataset.image_column, dataset.labels[keep],
        transform=dataset.transform, class_names=dataset.class_names,
    )  # fmt: skip


def class_names_of(dataset: Any, classes: Sequence[int] | Tensor) -> list[str]:
    """The names of fine label ids (the ids themselves as text when the dataset has no names)."""
    names = getattr(dataset, "class_names", {}) or {}
    return [str(names.get(int(c), int(c))) for c in classes]
