"""The contract of every retrieval dataset: ``ds[i] -> {"image": (3, H, W) float, "labels": (L,) long, "index": i}``
(column 0 finest); ``ds.labels`` ``(N, L)`` without decoding images; ``ds.label_names`` (fine → coarse);
``ds.set_transform(fn)``; ``ds.get_image(i)`` (PIL). Multi-label datasets: ``ds.labels`` ``(N, M)`` padded with
``-1`` and ``ds.hierarchy`` the ``(num_fine, L)`` table (``None``: flat).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..relevance import Hierarchy, check_multilabel

__all__ = ["RetrievalDatasetBase", "check_label_sets", "decode_image", "pad_label_sets", "pil_to_tensor"]


def pil_to_tensor(image: Any) -> Tensor:
    """PIL image (or ``(H, W, 3)`` uint8 array) → float tensor ``(3, H, W)`` in ``[0, 1]``."""
    arr = np.array(image.convert("RGB") if hasattr(image, "convert") else image, dtype=np.uint8)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).float().div_(255.0)


def decode_image(source: Any, where: str) -> Any:
    """Decode ``source`` (a path or a binary file) fully into a PIL RGB image (``ValueError`` naming ``where``)."""
    from PIL import Image

    try:
        with Image.open(source) as image:
            image.load()
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{where}: cannot decode the image ({type(err).__name__}: {err})") from None


def pad_label_sets(rows: Sequence[Any], width: int | None = None) -> Tensor:
    """``N`` integer label rows as an ``(N, M)`` LongTensor padded with ``-1`` (``M`` = ``width`` >= the longest)."""
    flat = [torch.as_tensor(r).long().reshape(-1) for r in rows]
    longest = max((len(r) for r in flat), default=0)
    width = longest if width is None else width
    if isinstance(width, bool) or not isinstance(width, int) or width < longest:
        raise ValueError(f"width must be an int >= the longest label row ({longest}); got {width!r}")
    out = torch.full((len(flat), width), -1, dtype=torch.long)
    if flat:  # a boolean mask fills in row-major order: row by row, left-aligned
        out[torch.arange(width) < torch.tensor([len(r) for r in flat])[:, None]] = torch.cat(flat)
    return out


def check_label_sets(labels: Any, name: str = "labels") -> Tensor:
    """Multi-label ``labels`` (``(N,)`` / ``(N, M)``, ``-1`` padding) checked as an ``(N, M)`` LongTensor."""
    return check_multilabel(name, torch.as_tensor(labels))


class RetrievalDatasetBase(Dataset):
    """The contract; subclasses implement ``get_image(i)``. ``labels`` ``(N, L)`` named by ``label_names`` (fine →
    coarse); ``multilabel``: ``(N, M)`` sets and the ``hierarchy`` table (or ``None``) whose levels ``label_names``
    names. ``transform``: PIL RGB image → ``(3, H, W)`` tensor (or PIL image, then converted)."""

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
        else:
            if hierarchy is not None:
                raise ValueError(
                    "hierarchy= is for multi-label data (multilabel=True, a list-valued fine label column); "
                    "one-label labels (N, L) carry their levels as columns: pass the coarser levels as label columns"
                )
            labels = torch.as_tensor(labels, dtype=torch.long)
            if labels.dim() == 1:
                labels = labels[:, None]
            if labels.dim() != 2:
                raise ValueError(f"labels must have shape (N, L); got shape {tuple(labels.shape)}")
        self.multilabel = bool(multilabel)
        self.labels = labels
        if len(label_names) != (width := self.num_levels):
            raise ValueError(f"label_names must name the {width} label levels; got {len(label_names)}: {label_names}")
        self.label_names = label_names
        self.transform = None
        self.set_transform(transform)

    @staticmethod
    def _check_hierarchy(labels: Tensor, hierarchy: Any) -> Tensor | None:
        """The validated ``(num_fine, L)`` table covering every label, or ``None``."""
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
        used, n = labels[labels >= 0], table.shape[0]
        missing = used if n == 0 else used[(used >= n) | (table[used.clamp_max(n - 1), 0] < 0)]
        if len(missing):
            raise ValueError(
                f"labels contain fine label {int(missing[0])}, which has no row in the hierarchy (num_fine={n})"
            )
        return table.long().cpu()

    def set_transform(self, transform: Callable | None) -> None:
        """A callable on a PIL RGB image, or ``None`` for a plain ``[0, 1]`` tensor."""
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
        image = image if self.transform is None else self.transform(image)
        image = image if isinstance(image, Tensor) else pil_to_tensor(image)
        return {"image": image, "labels": self.labels[index].clone(), "index": index}

    @property
    def num_levels(self) -> int:
        """L: the label columns (multi-label: the hierarchy's columns)."""
        if self.multilabel:
            return 1 if self.hierarchy is None else int(self.hierarchy.shape[1])
        return int(self.labels.shape[1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_items={len(self)}, label_names={self.label_names})"
