"""SyntheticMultiShapes: the multi-label, hierarchical counterpart of SyntheticShapes (no download).

Every image shows **several** coloured shapes (1 to ``max_labels``, in distinct cells of a grid) on the cluttered,
noisy background of :class:`pml_suprank.data.synthetic_shapes.SyntheticShapes`. The fine classes, the family hierarchy
and the open-set protocol are those of SyntheticShapes: 54 global fine classes ``(family * 3 + variant) * 3 + shade``
(family = shape family with its own hue, variant = shape variant, shade = light / medium / dark), 36 training and 18
disjoint test classes.

An item's labels are the *set* of the fine classes of its shapes, as an ``(M,)`` row of sorted fine ids padded with
``-1`` (``M = max_labels``); ``ds.labels`` is ``(N, M)`` and ``ds.hierarchy`` the ``(54, L)`` fine → ancestors table
(``L = 2``: ``[fine, family]``; ``levels=3``: ``[fine, variant, family]``). This is the data of the hierarchical
multi-label relevance of Ramzi's thesis (Algorithm 1, :func:`pml_suprank.relevance.multilabel_relevance`): two
images showing the same shapes are fully relevant, images sharing some shapes or only shape families partially.

Label sets are balanced: every class of the split appears in exactly ``num_per_class`` images. They are drawn in
``num_per_class`` rounds; each round shuffles the split's classes and cuts them into groups of 1..``max_labels``
classes (one image per group), so an image never shows a class twice. Images are rendered from
``numpy.random.default_rng((seed, split, 1000, j))`` (``j`` = the image's index within its split) and the label sets
from ``default_rng((seed, split, max_labels))``: the same arguments always give the same pixels, independently of the
process, worker or access order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, get_args

import numpy as np
import torch

from .._validation import check_choice
from .retrieval_dataset import RetrievalDatasetBase, pad_label_sets
from .synthetic_shapes import (
    COLOURS,
    FAMILIES,
    NUM_COLOURS,
    NUM_VARIANTS,
    SHAPES,
    VARIANTS,
    Split,
    SyntheticShapes,
    background,
    fine_id,
)

__all__ = ["SYNTHETIC_DATASETS", "SyntheticMultiShapes", "hierarchy_table", "synthetic_dataset"]

_MAX_LABELS = 9  # at most a 3 x 3 grid of shapes
_IMAGE_STREAM = 1000  # above every fine id, so no image stream is shared with SyntheticShapes


def hierarchy_table(levels: int = 2) -> torch.Tensor:
    """The ``(54, levels)`` fine → ancestors table of the SyntheticShapes classes: ``[fine, (variant,) family]``."""
    check_choice("levels", levels, (2, 3))
    fine = torch.arange(SyntheticShapes.num_fine_classes())
    cols = [fine] + ([fine // NUM_COLOURS] if levels == 3 else []) + [fine // (NUM_VARIANTS * NUM_COLOURS)]
    return torch.stack(cols, dim=1)


class SyntheticMultiShapes(RetrievalDatasetBase):
    """Procedurally rendered images of several hierarchical shapes: multi-label retrieval data.

    Args:
        split: ``"train"`` (images of the 36 training classes), ``"test"`` (the 18 other classes) or ``"all"`` (both
            sets of images). With ``open_set=False`` every split draws from all 54 classes (different images).
        num_per_class: Number of images in which every fine class of the split appears.
        image_size: Side of the square RGB images, in pixels (64 leaves room for a 2 x 2 grid of shapes).
        seed: Base seed; train and test images come from different streams of the same seed.
        families: Subset of :data:`pml_suprank.data.synthetic_shapes.FAMILIES` (names or indices).
        levels: 2 → hierarchy ``[fine, family]``; 3 → ``[fine, variant, family]``.
        open_set: Disjoint train/test fine classes (default) or all classes in every split.
        max_labels: Most shapes (labels) per image, 1..9; each image shows 1..``max_labels`` shapes placed in distinct
            cells of a ``ceil(sqrt(max_labels))``-sided grid. ``labels`` has ``max_labels`` columns.
        rotation: Maximum absolute rotation of every shape, in degrees.
        scale: Range of a shape's radius as a fraction of its grid cell's side.
        noise: Standard deviation of the Gaussian pixel noise (0–255 scale).
        clutter: Maximum number of random distractor lines.
        colour_jitter: Maximum per-channel jitter of every shape colour (0–255 scale).
        illumination: Maximum relative change of the global brightness.
        colour_cast: Maximum relative per-channel gain of the whole image (white balance).
        transform: Callable on a PIL image returning a ``(3, H, W)`` tensor (e.g. from ``build_transforms``).
        cache: Keep rendered images in memory after their first access.

    Items: ``ds[i] = {"image": (3, H, W) float, "labels": (max_labels,) long (-1 padded), "index": i}``;
    ``ds.multilabel`` is True, ``ds.labels`` is ``(N, max_labels)``, ``ds.hierarchy`` the ``(54, levels)`` table and
    ``ds.label_names`` names its levels (``["fine_label", ("variant_label",) "coarse_label"]``).

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
        noise: float = 10.0,
        clutter: int = 3,
        colour_jitter: int = 25,
        illumination: float = 0.12,
        colour_cast: float = 0.15,
        transform: Callable | None = None,
        cache: bool = True,
    ) -> None:
        if isinstance(max_labels, bool) or not isinstance(max_labels, int) or not 1 <= max_labels <= _MAX_LABELS:
            raise ValueError(f"max_labels must be an int in [1, {_MAX_LABELS}]; got {max_labels!r}")
        # the single-label dataset validates every shared argument (and the families) the same way
        ref = SyntheticShapes(
            split, 1, image_size, seed, families, levels, open_set, rotation, scale, noise, clutter, colour_jitter,
            illumination, colour_cast, None, False,
        )
        if isinstance(num_per_class, bool) or not isinstance(num_per_class, int) or num_per_class < 1:
            raise ValueError(f"num_per_class must be an int >= 1; got {num_per_class!r}")
        for name in ("split", "image_size", "seed", "family_ids", "levels", "open_set", "rotation", "scale", "noise",
                     "clutter", "colour_jitter", "illumination", "colour_cast"):
            setattr(self, name, getattr(ref, name))
        self.num_per_class = num_per_class
        self.max_labels = max_labels
        self.cache = bool(cache)
        self._cache: dict[int, np.ndarray] = {}
        # (split code, index within that split's images, fine ids of the shapes) per image
        self._items: list[tuple[int, int, list[int]]] = []
        codes = sorted({code for *_, code in ref._classes})
        for code in codes:
            fine = sorted(fine_id(f, v, c) for f, v, c, k in ref._classes if k == code)
            for j, group in enumerate(self._label_sets(fine, code)):
                self._items.append((code, j, group))
        names = ["fine_label"] + (["variant_label"] if levels == 3 else []) + ["coarse_label"]
        labels = pad_label_sets([g for *_, g in self._items], width=max_labels)
        super().__init__(labels, names, transform, multilabel=True, hierarchy=hierarchy_table(levels))

    def _label_sets(self, fine: list[int], split_code: int) -> list[list[int]]:
        """Balanced label sets: ``num_per_class`` rounds, each a shuffle of ``fine`` cut into groups of
        1..``max_labels`` classes (sorted fine ids)."""
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

    # ------------------------------------------------------------------ metadata
    @property
    def class_names(self) -> dict[int, str]:
        """Names of the fine classes present in this dataset, keyed by fine label."""
        present = torch.unique(self.labels[self.labels >= 0])
        return {int(k): SyntheticShapes.fine_class_name(int(k)) for k in present}

    def num_labels(self) -> torch.Tensor:
        """``(N,)`` number of labels (shapes) of every image."""
        return (self.labels >= 0).sum(1)

    # ------------------------------------------------------------------ rendering
    get_image = SyntheticShapes.get_image  # the cached PIL image of self.render(index)

    def render(self, index: int) -> np.ndarray:
        """Render item ``index`` as a ``(H, W, 3)`` uint8 array (deterministic)."""
        split_code, j, group = self._items[index]
        shapes = []
        for fine in group:
            f, rest = divmod(fine, NUM_VARIANTS * NUM_COLOURS)
            v, c = divmod(rest, NUM_COLOURS)
            family = FAMILIES[f]
            shapes.append((SHAPES[family][VARIANTS[family][v]], list(COLOURS[family].values())[c]))
        rng = np.random.default_rng((self.seed, split_code, _IMAGE_STREAM, j))
        return _render_multi(rng, shapes, self)

    def __repr__(self) -> str:
        fams = [FAMILIES[f] for f in self.family_ids]
        return (
            f"SyntheticMultiShapes(split={self.split!r}, num_items={len(self)}, max_labels={self.max_labels}, "
            f"families={fams}, image_size={self.image_size}, label_names={self.label_names})"
        )


def _polygon_alpha(shape: list, cx: float, cy: float, radius: float, theta: float, aspect: float, size: int,
                   ss: int) -> np.ndarray:
    """``(size, size, 1)`` anti-aliased coverage of a shape (polygons with fill values) rotated by ``theta``."""
    from PIL import Image, ImageDraw

    cos, sin = math.cos(theta), math.sin(theta)
    mask = Image.new("L", (size * ss, size * ss), 0)
    draw = ImageDraw.Draw(mask)
    for poly, value in shape:
        pts = []
        for x, y in poly:
            x, y = x * aspect, y / aspect
            pts.append(((cx + radius * (cos * x - sin * y)) * ss, (cy + radius * (sin * x + cos * y)) * ss))
        draw.polygon(pts, fill=value)
    return (np.asarray(mask, dtype=np.float64) / 255.0).reshape(size, ss, size, ss).mean(axis=(1, 3))[:, :, None]


def _render_multi(rng: np.random.Generator, shapes: list[tuple[list, tuple[int, int, int]]],
                  ds: SyntheticMultiShapes) -> np.ndarray:
    """Background, clutter, then every shape in its own random grid cell, illumination, colour cast and noise."""
    from PIL import Image, ImageDraw

    size, ss = ds.image_size, 3
    img = background(rng, size)
    n_lines = int(rng.integers(0, ds.clutter + 1)) if ds.clutter > 0 else 0
    for _ in range(n_lines):
        layer = Image.new("L", (size * ss, size * ss), 0)
        x0, y0, x1, y1 = rng.uniform(0, size * ss, size=4)
        ImageDraw.Draw(layer).line([(x0, y0), (x1, y1)], fill=255, width=max(1, int(round(ss * rng.uniform(0.6, 1.4)))))
        a = (np.asarray(layer, dtype=np.float64) / 255.0).reshape(size, ss, size, ss).mean(axis=(1, 3))[:, :, None]
        img = img * (1 - 0.8 * a) + 0.8 * a * rng.uniform(0, 255, size=3)
    grid = math.ceil(math.sqrt(ds.max_labels))
    cell = size / grid
    cells = rng.choice(grid * grid, size=len(shapes), replace=False)
    for (shape, colour), k in zip(shapes, cells):
        row, col = divmod(int(k), grid)
        radius = rng.uniform(*ds.scale) * cell
        margin = min(radius * 1.02, cell / 2)
        cx = col * cell + rng.uniform(margin, cell - margin)
        cy = row * cell + rng.uniform(margin, cell - margin)
        theta = math.radians(rng.uniform(-ds.rotation, ds.rotation))
        alpha = _polygon_alpha(shape, cx, cy, radius, theta, rng.uniform(0.9, 1.1), size, ss)
        jitter = rng.uniform(-ds.colour_jitter, ds.colour_jitter, size=3)
        shade = np.clip(np.asarray(colour, dtype=np.float64) + jitter, 0, 255)
        img = img * (1 - alpha) + alpha * shade[None, None, :]
    img = img * (1.0 + rng.uniform(-ds.illumination, ds.illumination))
    if ds.colour_cast > 0:
        img = img * rng.uniform(1.0 - ds.colour_cast, 1.0 + ds.colour_cast, size=3)[None, None, :]
    if ds.noise > 0:
        img = img + rng.normal(0.0, ds.noise, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


#: The built-in synthetic datasets by name (read-only): the ``--dataset`` values of the recipes.
SYNTHETIC_DATASETS: Mapping[str, type[RetrievalDatasetBase]] = MappingProxyType(
    {"synthetic": SyntheticShapes, "synthetic_multilabel": SyntheticMultiShapes}
)


def synthetic_dataset(name: str, split: Split = "train", **kwargs: Any) -> RetrievalDatasetBase:
    """Build a built-in synthetic dataset by name.

    Args:
        name: ``"synthetic"`` (:class:`~pml_suprank.data.synthetic_shapes.SyntheticShapes`, one shape per image, labels
            ``(N, L)``) or ``"synthetic_multilabel"`` (:class:`SyntheticMultiShapes`, labels ``(N, max_labels)``
            padded with ``-1`` and ``ds.hierarchy``).
        split: ``"train"``, ``"test"`` or ``"all"``.
        **kwargs: Keyword arguments of that class (``num_per_class``, ``image_size``, ``seed``, ``transform``, ...).

    Raises:
        ValueError: an unknown ``name`` (listing the known ones) or ``split``.
    """
    cls = SYNTHETIC_DATASETS[check_choice("name", name, tuple(SYNTHETIC_DATASETS))]
    check_choice("split", split, get_args(Split))
    return cls(split, **kwargs)
