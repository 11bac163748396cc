"""Datasets for retrieval training and evaluation: Hugging Face ``datasets`` loading with several label columns,
open-set class splits, timm transforms, and the built-in SyntheticShapes.

Every dataset returned here follows one contract (see :mod:`pml_suprank._retrieval_dataset`):
``ds[i] = {"image": FloatTensor (3, H, W), "labels": LongTensor (L,), "index": i}`` with label column 0 the finest,
``ds.labels`` a ``(N, L)`` LongTensor readable without decoding images, ``ds.label_names`` the column names
(fine → coarse), ``ds.set_transform(fn)`` with ``fn`` a callable on a PIL image, and ``ds.get_image(i)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ._retrieval_dataset import RetrievalDatasetBase, pil_to_tensor
from .synthetic_shapes import COLOURS, FAMILIES, SyntheticNoise, SyntheticShapes

__all__ = [
    "COLOURS",
    "FAMILIES",
    "RetrievalDatasetBase",
    "SyntheticNoise",
    "SyntheticShapes",
    "build_transforms",
    "collate",
    "pil_to_tensor",
]


def build_transforms(
    data_config: dict[str, Any],
    train: bool,
    *,
    scale: Sequence[float] = (0.16, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    hflip: float = 0.5,
) -> Callable:
    """Image transforms from a timm data config (``model.data_config`` / ``timm.data.resolve_model_data_config``).

    Training: ``RandomResizedCrop(size, scale, ratio)`` + horizontal flip + ``ToTensor`` + ``Normalize`` (the
    reference recipes, ranking_reference.md §5: scale (0.16, 1)). Test: ``Resize(floor(size / crop_pct))`` +
    ``CenterCrop(size)`` + ``ToTensor`` + ``Normalize`` (Resize 256 + CenterCrop 224 for ``crop_pct = 0.875``).

    Args:
        data_config: Dict with ``input_size`` ``(3, H, W)``, ``mean``, ``std`` and optionally ``interpolation``
            (``"bilinear"``/``"bicubic"``, default bilinear) and ``crop_pct`` (default 0.875).
        train: Training (random crop + flip) or test (deterministic) pipeline.
        scale: Area range of the random crop (training only).
        ratio: Aspect-ratio range of the random crop (training only).
        hflip: Probability of a horizontal flip (training only).

    Returns:
        A callable mapping a PIL image to a normalised ``(3, H, W)`` float tensor.
    """
    from torchvision import transforms as T

    if not isinstance(data_config, dict):
        raise TypeError(f"data_config must be a dict (e.g. model.data_config); got {type(data_config).__name__}")
    missing = [k for k in ("input_size", "mean", "std") if k not in data_config]
    if missing:
        raise ValueError(f"data_config is missing {missing}; got keys {sorted(data_config)}")
    input_size = tuple(data_config["input_size"])
    if len(input_size) != 3 or any(int(s) <= 0 for s in input_size):
        raise ValueError(f"data_config['input_size'] must be (3, H, W); got {input_size}")
    size = (int(input_size[1]), int(input_size[2]))
    if not (len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1):
        raise ValueError(f"scale must be (low, high) with 0 < low <= high <= 1; got {tuple(scale)}")
    if not (len(ratio) == 2 and 0 < ratio[0] <= ratio[1]):
        raise ValueError(f"ratio must be (low, high) with 0 < low <= high; got {tuple(ratio)}")
    if not 0 <= hflip <= 1:
        raise ValueError(f"hflip must be a probability in [0, 1]; got {hflip}")
    interp_name = str(data_config.get("interpolation", "bilinear") or "bilinear")
    interpolation = {
        "bilinear": T.InterpolationMode.BILINEAR,
        "bicubic": T.InterpolationMode.BICUBIC,
        "nearest": T.InterpolationMode.NEAREST,
    }.get(interp_name, T.InterpolationMode.BILINEAR)
    normalize = T.Normalize(mean=list(data_config["mean"]), std=list(data_config["std"]))
    if train:
        steps = [T.RandomResizedCrop(size, scale=tuple(scale), ratio=tuple(ratio), interpolation=interpolation)]
        if hflip > 0:
            steps.append(T.RandomHorizontalFlip(p=hflip))
    else:
        crop_pct = float(data_config.get("crop_pct", 0.875) or 0.875)
        if not 0 < crop_pct <= 1:
            raise ValueError(f"data_config['crop_pct'] must lie in (0, 1]; got {crop_pct}")
        resize = tuple(int(math.floor(s / crop_pct)) for s in size)
        steps = [T.Resize(resize if size[0] != size[1] else resize[0], interpolation=interpolation), T.CenterCrop(size)]
    return T.Compose([*steps, T.ToTensor(), normalize])


def collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate dataset items into ``{"image": (B, 3, H, W), "labels": (B, L), "index": (B,)}``."""
    import torch

    return {
        "image": torch.stack([it["image"] for it in items]),
        "labels": torch.stack([it["labels"] for it in items]),
        "index": torch.tensor([int(it["index"]) for it in items], dtype=torch.long),
    }
