"""Training and evaluation image transforms: timm's :func:`timm.data.create_transform` driven by a backbone's data
config (resolution, interpolation, normalisation, evaluation crop) and the training augmentation's arguments. timm
draws from the global generators: the training loop seeds them per ``(seed, epoch, item)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._validation import check_choice, check_positive, check_positive_int, check_probability

__all__ = ["CROP_MODES", "build_transforms"]

#: evaluation crop modes of timm (``data_config["crop_mode"]``)
CROP_MODES = ("center", "squash", "border")
_INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "box", "hamming", "lanczos")
_DEFAULT_CROP_PCT = 0.875


def check_pair(name: str, value: Sequence[float], high: float | None) -> tuple[float, float]:
    ok = isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
    ok = ok and 0 < value[0] <= value[1] and (high is None or value[1] <= high)
    if not ok:
        bound = f" <= {high}" if high is not None else ""
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high{bound}; got {value!r}")
    return float(value[0]), float(value[1])


def build_transforms(
    data_config: dict[str, Any],
    train: bool,
    *,
    scale: Sequence[float] = (0.16, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    hflip: float = 0.5,
    color_jitter: float | None = None,
    auto_augment: str | None = None,
    re_prob: float = 0.0,
    re_mode: str = "pixel",
    re_count: int = 1,
) -> Callable:
    """Image transforms from a timm data config (:func:`timm.data.create_transform`): training = random resized crop
    + flip (+ colour jitter or ``auto_augment``) + normalise (+ random erasing); evaluation = timm's ``crop_pct`` /
    ``crop_mode`` crop (``"center"``, ``"squash"``, ``"border"``) + normalise.

    Args:
        data_config: ``input_size`` ``(3, H, W)``, ``mean``, ``std`` and optionally ``interpolation`` (bilinear),
            ``crop_pct`` (0.875) and ``crop_mode`` (:data:`CROP_MODES`), e.g. ``model.data_config``.
        train: Training (random) or evaluation pipeline; the other arguments are training only.
        scale, ratio, hflip: Area and aspect-ratio ranges of the random crop, flip probability.
        color_jitter: Jitter strength or None (left out with ``auto_augment``).
        auto_augment: timm policy string, e.g. ``"rand-m9-mstd0.5"``, ``"augmix-m5-w4-d2"``; or None.
        re_prob, re_mode, re_count: Random erasing: probability, fill (``"pixel"``, ``"rand"``, ``"const"``), most
            rectangles per image.

    Returns:
        A callable mapping a PIL RGB image to a normalised ``(3, H, W)`` float tensor.

    Example:
        >>> tf = build_transforms({"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.5,) * 3}, train=True,
        ...                       auto_augment="rand-m9-mstd0.5", re_prob=0.25)
        >>> from PIL import Image
        >>> tf(Image.new("RGB", (40, 30))).shape
        torch.Size([3, 32, 32])
    """
    from timm.data import create_transform

    if not isinstance(data_config, dict):
        raise TypeError(f"data_config must be a dict (e.g. model.data_config); got {type(data_config).__name__}")
    missing = [k for k in ("input_size", "mean", "std") if k not in data_config]
    if missing:
        raise ValueError(f"data_config is missing {missing}; got keys {sorted(data_config)}")
    input_size = tuple(data_config["input_size"])
    if len(input_size) != 3 or any(int(s) <= 0 for s in input_size):
        raise ValueError(f"data_config['input_size'] must be (3, H, W); got {input_size}")
    size = (int(input_size[1]), int(input_size[2]))
    interpolation = str(data_config.get("interpolation") or "bilinear")
    check_choice("data_config['interpolation']", interpolation, _INTERPOLATIONS)
    common = {"mean": tuple(data_config["mean"]), "std": tuple(data_config["std"]), "interpolation": interpolation}
    scale, ratio = check_pair("scale", scale, 1.0), check_pair("ratio", ratio, None)
    hflip = check_probability("hflip", hflip)
    if color_jitter is not None:
        check_positive("color_jitter", color_jitter, strict=False)
    if auto_augment is not None and (not isinstance(auto_augment, str) or not auto_augment):
        raise ValueError(f"auto_augment must be None or a timm policy string such as 'rand-m9-mstd0.5'; got "
                         f"{auto_augment!r}")  # fmt: skip
    re_prob = check_probability("re_prob", re_prob)
    check_choice("re_mode", re_mode, ("pixel", "rand", "const"))
    check_positive_int("re_count", re_count)
    crop_pct = _DEFAULT_CROP_PCT if data_config.get("crop_pct") is None else data_config["crop_pct"]
    if isinstance(crop_pct, bool) or not isinstance(crop_pct, (int, float)) or not 0 < crop_pct <= 1:
        raise ValueError(f"data_config['crop_pct'] must lie in (0, 1]; got {crop_pct!r}")
    crop_mode = check_choice("data_config['crop_mode']", data_config.get("crop_mode") or "center", CROP_MODES)
    if not train:
        return create_transform(size, is_training=False, crop_pct=float(crop_pct), crop_mode=crop_mode, **common)
    try:
        return create_transform(
            size, is_training=True, scale=scale, ratio=ratio, hflip=hflip, color_jitter=color_jitter,
            auto_augment=auto_augment, re_prob=re_prob, re_mode=re_mode, re_count=re_count, **common,
        )  # fmt: skip
    except (AssertionError, KeyError, ValueError, IndexError) as err:  # timm's parsing of the policy string
        raise ValueError(
            f"auto_augment must be a timm policy string such as 'rand-m9-mstd0.5' or 'augmix-m5-w4-d2'; got "
            f"{auto_augment!r} ({type(err).__name__}: {err})"
        ) from err
