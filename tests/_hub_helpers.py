"""Test helpers over a loaded hub_config dict: its options flattened / nested, the RetrievalModel kwargs and the
datasets it names (the package reads a hub_config as a RunSpec; these views serve the tests only)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pml_suprank.data.source import data_option_errors, dataset_source
from pml_suprank.training.options import LOCATIONS, config_layer


def recipe_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The option sections of a hub_config as ``{option name: value}`` (``config_layer`` without the places)."""
    return {name: value for name, (_, value) in config_layer(config).items()}


def flat_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The option sections flattened to ``{recipe option: value}`` (metadata — ``hub``, ``loss.name`` — dropped)."""
    out = recipe_options(config)
    out.pop("loss", None)
    return out


def nest_options(values: Mapping[str, Any], *, drop_none: bool = True) -> dict[str, Any]:
    """The inverse of ``recipe_options``: option values as hub_config sections (non-file options ignored, and
    ``None`` values with ``drop_none``)."""
    where = {name: (section, key) for (section, key), (_, name) in LOCATIONS.items()}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in where and not (drop_none and value is None):
            section, key = where[name]
            out.setdefault(section, {})[key] = list(value) if isinstance(value, tuple) else value
    return out


def model_kwargs(config: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """Constructor kwargs of ``pml_suprank.models.RetrievalModel`` for this setting."""
    model = dict(config.get("model") or {})
    keys = ("backbone", "pretrained", "pooling", "embedding_size", "layer_norm", "backbone_kwargs", "projection_init")
    kwargs = {k: model[k] for k in keys if k in model}
    kwargs.update({k: model[k] for k in ("crop_pct", "crop_mode") if model.get(k) is not None})
    image_size = (config.get("data") or {}).get("image_size")
    if image_size is not None:
        kwargs["image_size"] = image_size
    kwargs.update(overrides)
    return kwargs


def build_dataset(
    config: Mapping[str, Any], part: str, transform: Any = None, *, seed: int = 0,
    data_root: str | Path | None = None, **kwargs: Any,
) -> Any:  # fmt: skip
    """The ``part`` (``"train"`` / ``"test"``) dataset of this setting (``data_root`` replaces ``data.data_root``);
    ``ValueError`` for an inconsistent ``data`` section."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test'; got {part!r}")
    data = dict(config.get("data") or {})
    if data_root is not None:
        data["data_root"] = str(data_root)
    errors = data_option_errors(data, require_root=True)
    if errors:
        raise ValueError("data options: " + "; ".join(errors))
    return dataset_source(data, part).load(transform, seed=seed, **kwargs)
