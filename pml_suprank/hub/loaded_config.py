"""What a loaded ``config.json`` of a retrieval model may ask for unless the caller passes ``trust_config=True``
(:func:`check_loaded_model_args`; loaded tensors: :func:`~pml_suprank.hub.serialization.check_loaded_values`).

Its ``model_args`` reach ``timm.create_model`` and allocate tensors, so (:func:`untrusted_model_problems`, also the rule
of a hub_config's ``model``) ``backbone`` is a plain timm name (``"resnet50.a1_in1k"``; no ``hf-hub:`` / ``local-dir:``
prefix, no path: timm would fetch another repo or read a local folder), ``backbone_kwargs`` holds only the bounded keys
of :data:`SAFE_BACKBONE_KWARGS` (no ``checkpoint_path``, which timm unpickles); sizes are bounded, booleans strict.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from .._validation import OptionCheck, is_bool, is_int, is_number, optional, shorten

__all__ = ["MAX_EMBEDDING_SIZE", "MAX_IMAGE_SIZE", "MAX_NUM_CLASSES", "SAFE_BACKBONE_KWARGS", "check_loaded_model_args",
           "untrusted_model_problems"]  # fmt: skip

MAX_EMBEDDING_SIZE = 65_536
MAX_NUM_CLASSES = 100_000
MAX_IMAGE_SIZE = 4096
_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,32}")  # no '/', ':', '.', '~': no path, no URL, no hub id; not empty
_BACKBONE_RE = re.compile(r"[A-Za-z0-9_]{1,100}(\.[A-Za-z0-9_]{1,100})?")
MIN_STD, MAX_NORMALIZE = 1e-3, 10.0  #: a loaded mean / std keeps normalised pixels within about ±10⁴ (finite features)
_SIZE = is_int(1, MAX_IMAGE_SIZE)


def _channels(low: float, high: float) -> OptionCheck:
    """``null`` or a list of numbers in ``[low, high]`` (one per channel; the constructor checks that there are 3)."""
    number = is_number(low, high=high)
    return OptionCheck(lambda v: v is None or (isinstance(v, list) and all(map(number, v))),
                       f"null or a list of numbers in [{low:g}, {high:g}]")  # fmt: skip


#: ``timm.create_model`` keyword arguments a loaded config may pass, each with its value check
SAFE_BACKBONE_KWARGS: Mapping[str, OptionCheck] = {
    **dict.fromkeys("drop_rate drop_path_rate drop_block_rate attn_drop_rate proj_drop_rate pos_drop_rate "
                    "patch_drop_rate".split(), is_number(0, high=1)),
    **dict.fromkeys("class_token no_embed_class dynamic_img_size dynamic_img_pad qkv_bias qk_norm fc_norm pre_norm "
                    "zero_init_last scriptable exportable".split(), optional(is_bool())),
    **dict.fromkeys("global_pool stem_type act_layer norm_layer".split(), OptionCheck(
        lambda v: v is None or (isinstance(v, str) and bool(_NAME_RE.fullmatch(v))), "a short name")),
    "img_size": OptionCheck(lambda v: all(map(_SIZE, v if isinstance(v, list) and len(v) == 2 else [v])),
                            f"an image size in [1, {MAX_IMAGE_SIZE}] or two of them"),
    "in_chans": is_int(1, 64),
    "output_stride": OptionCheck(lambda v: type(v) is int and v in (8, 16, 32), "8, 16 or 32"),  # timm asserts it
    "reg_tokens": is_int(0, 64),
    **dict.fromkeys(("init_values", "layer_scale_init_value"), is_number(0, high=10)),
}  # fmt: skip
#: the other ``model_args`` of a loaded config, likewise
_MODEL_ARGS: Mapping[str, OptionCheck] = {
    **dict.fromkeys(("layer_norm", "pretrained"), is_bool()),
    "embedding_size": optional(is_int(1, MAX_EMBEDDING_SIZE)),
    "num_classes": is_int(0, MAX_NUM_CLASSES),
    "image_size": optional(_SIZE),
    "gem_p": is_number(0, strict=True, high=100),
    "mean": _channels(-MAX_NORMALIZE, MAX_NORMALIZE),
    "std": _channels(MIN_STD, MAX_NORMALIZE),
}  # fmt: skip


def untrusted_model_problems(args: Mapping[str, Any], where: str) -> list[str]:
    """What the module docstring's rule refuses in a model section written by someone else (a loaded ``model_args``,
    a hub_config's ``model``); ``where`` prefixes the key in the messages (``"model."``); ``[]``: allowed."""
    problems = []
    backbone = args.get("backbone")
    if "backbone" in args and not (isinstance(backbone, str) and _BACKBONE_RE.fullmatch(backbone)):
        problems.append(f"{where}backbone must be a plain timm model name (e.g. 'resnet50', 'resnet50.a1_in1k'); got "
                        f"{shorten(repr(backbone), 80)} (hf-hub:/local-dir: names and paths make timm fetch or read "
                        "other files)")  # fmt: skip
    kwargs = args.get("backbone_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        return [*problems, f"{where}backbone_kwargs must be a dict; got {type(kwargs).__name__}"]
    for key, value in (kwargs or {}).items():
        at = f"{where}backbone_kwargs[{shorten(repr(key), 40)}]"
        if key not in SAFE_BACKBONE_KWARGS:
            problems.append(f"{at} is not allowed (allowed: {sorted(SAFE_BACKBONE_KWARGS)}); keyword arguments such "
                            "as checkpoint_path or pretrained_cfg make timm read files or fetch repos")  # fmt: skip
        elif not (check := SAFE_BACKBONE_KWARGS[key])(value):
            problems.append(f"{at} must be {check.expected}; got {shorten(repr(value), 80)}")
    return problems


def check_loaded_model_args(model_args: Mapping[str, Any], source: str | Path, *, skip: Collection[str] = ()) -> None:
    """Refuse a loaded ``RetrievalModel`` config (``model_args``, read from the file ``source``) that is unsafe or
    implausible (see the module docstring; ``ValueError`` naming ``source`` and the first offending key); ``skip``:
    keys the caller overrides (not used, so not checked)."""
    args, where = {k: v for k, v in model_args.items() if k not in skip}, f"{source}: model_args."
    problems = untrusted_model_problems(args, where) + [
        f"{where}{key} must be {check.expected}; got {shorten(repr(args[key]), 80)}"
        for key, check in _MODEL_ARGS.items() if key in args and not check(args[key])
    ]  # fmt: skip
    if problems:
        raise ValueError(f"{problems[0]} in a loaded config: pass trust_config=True only for a trusted file")
