"""Hugging Face ``datasets`` with several label columns (:func:`load_retrieval_dataset`), open-set class splits and
collation, under the contract of :mod:`pml_suprank.data.retrieval_dataset`."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor

from .._validation import check_choice, check_positive_int, check_probability
from ..relevance import check_tree
from .folders import folder_splits, image_folder_layout, metadata_splits
from .hf_sources import check_image_paths, describe, image_column_name, load_splits, select_split
from .image_check import check_dataset_images
from .label_columns import is_list_column, label_mappings, label_tensor, multilabel_labels
from .retrieval_dataset import RetrievalDatasetBase, decode_image, pad_label_sets
from .transforms import build_transforms

__all__ = [
    "HFRetrievalDataset",
    "build_transforms",
    "check_disjoint_classes",
    "collate",
    "load_retrieval_dataset",
    "open_set_classes",
]

OpenSetPart = Literal["train", "test"]


def collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Items → ``{"image": (B, 3, H, W), "labels": (B, L) or (B, M), "index": (B,)}``; label rows of different
    lengths (multi-label sets) are padded with ``-1``."""
    return {
        "image": torch.stack([it["image"] for it in items]),
        "labels": pad_label_sets([it["labels"] for it in items]),
        "index": torch.tensor([int(it["index"]) for it in items], dtype=torch.long),
    }


class HFRetrievalDataset(RetrievalDatasetBase):
    """A ``datasets.Dataset`` through the retrieval contract (:func:`load_retrieval_dataset`): ``labels`` ``(N, L)``
    (multi-label: ``(N, M)`` padded with ``-1``, and ``hierarchy``) named by ``label_columns`` (fine → coarse),
    ``class_names`` ``{fine id: name}``; images decoded lazily."""

    def __init__(
        self,
        hf_dataset: Any,
        label_columns: Sequence[str],
        image_column: str,
        labels: Tensor,
        transform: Callable | None = None,
        class_names: Mapping[int, str] | None = None,
        *,
        multilabel: bool = False,
        hierarchy: Any = None,
    ) -> None:
        self.hf_dataset = hf_dataset
        self.image_column = image_column
        self._images = hf_dataset.select_columns([image_column])
        self.class_names = dict(class_names or {})
        super().__init__(labels, list(label_columns), transform, multilabel=multilabel, hierarchy=hierarchy)

    def item_path(self, index: int) -> str | None:
        """The file the image of item ``index`` was read from (``None`` when the row stores only bytes)."""
        try:
            cell = self._images.with_format("arrow")[index : index + 1][self.image_column][0].as_py()
        except Exception:  # noqa: BLE001 - a name for people (messages, result pages), never needed to work
            return None
        path = cell.get("path") if isinstance(cell, Mapping) else None
        return str(path) if path else None

    def describe_item(self, index: int) -> str:
        """``"row <i> (<file>)"`` of the image column, for error messages (the file when the row stores one)."""
        where = f"row {index} of the image column {self.image_column!r}"
        path = self.item_path(index)
        return f"{where} ({path})" if path else where

    def get_image(self, index: int) -> Any:
        """The untransformed PIL RGB image of item ``index`` (``ValueError`` naming the row and file)."""
        from PIL import Image

        index = self._check_index(index)
        try:
            image = self._images[index][self.image_column]
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
            raise ValueError(
                f"{self.describe_item(index)}: cannot decode the image ({type(err).__name__}: {err})"
            ) from None
        if isinstance(image, Mapping) and ("bytes" in image or "path" in image):  # undecoded Image feature
            source = io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"]
            return decode_image(source, self.describe_item(index))
        if isinstance(image, (np.ndarray, list)):  # e.g. an Array3D column of (H, W, 3) uint8 pixels
            image = Image.fromarray(np.asarray(image, dtype=np.uint8))
        return image.convert("RGB")


def open_set_classes(
    labels: Tensor,
    *,
    train_classes_per_coarse: int | None = None,
    train_class_fraction: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``(train_classes, test_classes)``, sorted 1-D LongTensors: the fine classes of ``labels`` ``(N, L)`` split by
    exactly one rule, ``train_classes_per_coarse=k`` (the ``k`` smallest fine ids of every coarse class train:
    CIFAR-100, 3) or ``train_class_fraction=f`` (the first ``round(f * C)`` sorted fine ids: CUB-200, 0.5)."""
    labels = _as_2d_labels(labels)
    if (train_classes_per_coarse is None) == (train_class_fraction is None):
        raise ValueError(
            "open_set_classes needs exactly one rule: train_classes_per_coarse=k or train_class_fraction=f; "
            f"got train_classes_per_coarse={train_classes_per_coarse!r}, train_class_fraction={train_class_fraction!r}"
        )
    fine = torch.unique(labels[:, 0])
    if train_classes_per_coarse is not None:
        k = train_classes_per_coarse
        check_positive_int("train_classes_per_coarse", k)
        if labels.shape[1] < 2:
            raise ValueError("train_classes_per_coarse needs at least two label columns (fine and coarse)")
        check_tree(labels)
        pairs = torch.unique(labels[:, [0, -1]], dim=0)
        train = []
        for c in torch.unique(pairs[:, 1]):
            children = torch.sort(pairs[pairs[:, 1] == c, 0]).values
            if len(children) <= k:
                raise ValueError(
                    f"coarse class {int(c)} has only {len(children)} fine classes; train_classes_per_coarse={k} "
                    "would leave none for testing"
                )
            train.append(children[:k])
        train_set = torch.sort(torch.cat(train)).values
    else:
        f = check_probability("train_class_fraction", train_class_fraction, closed=False)
        n_train = int(round(f * len(fine)))
        if not 0 < n_train < len(fine):
            raise ValueError(f"train_class_fraction={f} leaves an empty side with {len(fine)} fine classes")
        train_set = fine[:n_train]
    test_set = fine[~torch.isin(fine, train_set)]
    return train_set, test_set


def check_disjoint_classes(train_labels: Any, test_labels: Any, *, name: str = "dataset") -> None:
    """``ValueError`` if the fine classes (column 0) of two ``(N, L)`` / ``(N,)`` label sets (or datasets) overlap."""
    a = torch.unique(_as_2d_labels(getattr(train_labels, "labels", train_labels))[:, 0])
    b = torch.unique(_as_2d_labels(getattr(test_labels, "labels", test_labels))[:, 0])
    shared = a[torch.isin(a, b)]
    if len(shared):
        raise ValueError(
            f"{name}: an open-set split was requested but {len(shared)} fine classes appear in both the training "
            f"and the test data (e.g. {shared[:10].tolist()}); use train_classes_per_coarse= or "
            "train_class_fraction= to build disjoint class sets, or open_set=None for a closed-set evaluation"
        )


def _as_2d_labels(labels: Any) -> Tensor:
    labels = torch.as_tensor(np.asarray(labels) if not isinstance(labels, Tensor) else labels)
    if labels.dim() == 1:
        labels = labels[:, None]
    if labels.dim() != 2 or labels.is_floating_point():
        raise ValueError(f"labels must be an integer tensor of shape (N,) or (N, L); got {tuple(labels.shape)}")
    return labels.long()


def load_retrieval_dataset(
    source: Any,
    label_columns: str | Sequence[str] | None,
    split: str = "train",
    *,
    image_column: str | None = None,
    open_set: OpenSetPart | None = None,
    train_classes_per_coarse: int | None = None,
    train_class_fraction: float | None = None,
    transform: Callable | None = None,
    data_files: Any = None,
    cache_dir: str | Path | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    hierarchy: Any = None,
) -> HFRetrievalDataset:
    """Load a retrieval dataset with several label columns (fine → coarse) through Hugging Face ``datasets``.

    ``source``: a Hub dataset id (e.g. ``"uoft-cs/cifar100"``); a local image folder (:func:`image_folder_layout`;
    every image of the split is checked first); parquet files (a path, a glob, a folder, or ``data_files=``); a
    ``save_to_disk`` folder; or an in-memory ``datasets.Dataset`` / ``DatasetDict``. Integer (or whole-number float)
    or string labels (string ids by sorted value over all splits); the hierarchy must be a tree. A list-valued fine
    label column is **multi-label** data: ``ds.labels`` ``(N, M)`` padded with ``-1``, ``ds.hierarchy`` the
    ``(num_fine, L)`` table (from aligned coarser list columns or ``hierarchy=``; ``None``: flat); an open-set side
    keeps the items all of whose labels are on it.

    Args:
        label_columns: Label column names, finest first; ``None`` for a local image folder (its levels).
        split: Split to load; ``"train+test"`` concatenates splits.
        image_column: Default: the first ``Image`` feature, else ``"image"`` / ``"img"``.
        open_set: ``None`` (all classes of ``split``) or the ``"train"`` / ``"test"`` side of the class partition
            ``train_classes_per_coarse`` / ``train_class_fraction`` (:func:`open_set_classes`, over all splits);
            without a rule the dataset's own splits must have disjoint fine classes.
        transform: Callable on a PIL image (e.g. :func:`build_transforms`).
        data_files, cache_dir, revision, token: Passed to ``datasets.load_dataset``.
        hierarchy: Multi-label only: the ``(num_fine, L)`` table when ``label_columns`` names only the fine column.

    Raises:
        ValueError: Missing or negative labels, a non-tree hierarchy, unknown columns or splits, unusable images,
            overlapping open-set classes, an empty open-set side (naming the column, split and row).
    """
    if open_set is not None:
        check_choice("open_set", open_set, get_args(OpenSetPart))
    elif train_classes_per_coarse is not None or train_class_fraction is not None:
        raise ValueError("train_classes_per_coarse / train_class_fraction need open_set='train' or 'test'")
    hub = {"data_files": data_files, "cache_dir": cache_dir, "revision": revision, "token": token}
    layout, label_columns, splits = _source_splits(source, label_columns, hub)
    parts, ds = select_split(splits, split, source)
    where = describe(source)
    missing = [c for c in label_columns if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"label column(s) {missing} not found in split {split!r} of {where}; available columns: {ds.column_names}"
        )
    image_column = image_column_name(ds, image_column, source)
    check_image_paths(ds, image_column, source, split)
    if layout is not None:  # a user's own images: every one read before any training step
        check_dataset_images(ds, image_column, what=f"{where}, split {split!r}")
    multilabel = is_list_column(ds, label_columns[0])
    mappings = label_mappings({**splits, split: ds}, label_columns, where, multilabel)
    needed = label_columns[:1] if multilabel else label_columns  # the columns an open-set rule reads in other splits
    if multilabel:
        labels, table, names = multilabel_labels(ds, split, splits, label_columns, hierarchy, mappings, where)
    else:
        labels, names = label_tensor(ds, label_columns, mappings, split, where, False), label_columns
        table = hierarchy  # refused by the dataset: one-label data carries its levels as columns
        check_tree(labels, name=f"labels {label_columns}")
        if layout is not None:
            _check_classes_have_pairs(labels, f"{where}, split {split!r}")
    if open_set is not None:
        others = {
            k: label_tensor(v, needed, mappings, k, where, multilabel)
            for k, v in splits.items()
            if k not in parts and set(needed) <= set(v.column_names)
        }
        rules = {"train_classes_per_coarse": train_classes_per_coarse, "train_class_fraction": train_class_fraction}
        ds, labels = _open_set_side(ds, labels, others, open_set, rules, split, where, table, multilabel=multilabel)
    feature = ds.features[label_columns[0]]
    class_names = _class_names(getattr(feature, "feature", feature), mappings.get(label_columns[0]))
    kwargs = {"class_names": class_names, "multilabel": multilabel, "hierarchy": table}
    return HFRetrievalDataset(ds, names, image_column, labels, transform=transform, **kwargs)


def _class_names(feature: Any, mapping: dict[str, int] | None) -> dict[int, str]:
    """``{fine id: name}`` from a ``ClassLabel`` feature or the string-label mapping, else ``{}``."""
    import datasets

    if isinstance(feature, datasets.ClassLabel):
        return dict(enumerate(feature.names))
    return {i: v for v, i in (mapping or {}).items()}


def _check_classes_have_pairs(labels: Tensor, where: str) -> None:
    """Refuse a user's image folder where every fine class (column 0 of ``(N, L)``) has a single image (no training
    pair, no positive for any query); warn when only some do."""
    if not labels.numel():
        return
    counts = torch.unique(labels[:, 0], return_counts=True)[1]
    single = int((counts < 2).sum())
    if single == len(counts):
        raise ValueError(
            f"{where}: every class ({len(counts)}) has a single image, so no class gives a training pair and no query "
            "a positive; put at least 2 images in each class folder (or metadata class)"
        )
    if single:
        warnings.warn(f"{where}: {single} of {len(counts)} classes have a single image (no training pair; as queries "
                      "they have no positive)", stacklevel=3)  # fmt: skip


def _source_splits(source: Any, label_columns: Any, hub: dict[str, Any]) -> tuple[Any, list[str], dict[str, Any]]:
    """``(layout of a local image folder or None, checked label columns, {split: datasets.Dataset})``; ``None`` label
    columns are the folder's levels (nested class folders: :func:`folder_splits`, as ``imagefolder`` would merge the
    classes of different groups)."""
    local = isinstance(source, (str, Path)) and hub["data_files"] is None
    layout = image_folder_layout(source) if local else None
    if label_columns is None and layout is not None:
        label_columns = list(layout.label_columns)
    label_columns = _check_label_columns(label_columns, source)
    if layout is not None and layout.depth > 1:
        return layout, label_columns, folder_splits(layout)
    from_metadata = metadata_splits(layout) if layout is not None else None  # metadata.csv above train/ and test/
    if from_metadata is not None:
        return layout, label_columns, from_metadata
    return layout, label_columns, load_splits(source, **hub)


def _check_label_columns(label_columns: Any, source: Any) -> list[str]:
    if label_columns is None:
        raise ValueError(
            f"label_columns=None: the label columns of {describe(source)} (a Hub id, parquet files or a saved "
            "dataset) must be named, finest first (e.g. ['fine_label', 'coarse_label']); only a local image folder "
            "(class folders or a metadata.csv) has levels of its own"
        )
    names = [label_columns] if isinstance(label_columns, str) else label_columns
    if not isinstance(names, Sequence) or not names or not all(isinstance(c, str) for c in names):
        raise ValueError(f"label_columns must be a non-empty list of column names (fine → coarse); got {names!r}")
    label_columns = list(names)
    if len(set(label_columns)) != len(label_columns):
        raise ValueError(f"label_columns must not repeat a column; got {label_columns}")
    return label_columns


def _open_set_side(
    ds: Any,
    labels: Tensor,
    others: dict[str, Tensor],
    open_set: str,
    rules: dict[str, Any],
    split: str,
    where: str,
    table: Tensor | None = None,
    *,
    multilabel: bool = False,
) -> tuple[Any, Tensor]:
    """Keep the ``open_set`` side of the class partition ``rules`` (over ``labels`` and the other splits' ``others``);
    without a rule, check that the splits are already class-disjoint."""
    rows = [x[x >= 0][:, None] if multilabel else x for x in (labels, *others.values())]  # multi-label: used labels
    if all(r is None for r in rules.values()):
        for name, other in zip(others, rows[1:]):
            check_disjoint_classes(rows[0], other, name=f"{where} ({split!r} vs {name!r})")
        keep = torch.arange(len(labels))
    else:
        every = torch.cat(rows)
        if multilabel:
            every = torch.unique(every)[:, None]
            if table is not None:  # a given table must cover the other splits' labels too
                RetrievalDatasetBase._check_hierarchy(every, table)
                every = table[every[:, 0]]
        train_cls, test_cls = open_set_classes(every, **rules)
        side = train_cls if open_set == "train" else test_cls
        # multi-label: an item mixing the two sides belongs to neither
        inside = (torch.isin(labels, side) | (labels < 0)).all(1) if multilabel else torch.isin(labels[:, 0], side)
        keep = torch.nonzero(inside).flatten()
        ds, labels = ds.select(keep.tolist()), labels[keep]
    if len(keep) == 0:
        raise ValueError(f"the open-set {open_set!r} side of split {split!r} is empty")
    return ds, labels[:, : int((labels >= 0).sum(1).max())] if multilabel else labels
