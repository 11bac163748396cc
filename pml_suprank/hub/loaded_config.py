"""What a loaded ``config.json`` of a retrieval model may ask for, unless the caller passes ``trust_config=True``;
the ``backbone`` / ``backbone_kwargs`` rule (:func:`untrusted_model_problems`) is also the rule of a hub_config's
``model`` section.

A downloaded folder is untrusted: its ``model_args`` reach ``timm.create_model`` and allocate tensors. Without
``trust_config=True``:

* ``backbone`` must be a plain timm model name, optionally with a pretrained tag (``"resnet50"``,
  ``"resnet50.a1_in1k"``): no ``hf-hub:`` / ``local-dir:`` prefix (timm would fetch another repo or read a local
  folder), no path;
* ``backbone_kwargs`` may only hold the keyword arguments of :data:`SAFE_BACKBONE_KWARGS` (dropout rates, image size,
  input channels, output stride, pooling name, a few booleans), each with a bounded value. Refused are, e.g.,
  ``checkpoint_path`` (timm would unpickle that file), ``pretrained_cfg`` / ``pretrained_cfg_overlay`` (files, Hub
  ids), ``pretrained`` and any string naming a Hub repo or a path;
* sizes are bounded: ``embedding_size <= MAX_EMBEDDING_SIZE``, ``num_classes <= MAX_NUM_CLASSES``,
  ``image_size <= MAX_IMAGE_SIZE`` (``embedding_size: 1e9`` would otherwise try a 384 GB allocation).

Loaded tensors must also be plausible for a trained model (:func:`check_loaded_values`). Every error is a
``ValueError`` naming the ``config.json`` (or weights) file and the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "MAX_EMBEDDING_SIZE",
    "MAX_IMAGE_SIZE",
    "MAX_NUM_CLASSES",
    "SAFE_BACKBONE_KWARGS",
    "check_loaded_model_args",
    "check_loaded_values",
    "hub_config_model_problems",
    "shown",
    "untrusted_model_problems",
]

MAX_EMBEDDING_SIZE = 65_536
MAX_NUM_CLASSES = 100_000
MAX_IMAGE_SIZE = 4096

_RATE, _BOOL, _SIZE, _NAME = "rate in [0, 1]", "bool", f"image size in [1, {MAX_IMAGE_SIZE}]", "short name"

#: ``timm.create_model`` keyword arguments a loaded config may pass, with the kind of value each accepts.
SAFE_BACKBONE_KWARGS: Mapping[str, Any] = {
    **dict.fromkeys(
        (
            "drop_rate",
            "drop_path_rate",
            "drop_block_rate",
            "attn_drop_rate",
            "proj_drop_rate",
            "pos_drop_rate",
            "patch_drop_rate",
        ),
        _RATE,
    ),
    **dict.fromkeys(
        (
            "class_token",
            "no_embed_class",
            "dynamic_img_size",
            "dynamic_img_pad",
            "qkv_bias",
            "qk_norm",
            "fc_norm",
            "pre_norm",
            "zero_init_last",
            "scriptable",
            "exportable",
        ),
        _BOOL,
    ),
    "img_size": _SIZE,
    "in_chans": (1, 64),
    "output_stride": (8, 32),
    "reg_tokens": (0, 64),
    "init_values": (0.0, 10.0),
    "layer_scale_init_value": (0.0, 10.0),
    **dict.fromkeys(("global_pool", "stem_type", "act_layer", "norm_layer"), _NAME),
}

_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,32}")  # no '/', ':', '.', '~': no path, no URL, no hub id
_BACKBONE_RE = re.compile(r"[A-Za-z0-9_]{1,100}(\.[A-Za-z0-9_]{1,100})?")


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages never echo a whole (possibly huge) loaded value."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kwarg_problem(key: str, value: Any, where: str) -> str | None:
    """Why ``backbone_kwargs[key] = value`` is refused (``None``: allowed); ``where`` names the mapping."""
    at = f"{where}backbone_kwargs[{shown(key, 40)}]"
    if key not in SAFE_BACKBONE_KWARGS:
        return (
            f"{at} is not allowed (allowed: {sorted(SAFE_BACKBONE_KWARGS)}); keyword arguments such as "
            "checkpoint_path or pretrained_cfg make timm read files or fetch repos"
        )
    kind = SAFE_BACKBONE_KWARGS[key]
    if kind == _RATE:
        ok = _number(value) and 0.0 <= value <= 1.0
    elif kind == _BOOL:
        ok = isinstance(value, bool) or value is None
    elif kind == _SIZE:
        sizes = value if isinstance(value, list) and len(value) == 2 else [value]
        ok = all(_is_int(v) and 1 <= v <= MAX_IMAGE_SIZE for v in sizes)
    elif kind == _NAME:
        ok = value is None or (isinstance(value, str) and (value == "" or bool(_NAME_RE.fullmatch(value))))
    else:
        low, high = kind
        ok = (_is_int(value) if isinstance(low, int) else _number(value)) and low <= value <= high
    if ok:
        return None
    expected = kind if isinstance(kind, str) else f"a number in [{kind[0]}, {kind[1]}]"
    return f"{at} must be a {expected}; got {shown(value)}"


def untrusted_model_problems(args: Mapping[str, Any], where: str) -> list[str]:
    """The one rule for a model section written by someone else — a loaded ``config.json`` (``model_args``) and a
    hub_config (``model``) alike: ``backbone`` a plain timm name (no ``hf-hub:`` / ``local-dir:`` prefix, no path),
    ``backbone_kwargs`` only the bounded keys of :data:`SAFE_BACKBONE_KWARGS` (no ``checkpoint_path``, no
    ``pretrained_cfg``...).

    Args:
        args: The model section (keys ``backbone`` / ``backbone_kwargs`` when present).
        where: Prefix naming the section in the messages (e.g. ``"config.json: model_args."``, ``"model."``).

    Returns:
        One message per problem (``[]``: allowed).
    """
    problems = []
    backbone = args.get("backbone")
    if "backbone" in args and (not isinstance(backbone, str) or not _BACKBONE_RE.fullmatch(backbone)):
        problems.append(
            f"{where}backbone must be a plain timm model name (e.g. 'resnet50', 'resnet50.a1_in1k'); got "
            f"{shown(backbone)} (hf-hub:/local-dir: names and paths make timm fetch or read other files)"
        )
    kwargs = args.get("backbone_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        problems.append(f"{where}backbone_kwargs must be a dict; got {type(kwargs).__name__}")
    elif kwargs:
        problems += [p for key, value in kwargs.items() if (p := _kwarg_problem(key, value, where)) is not None]
    return problems


def hub_config_model_problems(config: Mapping[str, Any]) -> list[str]:
    """:func:`untrusted_model_problems` of a hub_config's ``model`` section (a hub_config is a shared file, held to
    the rule of a loaded ``config.json``); ``[]`` when it has none."""
    model = config.get("model")
    if not isinstance(model, Mapping):
        return []
    hint = " — a hub_config is held to the rule of a loaded config.json; set it from Python or the command line instead"
    return [f"{p}{hint}" for p in untrusted_model_problems(model, "model.")]


def _check_size(args: Mapping[str, Any], key: str, maximum: int, source: Path, *, minimum: int = 1) -> None:
    value = args.get(key)
    if value is None and key != "num_classes":
        return
    if value is None or not _is_int(value) or not minimum <= value <= maximum:
        raise ValueError(
            f"{source}: model_args.{key} must be an int in [{minimum}, {maximum}] in a loaded config; got "
            f"{shown(value)} (pass trust_config=True to load a trusted file with larger sizes)"
        )


def check_loaded_model_args(model_args: Mapping[str, Any], source: str | Path, *, skip: Collection[str] = ()) -> None:
    """Refuse a loaded ``RetrievalModel`` config that is unsafe or implausible (see the module docstring).

    Args:
        model_args: ``config["model_args"]``.
        source: The ``config.json`` path (named in the errors).
        skip: Keys the caller overrides (their saved values are not used, so not checked).

    Raises:
        ValueError: Naming ``source`` and the offending key.
    """
    source = Path(source)
    args = {k: v for k, v in model_args.items() if k not in skip}
    problems = untrusted_model_problems(args, f"{source}: model_args.")
    if problems:
        raise ValueError(f"{problems[0]} in a loaded config: pass trust_config=True only for a trusted file")
    for key in ("layer_norm", "pretrained"):  # strictly typed: bool("false") is True
        if key in args and not isinstance(args[key], bool):
            raise ValueError(f"{source}: model_args.{key} must be true or false; got {shown(args[key], 64)}")
    _check_size(args, "embedding_size", MAX_EMBEDDING_SIZE, source)
    if "num_classes" in args:
        _check_size(args, "num_classes", MAX_NUM_CLASSES, source, minimum=0)
    _check_size(args, "image_size", MAX_IMAGE_SIZE, source)
    gem_p = args.get("gem_p", 3.0)
    if not _number(gem_p) or not 0.0 < gem_p <= 100.0:
        raise ValueError(f"{source}: model_args.gem_p must be a number in (0, 100]; got {shown(gem_p)}")
    for key in ("mean", "std"):
        value = args.get(key)
        if value is not None and (not isinstance(value, list) or not all(_number(v) for v in value)):
            raise ValueError(f"{source}: model_args.{key} must be None or a list of finite numbers; got {shown(value)}")


def check_loaded_values(state: Mapping[str, Tensor], source: str | Path) -> None:
    """Refuse tensors no trained ``RetrievalModel`` holds: an all-zero projection weight, a GeM exponent ``<= 0``,
    a negative BatchNorm running variance (``ValueError`` naming ``source`` and the key). Shapes, dtypes and
    finiteness are checked against the rebuilt module by :func:`~pml_suprank.hub.serialization.check_state`."""
    for name, value in state.items():
        if not isinstance(value, Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        if name == "projection.weight" and not bool((value != 0).any()):
            raise ValueError(f"{source}: tensor {name!r} is all zeros (every embedding would be 0); corrupt file?")
        if name == "pool.gem.p" and not bool((value > 0).all()):
            raise ValueError(f"{source}: tensor {name!r} (the GeM exponent) must be > 0; got {value.tolist()}")
        if name.endswith("running_var") and bool((value.to(torch.float64) < 0).any()):
            raise ValueError(f"{source}: tensor {name!r} (a BatchNorm variance) has negative values; corrupt file?")
