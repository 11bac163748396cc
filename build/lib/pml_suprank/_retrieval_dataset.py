"""The item/label contract shared by every retrieval dataset the package returns.

Every dataset (``SyntheticShapes``, ``SyntheticNoise``, ``load_retrieval_dataset(...)``) is a map-style
``torch.utils.data.Dataset`` with:

* ``len(ds)`` and ``ds[i] -> {"image": FloatTensor (3, H, W), "labels": LongTensor (L,), "index": int}``;
  column 0 of ``labels`` is the finest level and the last column the coarsest (the PML / HAPPIER order);
* ``ds.labels``: ``LongTensor (N, L)`` available without decoding any image (for samplers and evaluation);
* ``ds.label_names``: the L column names, fine → coarse;
* ``ds.transform`` / ``ds.set_transform(fn)``: ``fn`` maps a PIL RGB image to a ``(3, H, W)`` tensor; without a
  transform the image is returned as a float tensor in ``[0, 1]``;
* ``ds.get_image(i)``: the untransformed PIL RGB image (for plots such as retrieval grids).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["RetrievalDatasetBase", "pil_to_tensor"]


def pil_to_tensor(image: Any) -> Tensor:
    """PIL image (or ``(H, W, 3)`` uint8 array) → float tensor ``(3, H, W)`` in ``[0, 1]``."""
    arr = np.array(image.convert("RGB") if hasattr(image, "convert") else image, dtype=np.uint8)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).float().div_(255.0)


class RetrievalDatasetBase(Dataset):
    """Base class implementing the common contract; subclasses implement ``get_image(i)``.

    Args:
        labels: ``(N, L)`` integer labels, column 0 finest.
        label_names: L names, fine → coarse.
        transform: Callable on a PIL RGB image returning a ``(3, H, W)`` tensor (or a PIL image, then converted).
    """

    def __init__(self, labels: Tensor, label_names: Sequence[str], transform: Callable | None = None) -> None:
        labels = torch.as_tensor(labels, dtype=torch.long)
        if labels.dim() == 1:
            labels = labels[:, None]
        if labels.dim() != 2:
            raise ValueError(f"labels must have shape (N, L); got shape {tuple(labels.shape)}")
        label_names = list(label_names)
        if len(label_names) != labels.shape[1]:
            raise ValueError(
                f"label_names must name the {labels.shape[1]} label columns; got {len(label_names)}: {label_names}"
            )
        self.labels = labels
        self.label_names = label_names
        self.transform = None
        self.set_transform(transform)

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
        if isinstance(index, torch.Tensor):
            index = int(index)
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int; got {type(index).__name__}")
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
        """Number of label columns L."""
        return int(self.labels.shape[1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_items={len(self)}, label_names={self.label_names})"
