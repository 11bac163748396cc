"""SyntheticShapes: a deterministic, procedurally rendered hierarchical image dataset (no download).

One coloured shape per image on a cluttered, noisy background. Coarse label = shape family (6, each with its own hue);
fine label = variant (3 per family) × shade (light, medium, dark of the hue); ``levels=3`` adds the variant. Nuisances:
position, scale, rotation, colour jitter, illumination, colour cast, background gradient, clutter lines, pixel noise.

Open set (default): in every family, variants 0 and 1 in shade ``family % 3`` and variant 2 in the next shade are the
18 test classes, the other 36 train. Labels are global ids (``fine = (family * 3 + variant) * 3 + shade``, ``coarse =
family``); images come from ``numpy.random.default_rng((seed, split, fine, instance))``: same arguments, same pixels.
"""

from __future__ import annotations

import colorsys
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch

from .._validation import check_choice, check_positive, check_positive_int
from .retrieval_dataset import RetrievalDatasetBase
from .transforms import check_pair

__all__ = ["COLOURS", "FAMILIES", "SHADES", "SyntheticNoise", "SyntheticShapes"]

# Shapes are lists of (polygon in unit coordinates, value) drawn in order into a mask: value 255 fills, 0 cuts holes.
_Poly = list[tuple[float, float]]


def _regular(n: int, r: float | Sequence[float] = 1.0) -> _Poly:
    """``n`` points evenly spaced in angle from the top, at radius ``r`` (or ``r[k]`` for point ``k``)."""
    radii = [r] * n if isinstance(r, (int, float)) else r
    angles = [math.radians(-90.0 + 360.0 * k / n) for k in range(n)]
    return [(radius * math.cos(a), radius * math.sin(a)) for radius, a in zip(radii, angles)]


def _ellipse(rx: float, ry: float, n: int = 48) -> _Poly:
    return [(rx * math.cos(2 * math.pi * k / n), ry * math.sin(2 * math.pi * k / n)) for k in range(n)]


def _star(points: int, inner: float) -> _Poly:
    return _regular(2 * points, [1.0 if k % 2 == 0 else inner for k in range(2 * points)])


def _rect(x0: float, y0: float, x1: float, y1: float) -> _Poly:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


SHAPES: dict[str, dict[str, list[tuple[_Poly, int]]]] = {
    "circle": {
        "disc": [(_ellipse(0.9, 0.9), 255)],
        "ring": [(_ellipse(0.95, 0.95), 255), (_ellipse(0.5, 0.5), 0)],
        "ellipse": [(_ellipse(1.0, 0.45), 255)],
    },
    "triangle": {
        "triangle": [(_regular(3, 1.0), 255)],
        "triangle_outline": [(_regular(3, 1.0), 255), (_regular(3, 0.45), 0)],
        "narrow_triangle": [([(0.0, -1.0), (0.4, 0.95), (-0.4, 0.95)], 255)],
    },
    "square": {
        "square": [(_rect(-0.75, -0.75, 0.75, 0.75), 255)],
        "square_outline": [(_rect(-0.8, -0.8, 0.8, 0.8), 255), (_rect(-0.4, -0.4, 0.4, 0.4), 0)],
        "rectangle": [(_rect(-1.0, -0.42, 1.0, 0.42), 255)],
    },
    "star": {
        "star5": [(_star(5, 0.42), 255)],
        "star4": [(_star(4, 0.3), 255)],
        "star8": [(_star(8, 0.62), 255)],
    },
    "cross": {
        "plus": [(_rect(-0.9, -0.22, 0.9, 0.22), 255), (_rect(-0.22, -0.9, 0.22, 0.9), 255)],
        "tee": [(_rect(-0.9, -0.9, 0.9, -0.48), 255), (_rect(-0.21, -0.9, 0.21, 0.9), 255)],
        "ell": [(_rect(-0.75, -0.95, -0.33, 0.95), 255), (_rect(-0.75, 0.53, 0.8, 0.95), 255)],
    },
    "arrow": {
        "arrow": [(_rect(-0.95, -0.17, 0.2, 0.17), 255), ([(0.1, -0.6), (0.95, 0.0), (0.1, 0.6)], 255)],
        "chevron": [([(-0.7, -0.9), (0.9, 0.0), (-0.7, 0.9), (-0.7, 0.45), (0.2, 0.0), (-0.7, -0.45)], 255)],
        "double_arrow": [
            (_rect(-0.5, -0.15, 0.5, 0.15), 255),
            ([(0.35, -0.55), (1.0, 0.0), (0.35, 0.55)], 255),
            ([(-0.35, -0.55), (-1.0, 0.0), (-0.35, 0.55)], 255),
        ],
    },
}

FAMILIES: tuple[str, ...] = tuple(SHAPES)
VARIANTS: dict[str, tuple[str, ...]] = {f: tuple(v) for f, v in SHAPES.items()}
# Each family has its own hue (degrees) and three shades of it: (saturation, value) in HSV.
_FAMILY_HUES: dict[str, tuple[str, float]] = {
    "circle": ("red", 0.0),
    "triangle": ("yellow", 55.0),
    "square": ("green", 125.0),
    "star": ("cyan", 185.0),
    "cross": ("blue", 230.0),
    "arrow": ("magenta", 300.0),
}
SHADES: dict[str, tuple[float, float]] = {"light": (0.45, 0.97), "medium": (0.85, 0.85), "dark": (0.9, 0.5)}


def _palette(hue_name: str, hue: float) -> dict[str, tuple[int, int, int]]:
    out = {}
    for shade, (sat, val) in SHADES.items():
        r, g, b = colorsys.hsv_to_rgb(hue / 360.0, sat, val)
        name = hue_name if shade == "medium" else f"{shade}_{hue_name}"
        out[name] = (round(255 * r), round(255 * g), round(255 * b))
    return out


#: family → {colour name: RGB}: the three colours (shades of the family's hue) of the fine classes of each family.
COLOURS: dict[str, dict[str, tuple[int, int, int]]] = {f: _palette(*_FAMILY_HUES[f]) for f in FAMILIES}
NUM_VARIANTS = 3
NUM_COLOURS = len(SHADES)
_SPLIT_CODE = {"train": 1, "test": 2}

Split = Literal["train", "test", "all"]


def fine_id(family: int, variant: int, colour: int) -> int:
    return (family * NUM_VARIANTS + variant) * NUM_COLOURS + colour


def _parts(fine: int) -> tuple[str, str, int]:
    """``(family name, variant name, shade index)`` of global fine class ``fine``."""
    f, rest = divmod(int(fine), NUM_VARIANTS * NUM_COLOURS)
    v, c = divmod(rest, NUM_COLOURS)
    return FAMILIES[f], VARIANTS[FAMILIES[f]][v], c


def shape_of(fine: int) -> tuple[list[tuple[_Poly, int]], tuple[int, int, int]]:
    """The polygons and the RGB colour of global fine class ``fine``."""
    family, variant, c = _parts(fine)
    return SHAPES[family][variant], list(COLOURS[family].values())[c]


def hierarchy_table(levels: int = 2) -> torch.Tensor:
    """The ``(54, levels)`` fine → ancestors table of the SyntheticShapes classes: ``[fine, (variant,) family]``."""
    check_choice("levels", levels, (2, 3))
    fine = torch.arange(len(FAMILIES) * NUM_VARIANTS * NUM_COLOURS)
    cols = [fine] + ([fine // NUM_COLOURS] if levels == 3 else []) + [fine // (NUM_VARIANTS * NUM_COLOURS)]
    return torch.stack(cols, dim=1)


def level_names(levels: int) -> list[str]:
    """The label column names of ``levels`` (2 or 3) levels, fine → coarse."""
    return ["fine_label"] + ["variant_label"] * (levels == 3) + ["coarse_label"]


def _is_test_class(family: int, variant: int, colour: int) -> bool:
    # variants 0 and 1 in shade (family % 3), variant 2 in the next shade: every (variant, shade) keeps train classes
    return colour == (family + variant // 2) % NUM_COLOURS


class SyntheticShapes(RetrievalDatasetBase):
    """Procedurally rendered hierarchical shapes (coarse = family, fine = variant × shade of the family's hue).

    Args:
        split: ``"train"`` (36 fine classes), ``"test"`` (the 18 others) or ``"all"``; ``open_set=False``: all 54
            classes in every split (different images per split).
        num_per_class, image_size: Images per fine class; side of the square RGB images in pixels.
        seed: Base seed; train and test images come from different streams of it.
        families: Subset of :data:`FAMILIES` (names or indices), e.g. to hold some out as OOD.
        levels: 2 → labels ``(fine, coarse)``; 3 → ``(fine, variant, coarse)``.
        rotation, scale: Largest rotation in degrees; range of the shape radius (fraction of the side).
        noise, clutter, colour_jitter: Pixel noise std (0–255); most distractor lines; per-channel colour jitter.
        illumination, colour_cast: Largest relative brightness change and per-channel gain (``1 ± x``).
        transform: Callable on a PIL image; cache: keep rendered images in memory.

    Items: ``ds[i] = {"image": (3, H, W) float, "labels": (L,) long, "index": i}``; ``ds.labels`` is ``(N, L)``.

    Example:
        >>> ds = SyntheticShapes("train", num_per_class=4, image_size=32)
        >>> len(ds), ds.labels.shape, ds[0].get("image").shape
        (144, torch.Size([144, 2]), torch.Size([3, 32, 32]))
    """

    def __init__(
        self,
        split: Split = "train",
        num_per_class: int = 40,
        image_size: int = 64,
        seed: int = 0,
        families: Sequence[str | int] | None = None,
        levels: int = 2,
        open_set: bool = True,
        rotation: float = 30.0,
        scale: tuple[float, float] = (0.24, 0.42),
        noise: float = 10.0,
        clutter: int = 3,
        colour_jitter: int = 25,
        illumination: float = 0.12,
        colour_cast: float = 0.15,
        transform: Callable | None = None,
        cache: bool = True,
    ) -> None:
        self.split = check_choice("split", split, get_args(Split))
        check_positive_int("num_per_class", num_per_class)
        check_positive_int("image_size", image_size, minimum=8)
        check_choice("levels", levels, (2, 3))
        scale = check_pair("scale", scale, 0.5)
        nonnegative = {"rotation": rotation, "noise": noise, "clutter": clutter, "colour_jitter": colour_jitter}
        for name, value in nonnegative.items():
            check_positive(name, value, strict=False)
        for name, value in (("illumination", illumination), ("colour_cast", colour_cast)):
            if check_positive(name, value, strict=False) >= 1:
                raise ValueError(f"{name} must be a number in [0, 1); got {value!r}")
        self.family_ids = self._resolve_families(families)
        self.num_per_class = num_per_class
        self.image_size = image_size
        self.seed = int(seed)
        self.levels = levels
        self.open_set = bool(open_set)
        self.rotation = float(rotation)
        self.scale = scale
        self.noise = float(noise)
        self.clutter = int(clutter)
        self.colour_jitter = int(colour_jitter)
        self.illumination = float(illumination)
        self.colour_cast = float(colour_cast)
        self.cache = bool(cache)
        self._cache: dict[int, np.ndarray] = {}

        splits = ("train", "test") if self.split == "all" else (self.split,)
        self._classes = []  # (family, variant, colour, split_code)
        for f, v, c in itertools.product(self.family_ids, range(NUM_VARIANTS), range(NUM_COLOURS)):
            own = "test" if _is_test_class(f, v, c) else "train"
            self._classes += [(f, v, c, _SPLIT_CODE[s]) for s in splits if not open_set or s == own]
        self._set_labels(transform)

    def _set_labels(self, transform: Callable | None) -> None:
        """``num_per_class`` items of every class of ``_classes``, in order."""
        fine = torch.tensor([fine_id(f, v, c) for f, v, c, _ in self._classes])
        labels = hierarchy_table(self.levels)[fine].repeat_interleave(self.num_per_class, dim=0)
        RetrievalDatasetBase.__init__(self, labels, level_names(self.levels), transform)

    @staticmethod
    def _resolve_families(families: Sequence[str | int] | None) -> list[int]:
        if families is None:
            return list(range(len(FAMILIES)))
        families = [families] if isinstance(families, (str, int)) else families
        ids = []
        for f in families:
            if isinstance(f, str):
                f = FAMILIES.index(check_choice("families", f, FAMILIES))
            elif isinstance(f, bool) or not isinstance(f, (int, np.integer)) or not 0 <= f < len(FAMILIES):
                raise ValueError(
                    f"families must contain names from {FAMILIES} or indices 0..{len(FAMILIES) - 1}; got {f!r}"
                )
            ids.append(int(f))
        if not ids:
            raise ValueError("families must select at least one family; got an empty list")
        if len(set(ids)) != len(ids):
            raise ValueError(f"families must not repeat a family; got {list(families)}")
        return sorted(ids)

    @staticmethod
    def num_fine_classes() -> int:
        """Number of fine classes over all splits and families (54)."""
        return len(FAMILIES) * NUM_VARIANTS * NUM_COLOURS

    @staticmethod
    def fine_class_name(fine_label: int) -> str:
        """The name of a global fine label, e.g. ``"circle/ring/red"``."""
        family, variant, c = _parts(fine_label)
        return f"{family}/{variant}/{list(COLOURS[family])[c]}"

    @staticmethod
    def hierarchy() -> torch.Tensor:
        """The ``(54, 2)`` fine → (fine, coarse) table over all fine classes."""
        return hierarchy_table(2)

    @property
    def class_names(self) -> dict[int, str]:
        """Names of the fine classes present in this dataset, keyed by fine label."""
        fine = self.labels[self.labels >= 0] if self.multilabel else self.labels[:, 0]
        return {int(k): SyntheticShapes.fine_class_name(int(k)) for k in torch.unique(fine)}

    def get_image(self, index: int) -> Any:
        """The untransformed PIL RGB image of item ``index``."""
        from PIL import Image

        index = self._check_index(index)
        arr = self._cache.get(index)
        if arr is None:
            arr = self.render(index)
            if self.cache:
                self._cache[index] = arr
        return Image.fromarray(arr)

    def render(self, index: int) -> np.ndarray:
        """Render item ``index`` as a ``(H, W, 3)`` uint8 array (deterministic)."""
        cls, instance = divmod(index, self.num_per_class)
        f, v, c, split_code = self._classes[cls]
        rng = np.random.default_rng((self.seed, split_code, fine_id(f, v, c), instance))
        return render_shapes(rng, [shape_of(fine_id(f, v, c))], self)

    def __repr__(self) -> str:
        fams = [FAMILIES[f] for f in self.family_ids]
        size = f"max_labels={self.max_labels}" if self.multilabel else f"fine_classes={len(self._classes)}"
        return (
            f"{type(self).__name__}(split={self.split!r}, num_items={len(self)}, {size}, "
            f"families={fams}, image_size={self.image_size}, label_names={self.label_names})"
        )


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    base = rng.uniform(50, 205, size=3)
    # low-saturation base colour plus a random linear gradient
    base = 0.6 * base + 0.4 * base.mean()
    angle = rng.uniform(0, 2 * math.pi)
    amp = rng.uniform(0, 45, size=3) * rng.choice([-1.0, 1.0], size=3)
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1) - 0.5
    t = math.cos(angle) * xx + math.sin(angle) * yy
    return base[None, None, :] + t[:, :, None] * amp[None, None, :]


def _coverage(layer: Any, size: int, ss: int) -> np.ndarray:
    """``(size, size, 1)`` fraction of each pixel's ``ss x ss`` supersamples covered by a supersampled 0-255 mask."""
    return (np.asarray(layer, dtype=np.float64) / 255.0).reshape(size, ss, size, ss).mean(axis=(1, 3))[:, :, None]


def _polygon_alpha(
    shape: list, cx: float, cy: float, radius: float, theta: float, aspect: float, size: int, ss: int
) -> np.ndarray:
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
    return _coverage(mask, size, ss)


def render_shapes(
    rng: np.random.Generator,
    shapes: list[tuple[list[tuple[_Poly, int]], Sequence[float]]],
    ds: Any,
    grid: int | None = None,
) -> np.ndarray:
    """The one renderer of the synthetic datasets: a ``(H, W, 3)`` uint8 image of ``shapes`` (``(shape, RGB)`` pairs)
    with the nuisance parameters of ``ds``: background, distractor lines, shapes, illumination, colour cast, noise.
    ``grid=None``: one shape anywhere (radius a fraction of the side; a later line hides earlier ones); ``grid=g``:
    each shape in its own random cell of a ``g x g`` grid (radius a fraction of the cell; lines blended)."""
    from PIL import Image, ImageDraw

    size, ss = ds.image_size, 3  # ss: supersampling factor for anti-aliased edges
    img = background(rng, size)
    lines = []  # supersampled masks of the distractor lines, with their colours
    for _ in range(int(rng.integers(0, ds.clutter + 1)) if ds.clutter > 0 else 0):
        layer = Image.new("L", (size * ss, size * ss), 0)
        x0, y0, x1, y1 = rng.uniform(0, size * ss, size=4)
        ImageDraw.Draw(layer).line([(x0, y0), (x1, y1)], fill=255, width=max(1, int(round(ss * rng.uniform(0.6, 1.4)))))
        lines.append((np.asarray(layer), rng.uniform(0, 255, size=3)))
    hidden, alphas = np.zeros((size * ss, size * ss), dtype=bool), []  # grid=None: a later line hides earlier ones
    for layer, colour in reversed(lines):
        alphas.append((_coverage(np.where(hidden, 0, layer), size, ss), colour))
        hidden |= (layer > 0) & (grid is None)
    for a, colour in reversed(alphas):
        img = img * (1 - 0.8 * a) + 0.8 * a * colour
    cell = size / (grid or 1)
    cells = rng.choice(grid * grid, size=len(shapes), replace=False) if grid else [0]
    for (shape, colour), k in zip(shapes, cells):
        row, col = divmod(int(k), grid or 1)
        radius = rng.uniform(*ds.scale) * cell
        margin = radius * 1.02 if grid is None else min(radius * 1.02, cell / 2)
        theta = math.radians(rng.uniform(-ds.rotation, ds.rotation)) if grid is None else None
        free = grid is not None or cell > 2 * margin  # a shape wider than the image sits in its centre
        cx, cy = (c * cell + (rng.uniform(margin, cell - margin) if free else cell / 2) for c in (col, row))
        if theta is None:  # in a grid the rotation is drawn after the position
            theta = math.radians(rng.uniform(-ds.rotation, ds.rotation))
        alpha = _polygon_alpha(shape, cx, cy, radius, theta, rng.uniform(0.9, 1.1), size, ss)
        jitter = rng.uniform(-ds.colour_jitter, ds.colour_jitter, size=3)
        shade = np.clip(np.asarray(colour, dtype=np.float64) + jitter, 0, 255)
        img = img * (1 - alpha) + alpha * shade[None, None, :]
    img = img * (1.0 + rng.uniform(-ds.illumination, ds.illumination))  # global illumination change
    if ds.colour_cast > 0:  # white balance: one gain per channel for the whole image
        img = img * rng.uniform(1.0 - ds.colour_cast, 1.0 + ds.colour_cast, size=3)[None, None, :]
    if ds.noise > 0:
        img = img + rng.normal(0.0, ds.noise, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


NoiseKind = Literal["uniform", "gaussian", "blobs"]


class SyntheticNoise(RetrievalDatasetBase):
    """Pure-noise images in the SyntheticShapes format (every label ``-1``) as far-OOD data: ``kind`` ``"uniform"``
    (i.i.d. pixels), ``"gaussian"`` (smoothed, around grey) or ``"blobs"`` (a shapes background with blobs)."""

    def __init__(
        self,
        num_images: int = 200,
        image_size: int = 64,
        seed: int = 0,
        kind: NoiseKind = "uniform",
        levels: int = 2,
        transform: Callable | None = None,
    ) -> None:
        for name, value, low in (("num_images", num_images, 1), ("image_size", image_size, 8), ("levels", levels, 1)):
            check_positive_int(name, value, minimum=low)
        self.kind = check_choice("kind", kind, get_args(NoiseKind))
        self.image_size = image_size
        self.seed = int(seed)
        names = level_names(levels) if levels in (2, 3) else [f"level{i}" for i in range(levels)]
        super().__init__(torch.full((num_images, levels), -1, dtype=torch.long), names, transform)

    def get_image(self, index: int) -> Any:
        from PIL import Image, ImageFilter

        index = self._check_index(index)
        rng = np.random.default_rng((self.seed, 99, index))
        s = self.image_size
        if self.kind == "uniform":
            arr = rng.integers(0, 256, size=(s, s, 3), dtype=np.uint8)
            return Image.fromarray(arr)
        if self.kind == "gaussian":
            arr = np.clip(rng.normal(127.5, 60.0, size=(s, s, 3)), 0, 255).astype(np.uint8)
            return Image.fromarray(arr).filter(ImageFilter.GaussianBlur(radius=rng.uniform(0.5, 2.0)))
        img = background(rng, s)
        yy, xx = np.mgrid[0:s, 0:s]
        for _ in range(int(rng.integers(2, 6))):
            cx, cy, r = rng.uniform(0, s), rng.uniform(0, s), rng.uniform(0.05, 0.25) * s
            a = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))[:, :, None]
            img = img * (1 - a) + a * rng.uniform(0, 255, size=3)
        img = img + rng.normal(0.0, 10.0, size=img.shape)
        return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8))
