"""The item/label contract shared by every retrieval dataset the package returns.

Every dataset (``SyntheticShapes``, ``SyntheticNoise``, ``load_retrieval_dataset(...)``) is a map-style
``torch.utils.data.Dataset`` with:

* ``len(ds)`` and ``ds[i] -> {"image": FloatTensor (3, H, W), "labels": LongTensor (L,), "index": int}``;
  column 0 of ``labels`` is the finest level and the last column the coarsest (the PML / HAPPIER order);
* ``ds.labels``: ``LongTensor (N, L)`` available without decoding any image (for samplers and evaluation);
* ``ds.label_names``: the L column names, fine → coarse;
* ``ds.transform`` / ``ds.set_transform(fn)``: ``fn`` maps a PIL RGB image to a ``(3, H, W)`` tensor; without a
  transform the image is returned as a float tensor in ``[0, 1]``;
* ``ds.get_image(i)``: the untransformed PIL RGB image (for plots such as retrieval grids);
* ``ds.multilabel``: ``False`` for the labels above.

Multi-label datasets (``ds.multilabel is True``: :class:`pml_suprank.data.synthetic_multishapes.SyntheticMultiShapes`,
``load_retrieval_dataset`` on a list-valued label column) expose their hierarchy as a separate table instead:

* ``ds.labels``: ``LongTensor (N, M)``, the *set* of fine labels of every item padded with ``-1`` (every item has at
  least one label), as taken by :func:`pml_suprank.relevance.multilabel_relevance` and
  :class:`pml_suprank.samplers.MultiLabelSampler`; ``ds[i]["labels"]`` is the ``(M,)`` row;
* ``ds.hierarchy``: the ``(num_fine, L)`` LongTensor fine → ancestors table (row ``f`` = ``[f, parent(f), ...,
  coarsest]``, ``-1`` rows for unused ids; the ``hierarchy=`` the hierarchical losses and metrics take), or ``None``
  for flat labels (``L = 1``);
* ``ds.label_names``: the L level names of the table, fine → coarse; ``ds.num_levels`` is L.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["RetrievalDatasetBase", "check_label_sets", "decode_image", "pad_label_sets", "pil_to_tensor"]


def pil_to_tensor(image: Any) -> Tensor:
    """PIL image (or ``(H, W, 3)`` uint8 array) → float tensor ``(3, H, W)`` in ``[0, 1]``."""
    arr = np.array(image.convert("RGB") if hasattr(image, "convert") else image, dtype=np.uint8)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).float().div_(255.0)


def decode_image(source: Any, where: str) -> Any:
    """Decode an encoded image fully into a PIL RGB image, or raise a ``ValueError`` naming ``where``.

    PIL reads lazily: a truncated or corrupt file can open and fail only when its pixels are read, with a message
    naming an anonymous buffer (``<_io.BytesIO ...>``). This loads the pixels here, so every such failure names the
    item and the file it comes from.

    Args:
        source: A path or a binary file object (e.g. ``io.BytesIO`` of the encoded bytes).
        where: The item and its file, e.g. ``"sop train item 3 (/data/sop/bicycle_final/1_0.JPG)"``.

    Raises:
        ValueError: ``"<where>: cannot decode the image (<PIL error>)"``.
    """
    from PIL import Image

    try:
        with Image.open(source) as image:
            image.load()
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{where}: cannot decode the image ({type(err).__name__}: {err})") from None


def pad_label_sets(rows: Sequence[Any], width: int | None = None) -> Tensor:
    """Stack label rows of different lengths into an ``(N, M)`` LongTensor padded with ``-1`` (``M`` = the longest
    row, or ``width``).

    Args:
        rows: ``N`` sequences / 1-D tensors of integer labels (ints or 0-d tensors count as one label).
        width: Number of columns ``M >= max row length``; default the longest row.

    Raises:
        ValueError: ``width`` shorter than a row.
    """
    flat = [torch.as_tensor(r).long().reshape(-1) for r in rows]
    longest = max((len(r) for r in flat), default=0)
    width = longest if width is None else width
    if isinstance(width, bool) or not isinstance(width, int) or width < longest:
        raise ValueError(f"width must be an int >= the longest label row ({longest}); got {width!r}")
    out = torch.full((len(flat), width), -1, dtype=torch.long)
    for i, r in enumerate(flat):
        out[i, : len(r)] = r
    return out


def check_label_sets(labels: Any, name: str = "labels") -> Tensor:
    """Return multi-label ``labels`` as an ``(N, M)`` LongTensor of fine labels padded with ``-1``.

    ``(N,)`` labels are one label per item. Raises ``TypeError`` for non-integer labels and ``ValueError`` naming
    ``name`` and the row for a label below ``-1`` or a row without any label (only padding).
    """
    labels = torch.as_tensor(labels)
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer labels; got dtype {labels.dtype}")
    labels = labels.long()
    if labels.dim() == 1:
        labels = labels[:, None]
    if labels.dim() != 2 or labels.shape[1] == 0:
        raise ValueError(f"{name} must have shape (N, M) with M >= 1 (-1 = padding); got shape {tuple(labels.shape)}")
    if labels.numel() and bool((labels < -1).any()):
        row = int((labels < -1).any(1).nonzero()[0, 0])
        raise ValueError(f"{name} row {row} holds {labels[row].tolist()}: labels must be >= 0 and -1 for padding")
    empty = (labels < 0).all(1)
    if bool(empty.any()):
        row = int(empty.nonzero()[0, 0])
        raise ValueError(f"{name} row {row} has no label (only -1 padding); every item needs at least one label")
    return labels


class RetrievalDatasetBase(Dataset):
    """Base class implementing the common contract; subclasses implement ``get_image(i)``.

    Args:
        labels: ``(N, L)`` integer labels, column 0 finest.
        label_names: L names, fine → coarse.
        transform: Callable on a PIL RGB image returning a ``(3, H, W)`` tensor (or a PIL image, then converted).
        multilabel: ``labels`` are ``(N, M)`` label sets padded with ``-1`` (see the module docstring).
        hierarchy: Multi-label only: the ``(num_fine, L)`` fine → ancestors table, or ``None`` (flat, ``L = 1``);
            ``label_names`` then names its L levels.
    """

    multilabel: bool = False

    def __init__(
        self,
        labels: Tensor,
        label_names: Sequence[str],
        transform: Callable | None = None,
        *,
        multilabel: bool = False,
        hierarchy: Any = None,
    ) -> None:
        label_names = list(label_names)
        if multilabel:
            labels = check_label_sets(labels)
            self.hierarchy = self._check_hierarchy(labels, hierarchy)
            width = 1 if self.hierarchy is None else int(self.hierarchy.shape[1])
        else:
            if hierarchy is not None:
                raise ValueError(
                    "hierarchy= is only for multi-label datasets (multilabel=True); single-label labels (N, L) carry "
                    "their levels as columns"
                )
            labels = torch.as_tensor(labels, dtype=torch.long)
            if labels.dim() == 1:
                labels = labels[:, None]
            if labels.dim() != 2:
                raise ValueError(f"labels must have shape (N, L); got shape {tuple(labels.shape)}")
            width = labels.shape[1]
        if len(label_names) != width:
            raise ValueError(f"label_names must name the {width} label levels; got {len(label_names)}: {label_names}")
        self.multilabel = bool(multilabel)
        self.labels = labels
        self.label_names = label_names
        self.transform = None
        self.set_transform(transform)

    @staticmethod
    def _check_hierarchy(labels: Tensor, hierarchy: Any) -> Tensor | None:
        """The validated ``(num_fine, L)`` table (every label of ``labels`` must have a row), or ``None``."""
        from ..relevance import Hierarchy

        if hierarchy is None:
            return None
        if isinstance(hierarchy, Hierarchy):
            table = hierarchy.table
        else:
            table = torch.as_tensor(hierarchy)
            if table.is_floating_point() or table.dtype == torch.bool or table.dim() != 2:
                raise ValueError(
                    f"hierarchy must be an integer (num_fine, L) table; got dtype {table.dtype}, "
                    f"shape {tuple(table.shape)}"
                )
            table = Hierarchy(table).table
        used = labels[labels >= 0]
        if table.shape[0] == 0:
            missing = used
        else:
            missing = used[(used >= table.shape[0]) | (table[used.clamp_max(table.shape[0] - 1), 0] < 0)]
        if len(missing):
            raise ValueError(
                f"labels contain fine label {int(missing[0])}, which has no row in the hierarchy "
                f"(num_fine={table.shape[0]})"
            )
        return table.long().cpu()

    def set_transform(self, transform: Callable | None) -> None:
        """Set the image transform (a callable on a PIL RGB image), or ``None`` for a plain ``[0, 1]`` tensor."""
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None; got {type(transform).__name__}")
        self.transform = transform

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def get_image(self, index: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_index(self, index: int) -> int:
        if isinstance(index, torch.Tensor) and index.numel() == 1:
            index = int(index)
        if not isinstance(index, (int, np.integer)):
            hint = ""
            if isinstance(index, (list, tuple, torch.Tensor, np.ndarray)):
                hint = (
                    "; a list of indices usually means a batch sampler (pml_suprank.samplers.MPerClassBatchSampler, "
                    "HierarchicalSampler, which yield whole batches) was passed as DataLoader(sampler=...): pass it "
                    "as DataLoader(batch_sampler=...) without batch_size"
                )
            raise TypeError(f"index must be an int; got {type(index).__name__}{hint}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} items")
        return int(index) % n

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = self._check_index(index)
        image = self.get_image(index)
        if self.transform is not None:
            image = self.transform(image)
            if not isinstance(image, Tensor):
                image = pil_to_tensor(image)
        else:
            image = pil_to_tensor(image)
        return {"image": image, "labels": self.labels[index].clone(), "index": index}

    @property
    def num_levels(self) -> int:
        """Number of label levels L (the label columns; for multi-label data, the hierarchy's columns)."""
        if self.multilabel:
            return 1 if self.hierarchy is None else int(self.hierarchy.shape[1])
        return int(self.labels.shape[1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_items={len(self)}, label_names={self.label_names})"
