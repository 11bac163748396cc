"""What a loaded ``config.json`` of a retrieval model may ask for, unless the caller passes ``trust_config=True``;
:func:`untrusted_model_problems` is also the rule of a hub_config's ``model`` section.

A downloaded folder is untrusted: its ``model_args`` reach ``timm.create_model`` and allocate tensors. Without
``trust_config=True``: ``backbone`` is a plain timm name, optionally with a pretrained tag (``"resnet50.a1_in1k"``;
no ``hf-hub:`` / ``local-dir:`` prefix, no path: timm would fetch another repo or read a local folder);
``backbone_kwargs`` holds only the bounded keys of :data:`SAFE_BACKBONE_KWARGS` (never ``checkpoint_path``, which timm
unpickles, nor strings naming a Hub repo or a path); sizes are bounded. Loaded tensors must be plausible for a trained
model (:func:`check_loaded_values`). Every error is a ``ValueError`` naming the file and the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._validation import shorten

__all__ = [
    "MAX_EMBEDDING_SIZE",
    "MAX_IMAGE_SIZE",
    "MAX_NUM_CLASSES",
    "SAFE_BACKBONE_KWARGS",
    "check_loaded_model_args",
    "check_loaded_values",
    "untrusted_model_problems",
]

MAX_EMBEDDING_SIZE = 65_536
MAX_NUM_CLASSES = 100_000
MAX_IMAGE_SIZE = 4096
_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,32}")  # no '/', ':', '.', '~': no path, no URL, no hub id
_BACKBONE_RE = re.compile(r"[A-Za-z0-9_]{1,100}(\.[A-Za-z0-9_]{1,100})?")
Check = tuple[Callable[[Any], bool], str]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _within(low: float, high: float, *, none: bool = False) -> Check:
    kind, what = (_is_int, "an int") if isinstance(low, int) else (_number, "a number")
    return lambda v: (none and v is None) or (kind(v) and low <= v <= high), f"{what} in [{low}, {high}]"


def _image_size(value: Any) -> bool:
    sizes = value if isinstance(value, list) and len(value) == 2 else [value]
    return all(_is_int(v) and 1 <= v <= MAX_IMAGE_SIZE for v in sizes)


_RATE: Check = (lambda v: _number(v) and 0.0 <= v <= 1.0, "a rate in [0, 1]")
_BOOL: Check = (lambda v: v is None or isinstance(v, bool), "a bool")
_NAME: Check = (lambda v: v is None or (isinstance(v, str) and (v == "" or bool(_NAME_RE.fullmatch(v)))),
                "a short name")  # fmt: skip
#: ``timm.create_model`` keyword arguments a loaded config may pass: ``{key: (check, expectation)}``
SAFE_BACKBONE_KWARGS: Mapping[str, Check] = {
    **dict.fromkeys(
        "drop_rate drop_path_rate drop_block_rate attn_drop_rate proj_drop_rate pos_drop_rate patch_drop_rate".split(),
        _RATE,
    ),  # fmt: skip
    **dict.fromkeys(
        "class_token no_embed_class dynamic_img_size dynamic_img_pad qkv_bias qk_norm fc_norm pre_norm "
        "zero_init_last scriptable exportable".split(),
        _BOOL,
    ),  # fmt: skip
    **dict.fromkeys("global_pool stem_type act_layer norm_layer".split(), _NAME),
    "img_size": (_image_size, f"an image size in [1, {MAX_IMAGE_SIZE}]"),
    "in_chans": _within(1, 64),
    "output_stride": _within(8, 32),
    "reg_tokens": _within(0, 64),
    "init_values": _within(0.0, 10.0),
    "layer_scale_init_value": _within(0.0, 10.0),
}


#: the other ``model_args`` of a loaded config: ``{key: (check, expectation)}`` (bounded sizes; strict bools, as
#: ``bool("false")`` is True)
_MODEL_ARGS: Mapping[str, Check] = {
    **dict.fromkeys(("layer_norm", "pretrained"), (lambda v: isinstance(v, bool), "true or false")),
    "embedding_size": _within(1, MAX_EMBEDDING_SIZE, none=True),
    "num_classes": _within(0, MAX_NUM_CLASSES),
    "image_size": _within(1, MAX_IMAGE_SIZE, none=True),
    "gem_p": (lambda v: _number(v) and 0.0 < v <= 100.0, "a number in (0, 100]"),
    **dict.fromkeys(
        ("mean", "std"),
        (lambda v: v is None or (isinstance(v, list) and all(map(_number, v))), "None or a list of finite numbers"),
    ),
}


def untrusted_model_problems(args: Mapping[str, Any], where: str) -> list[str]:
    """The one rule for a model section written by someone else — a loaded ``config.json`` (``model_args``) and a
    hub_config (``model``) alike: ``backbone`` a plain timm name, ``backbone_kwargs`` only the bounded keys of
    :data:`SAFE_BACKBONE_KWARGS`. ``where`` prefixes the key in the messages (``"model."``); ``[]``: allowed."""
    problems = []
    backbone = args.get("backbone")
    if "backbone" in args and (not isinstance(backbone, str) or not _BACKBONE_RE.fullmatch(backbone)):
        problems.append(
            f"{where}backbone must be a plain timm model name (e.g. 'resnet50', 'resnet50.a1_in1k'); got "
            f"{shorten(repr(backbone), 80)} (hf-hub:/local-dir: names and paths make timm fetch or read other files)"
        )
    kwargs = args.get("backbone_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        return [*problems, f"{where}backbone_kwargs must be a dict; got {type(kwargs).__name__}"]
    for key, value in (kwargs or {}).items():
        at = f"{where}backbone_kwargs[{shorten(repr(key), 40)}]"
        if key not in SAFE_BACKBONE_KWARGS:
            problems.append(f"{at} is not allowed (allowed: {sorted(SAFE_BACKBONE_KWARGS)}); keyword arguments such "
                            "as checkpoint_path or pretrained_cfg make timm read files or fetch repos")  # fmt: skip
        elif not (check := SAFE_BACKBONE_KWARGS[key])[0](value):
            problems.append(f"{at} must be {check[1]}; got {shorten(repr(value), 80)}")
    return problems


def check_loaded_model_args(model_args: Mapping[str, Any], source: str | Path, *, skip: Collection[str] = ()) -> None:
    """Refuse a loaded ``RetrievalModel`` config (``model_args``, read from the file ``source``) that is unsafe or
    implausible (see the module docstring); ``skip``: keys the caller overrides (not used, so not checked).

    Raises:
        ValueError: Naming ``source`` and the offending key.
    """
    args = {k: v for k, v in model_args.items() if k not in skip}
    problems = untrusted_model_problems(args, f"{source}: model_args.")
    if problems:
        raise ValueError(f"{problems[0]} in a loaded config: pass trust_config=True only for a trusted file")
    for key, (check, expected) in _MODEL_ARGS.items():
        if key in args and not check(args[key]):
            got = shorten(repr(args[key]), 80)
            raise ValueError(f"{source}: model_args.{key} must be {expected} in a loaded config; got {got} (pass "
                             "trust_config=True only for a trusted file)")  # fmt: skip


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
