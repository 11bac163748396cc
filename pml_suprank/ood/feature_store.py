"""Save and load extracted OOD feature sets and the classifier head (``fit_heat`` writes them, ``ood_benchmark``
reads them back, so that nothing is embedded twice)::

    ood.save_features("features.safetensors", {"id_train": train, "id_test": test, "svhn": svhn}, head=fc)
    saved = ood.load_features("features.safetensors")
    saved.sets["id_train"].features, saved.weight, saved.metadata

One safetensors file: tensors ``"<i>.features"``, ``"<i>.std_features"``, ``"<i>.logits"``, ``"<i>.labels"`` of the
``i``-th set and ``"head.weight"`` / ``"head.bias"``; set names and metadata are JSON in the header.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from .._safe_json import loads_json
from ..hub.schema import TensorSpec, check_schema
from .base import head_params
from .features import OODFeatures

__all__ = ["FEATURES_FORMAT", "SavedFeatures", "save_features", "load_features"]

FEATURES_FORMAT = "pml_suprank.ood.features/1"
_FIELDS = ("features", "std_features", "logits", "labels")


@dataclass
class SavedFeatures:
    """Feature sets read by :func:`load_features`: ``sets`` ``{name: OODFeatures}`` in the saved order, the head
    ``weight`` ``(C, D)`` / ``bias`` ``(C,)`` (or ``None``) and the ``metadata`` given to :func:`save_features`."""

    sets: dict[str, OODFeatures]
    weight: Tensor | None = None
    bias: Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def _as_features(name: str, value: Any) -> OODFeatures:
    if isinstance(value, OODFeatures):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("features"), Tensor):
        return OODFeatures(value["features"], value.get("std_features"), value.get("logits"), value.get("labels"))
    raise TypeError(f"sets[{name!r}] must be an OODFeatures or a dict with a 'features' tensor; got {type(value)}")


def save_features(
    path: str | Path,
    sets: Mapping[str, OODFeatures | Mapping[str, Tensor]],
    *,
    head: nn.Module | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``sets`` ``{name: OODFeatures or dict with "features"}``, the optional head (``head`` or ``weight``
    ``(C, D)`` / ``bias`` ``(C,)``) and JSON ``metadata`` to the safetensors file ``path``. Returns the path."""
    from safetensors.torch import save_file

    if not isinstance(sets, Mapping) or not sets:
        raise ValueError(f"sets must be a non-empty mapping name -> features; got {type(sets).__name__}")
    tensors: dict[str, Tensor] = {}
    names = []
    for i, (name, value) in enumerate(sets.items()):
        if not isinstance(name, str) or not name:
            raise TypeError(f"set names must be non-empty strings; got {name!r}")
        feats = _as_features(name, value)
        names.append(name)
        for key in _FIELDS:
            t = getattr(feats, key)
            if t is not None:
                tensors[f"{i}.{key}"] = t.detach().cpu().contiguous()
    if head is not None or weight is not None:
        w, b = head_params(weight, bias, head)
        tensors["head.weight"] = w.cpu().contiguous()
        if b is not None:
            tensors["head.bias"] = b.cpu().contiguous()
    header = {"format": FEATURES_FORMAT, "sets": json.dumps(names), "metadata": json.dumps(dict(metadata or {}))}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=header)
    return path


def load_features(path: str | Path) -> SavedFeatures:
    """Read a file written by :func:`save_features`, checking every tensor (``ValueError`` naming file and key)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (write it with ood.save_features or pml-suprank-fit-heat)")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            if header.get("format") != FEATURES_FORMAT:  # a foreign file: refused before its tensors are read
                raise ValueError(
                    f"{path} is not a feature file (header format {header.get('format')!r}, expected "
                    f"{FEATURES_FORMAT!r}; write one with ood.save_features or fit_heat)"
                )
            state = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except ValueError:
        raise
    except Exception as err:  # SafetensorError (not a safetensors file, a truncated one), OSError
        raise ValueError(f"{path} is not a readable safetensors feature file ({type(err).__name__}: {err})") from None
    try:
        names, metadata = loads_json(header["sets"], path), loads_json(header.get("metadata", "{}"), path)
    except (KeyError, ValueError) as err:
        raise ValueError(f"{path}: unreadable header entry 'sets' / 'metadata' ({err})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{path}: header entry 'sets' must be a list of distinct names; got {names!r}")
    head = "head.weight" in state
    spec = {"head.weight": TensorSpec(("C", "D"), optional=True), "head.bias": TensorSpec(("C",), optional=True)}
    for i in range(len(names)):  # per set: N rows; D and C shared with the head when the file has one
        d, c = ("D", "C") if head else (f"{i}.D", f"{i}.C")
        labels = state.get(f"{i}.labels")
        spec |= {
            f"{i}.features": TensorSpec((f"{i}.N", d)),
            f"{i}.std_features": TensorSpec((f"{i}.N", d), optional=True),
            f"{i}.logits": TensorSpec((f"{i}.N", c), optional=True),
            f"{i}.labels": TensorSpec(
                (f"{i}.N", f"{i}.L")[: 2 if labels is not None and labels.dim() > 1 else 1], "integer", optional=True
            ),
        }
    check_schema(state, path, spec)
    if "head.bias" in state and not head:
        raise ValueError(f"{path} holds 'head.bias' without 'head.weight'")
    sets = {name: OODFeatures(*(state.get(f"{i}.{key}") for key in _FIELDS)) for i, name in enumerate(names)}
    return SavedFeatures(
        sets, state.get("head.weight"), state.get("head.bias"), metadata if isinstance(metadata, dict) else {}
    )
