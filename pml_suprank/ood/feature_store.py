"""Save and load extracted OOD feature sets and the classifier head (``fit_heat`` writes them, ``ood_benchmark``
reads them back, so that nothing is embedded twice)::

    ood.save_features("features.safetensors", {"id_train": train, "id_test": test, "svhn": svhn}, head=fc)
    saved = ood.load_features("features.safetensors")
    saved.sets["id_train"].features, saved.weight, saved.metadata

One safetensors file: tensors ``"<i>.features"``, ``"<i>.std_features"``, ``"<i>.logits"``, ``"<i>.labels"`` of the
``i``-th set and ``"head.weight"`` / ``"head.bias"``; set names and metadata are JSON in the header. Loading checks
every tensor and names the file and the key in its errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._safe_json import loads_json
from .base import head_params
from .features import OODFeatures

__all__ = ["FEATURES_FORMAT", "SavedFeatures", "save_features", "load_features"]

#: Value of the ``format`` header entry of a feature file.
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


def _check_set(path: Path, i: int, name: str, state: dict[str, Tensor]) -> OODFeatures:
    got = {key: state.get(f"{i}.{key}") for key in _FIELDS}
    if got["features"] is None:
        raise ValueError(f"{path} has no tensor '{i}.features' for set {name!r}; truncated or foreign file?")
    n = got["features"].shape[0] if got["features"].dim() == 2 else -1
    for key, t in got.items():
        if t is None:
            continue
        where = f"{path}: tensor '{i}.{key}' (set {name!r})"
        if key == "labels":
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.dim() not in (1, 2):
                raise ValueError(f"{where} must be 1-D or 2-D integer labels; got {t.dtype} {tuple(t.shape)}")
        elif not t.is_floating_point() or t.dim() != 2:
            raise ValueError(f"{where} must be a 2-D floating tensor; got {t.dtype} {tuple(t.shape)}")
        elif not bool(torch.isfinite(t).all()):
            raise ValueError(f"{where} holds NaN or infinite values (corrupt file?)")
        if t.shape[0] != n:
            raise ValueError(f"{where} has {t.shape[0]} rows; the set's features have {n}")
    if got["std_features"] is not None and got["std_features"].shape[1] != got["features"].shape[1]:
        raise ValueError(f"{path}: tensor '{i}.std_features' (set {name!r}) must have as many columns as features")
    return OODFeatures(got["features"], got["std_features"], got["logits"], got["labels"])


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
    known = {f"{i}.{key}" for i in range(len(names)) for key in _FIELDS} | {"head.weight", "head.bias"}
    unknown = sorted(set(state) - known)
    if unknown:
        raise ValueError(f"{path} holds tensors {unknown} that are not part of a feature file")
    sets = {name: _check_set(path, i, name, state) for i, name in enumerate(names)}
    weight, bias = state.get("head.weight"), state.get("head.bias")
    if weight is not None:
        weight, bias = _check_head(path, weight, bias, sets)
    elif bias is not None:
        raise ValueError(f"{path} holds 'head.bias' without 'head.weight'")
    return SavedFeatures(sets, weight, bias, metadata if isinstance(metadata, dict) else {})


def _check_head(path: Path, weight: Tensor, bias: Tensor | None, sets: dict[str, OODFeatures]):
    try:
        weight, bias = head_params(weight, bias, None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: tensor 'head.weight' / 'head.bias' is not a classifier head: {err}") from None
    for name, feats in sets.items():
        if feats.features.shape[1] != weight.shape[1]:
            raise ValueError(f"{path}: tensor 'head.weight' has {weight.shape[1]} columns; set {name!r} has "
                             f"{feats.features.shape[1]}-dim features")  # fmt: skip
        if feats.logits is not None and feats.logits.shape[1] != weight.shape[0]:
            raise ValueError(f"{path}: tensor 'head.weight' has {weight.shape[0]} rows; set {name!r} has "
                             f"{feats.logits.shape[1]} logits")  # fmt: skip
    return weight, bias
