"""SyntheticMultiShapes: the multi-label counterpart of SyntheticShapes (same 54 fine classes, families and open set):
1 to ``max_labels`` shapes per image, labels the sorted set of their fine classes padded with ``-1``, ``ds.hierarchy``
the ``(54, L)`` table (the thesis' Algorithm 1 data). Every class of the split appears in exactly ``num_per_class``
images; pixels and label sets come from seeded ``default_rng`` streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from .._validation import check_choice
from .retrieval_dataset import RetrievalDatasetBase, pad_label_sets
from .synthetic_shapes import (
    Split,
    SyntheticShapes,
    fine_id,
    hierarchy_table,
    level_names,
    render_shapes,
    shape_of,
)

__all__ = ["SYNTHETIC_DATASETS", "SyntheticMultiShapes", "hierarchy_table", "synthetic_dataset"]

_MAX_LABELS = 9  # at most a 3 x 3 grid of shapes
_IMAGE_STREAM = 1000  # above every fine id, so no image stream is shared with SyntheticShapes


class SyntheticMultiShapes(SyntheticShapes):
    """Procedurally rendered images of several hierarchical shapes: multi-label retrieval data.

    Args:
        num_per_class: Number of images in which every fine class of the split appears.
        max_labels: Most shapes per image, 1..9, in distinct cells of a ``ceil(sqrt(max_labels))``-sided grid (and
            the columns of ``labels``).
        scale: Range of a shape's radius as a fraction of its cell's side.
        others: As :class:`~pml_suprank.data.synthetic_shapes.SyntheticShapes` (``noise`` ... ``cache`` in its order).

    Items: ``ds[i] = {"image": (3, H, W) float, "labels": (max_labels,) long (-1 padded), "index": i}``;
    ``ds.labels`` is ``(N, max_labels)``, ``ds.hierarchy`` the ``(54, levels)`` table.

    Example:
        >>> ds = SyntheticMultiShapes("train", num_per_class=4, image_size=32, max_labels=3)
        >>> ds.labels.shape[1], ds.hierarchy.shape, ds[0].get("image").shape
        (3, torch.Size([54, 2]), torch.Size([3, 32, 32]))
    """

    def __init__(
        self,
        split: Split = "train",
        num_per_class: int = 16,
        image_size: int = 64,
        seed: int = 0,
        families: Sequence[str | int] | None = None,
        levels: int = 2,
        open_set: bool = True,
        max_labels: int = 3,
        rotation: float = 30.0,
        scale: tuple[float, float] = (0.3, 0.45),
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if isinstance(max_labels, bool) or not isinstance(max_labels, int) or not 1 <= max_labels <= _MAX_LABELS:
            raise ValueError(f"max_labels must be an int in [1, {_MAX_LABELS}]; got {max_labels!r}")
        self.max_labels = max_labels
        super().__init__(
            split, num_per_class, image_size, seed, families, levels, open_set, rotation, scale, *args, **kwargs
        )

    def _set_labels(self, transform: Callable | None) -> None:
        """The label sets: ``_items`` (split code, index within that split's images, fine ids of the shapes)."""
        self._items: list[tuple[int, int, list[int]]] = []
        for code in sorted({code for *_, code in self._classes}):
            fine = sorted(fine_id(f, v, c) for f, v, c, k in self._classes if k == code)
            self._items += [(code, j, group) for j, group in enumerate(self._label_sets(fine, code))]
        labels = pad_label_sets([g for *_, g in self._items], width=self.max_labels)
        hierarchy = hierarchy_table(self.levels)
        RetrievalDatasetBase.__init__(
            self, labels, level_names(self.levels), transform, multilabel=True, hierarchy=hierarchy
        )

    def _label_sets(self, fine: list[int], split_code: int) -> list[list[int]]:
        """``num_per_class`` rounds, each a shuffle of ``fine`` cut into sorted groups of 1..``max_labels``."""
        rng = np.random.default_rng((self.seed, split_code, self.max_labels))
        classes = np.asarray(fine, dtype=np.int64)
        groups = []
        for _ in range(self.num_per_class):
            perm = classes[rng.permutation(len(classes))]
            start = 0
            while start < len(perm):
                k = int(rng.integers(1, self.max_labels + 1))
                groups.append(sorted(int(x) for x in perm[start : start + k]))
                start += k
        return groups

    def num_labels(self) -> torch.Tensor:
        """``(N,)`` number of labels (shapes) of every image."""
        return (self.labels >= 0).sum(1)

    def render(self, index: int) -> np.ndarray:
        """Render item ``index`` as a ``(H, W, 3)`` uint8 array (deterministic)."""
        split_code, j, group = self._items[index]
        rng = np.random.default_rng((self.seed, split_code, _IMAGE_STREAM, j))
        return render_shapes(rng, [shape_of(fine) for fine in group], self, grid=math.ceil(math.sqrt(self.max_labels)))


#: The built-in synthetic datasets by name (read-only): the ``--dataset`` values of the recipes.
SYNTHETIC_DATASETS: Mapping[str, type[RetrievalDatasetBase]] = MappingProxyType(
    {"synthetic": SyntheticShapes, "synthetic_multilabel": SyntheticMultiShapes}
)


def synthetic_dataset(name: str, split: Split = "train", **kwargs: Any) -> RetrievalDatasetBase:
    """The built-in synthetic dataset ``name`` (:data:`SYNTHETIC_DATASETS`) of ``split`` built with ``kwargs``
    (``ValueError`` for an unknown name or split)."""
    return SYNTHETIC_DATASETS[check_choice("name", name, tuple(SYNTHETIC_DATASETS))](split, **kwargs)
