"""The file format of a saved :class:`~pml_suprank.search.RetrievalIndex`: safetensors + JSON, validated, no pickle.

A folder with ``index.safetensors`` (``"embeddings"`` ``(N, D)`` float32/float64, optional ``"labels"`` ``(N,)`` /
``(N, L)`` int64) and ``index.json`` (format, version, backend, options, shapes, ids, the tensor file's sha256).
Approximate faiss structures are rebuilt on load (no faiss binary parsed). Every field is checked on load (options by
the constructor's validator) with a ``ValueError`` naming the file and field; a symbolic link leading outside the
folder is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._safe_json import load_json
from .._validation import check_choice, check_positive_int, is_int
from ..hub.schema import Sizes, TensorSpec, check_schema
from ..hub.serialization import read_weights, sha256_file, staged_folder, write_weights
from ..version import __version__
from .faiss_backends import BACKENDS, resolve_options

__all__ = ["JSON_NAME", "TENSORS_NAME", "check_ids", "read_index_files", "write_index_files"]

INDEX_FORMAT = "pml_suprank.RetrievalIndex"
FORMAT_VERSION = 1
TENSORS_NAME = "index.safetensors"
JSON_NAME = "index.json"
#: the keys of index.json, all required
_KEYS = frozenset(
    "format format_version backend options num_items dim dtype label_shape ids sha256 pml_suprank_version".split()
)
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _inside(folder: Path, path: Path) -> None:
    """Refuse ``path`` (a file of ``folder``) when it is a link that resolves outside ``folder``, so ``load`` never
    reads, and ``save`` never overwrites, a file outside the index folder."""
    if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
        raise ValueError(
            f"{path} is a symbolic link to {path.resolve()}, outside the index folder {folder}: refused (copy the "
            f"file into the folder instead)"
        )


def write_index_files(folder: str | Path, embeddings: Tensor, labels: Tensor | None, meta: dict[str, Any]) -> Path:
    """Write ``index.safetensors`` (``embeddings``, ``labels``) and ``index.json`` (``meta`` — ``backend``,
    ``options``, ``ids`` — completed with the format, shapes and checksum) to ``folder`` (created if needed), all or
    nothing (:func:`~pml_suprank.hub.serialization.staged_folder`)."""
    folder = Path(folder)
    for name in (TENSORS_NAME, JSON_NAME):
        _inside(folder, folder / name)
    tensors = {"embeddings": embeddings} | ({"labels": labels} if labels is not None else {})
    with staged_folder(folder) as stage:
        write_weights(stage / TENSORS_NAME, tensors, {"format": INDEX_FORMAT})
        record = {
            "format": INDEX_FORMAT,
            "format_version": FORMAT_VERSION,
            "backend": meta["backend"],
            "options": dict(meta["options"]),
            "num_items": int(embeddings.shape[0]),
            "dim": int(embeddings.shape[1]),
            "dtype": str(embeddings.dtype).removeprefix("torch."),
            "label_shape": None if labels is None else list(labels.shape[1:]),
            "ids": meta["ids"],
            "sha256": sha256_file(stage / TENSORS_NAME),
            "pml_suprank_version": __version__,
        }
        (stage / JSON_NAME).write_text(json.dumps(record, indent=1))
    return folder


def check_ids(name: str, ids: Any, n: int) -> list[str | int]:
    """``ids`` as a list, checked to be ``n`` str / int item identifiers (JSON-able; not required to be unique: they
    name the items in results, the gallery index is the key)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name} must be a list of str or int ids, one per embedding; got {type(ids).__name__}")
    ids = list(ids)
    if len(ids) != n:
        raise ValueError(f"{name} must have one id per embedding ({n}); got {len(ids)}")
    for j, bad in enumerate(ids):
        if isinstance(bad, bool) or not isinstance(bad, (str, int)):
            raise TypeError(f"{name} must contain str or int ids; got {type(bad).__name__} {bad!r} at position {j}")
    return ids


def _check_meta(meta: Any) -> None:
    if not isinstance(meta, dict):
        raise ValueError(f"expected a JSON object; got {type(meta).__name__}")
    if meta.get("format") != INDEX_FORMAT:
        raise ValueError(f"'format' must be {INDEX_FORMAT!r}; got {meta.get('format')!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"unsupported format_version {meta.get('format_version')!r} (expected 1)")
    missing, unknown = sorted(_KEYS - set(meta)), sorted(set(meta) - _KEYS)
    if missing or unknown:
        raise ValueError(f"missing keys {missing}, unknown keys {unknown}")
    check_choice("'backend'", meta["backend"], BACKENDS)
    check_choice("'dtype'", meta["dtype"], _DTYPES)
    for key in ("num_items", "dim"):
        check_positive_int(repr(key), meta[key])
    shape = meta["label_shape"]
    if not (shape is None or (isinstance(shape, list) and len(shape) <= 1 and all(map(is_int(1), shape)))):
        raise ValueError(f"'label_shape' must be null, [] or [L] with L >= 1; got {shape!r}")
    if not isinstance(meta["options"], dict):
        raise ValueError(f"'options' must be an object; got {type(meta['options']).__name__}")
    try:  # the constructor's own validator: types, bounds, nlist <= training rows, nprobe <= nlist
        resolve_options(meta["backend"], meta["options"], meta["num_items"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"'options': {e}") from e
    if meta["options"].get("train_size", 0) > meta["num_items"]:
        raise ValueError(f"option train_size={meta['options']['train_size']} exceeds num_items={meta['num_items']}")
    if not isinstance(meta["sha256"], str) or len(meta["sha256"]) != 64:
        raise ValueError(f"'sha256' must be a 64-character hex digest; got {meta['sha256']!r}")
    if meta["ids"] is not None:
        check_ids("ids", meta["ids"], meta["num_items"])


def read_index_files(folder: str | Path) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
    """``(embeddings (N, D), labels (N, ...) or None, meta)`` of a folder written by :func:`write_index_files`, every
    field validated (``FileNotFoundError``: the folder or a file is missing; ``ValueError``: a field or tensor disagrees
    with the format, the JSON file or the checksum)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder (expected one written by RetrievalIndex.save)")
    json_path, tensor_path = folder / JSON_NAME, folder / TENSORS_NAME
    for path in (json_path, tensor_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing (a RetrievalIndex folder holds {JSON_NAME} and {TENSORS_NAME})")
        _inside(folder, path)
    try:
        meta = load_json(json_path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{json_path}: not a readable JSON file ({e})") from e
    try:
        _check_meta(meta)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{json_path}: {e}") from e
    if sha256_file(tensor_path) != meta["sha256"]:
        raise ValueError(
            f"{tensor_path} does not match the sha256 recorded in {json_path}: the file was modified or replaced"
        )
    tensors = read_weights(tensor_path)
    n, d, label_shape = meta["num_items"], meta["dim"], meta["label_shape"]
    specs = {"embeddings": TensorSpec(("N", "D"))}  # finite values too
    if label_shape is not None:
        specs["labels"] = TensorSpec(("N", *label_shape), kind="integer")
    check_schema(tensors, tensor_path, specs, sizes=Sizes(N=n, D=d, origin={"N": JSON_NAME, "D": JSON_NAME}))
    emb, labels = tensors["embeddings"], tensors.get("labels")
    for name, t, dtype in (("embeddings", emb, _DTYPES[meta["dtype"]]), ("labels", labels, torch.int64)):
        if t is not None and t.dtype != dtype:
            raise ValueError(f"{tensor_path}: {name!r} must be {dtype} as {json_path} says; got {t.dtype}")
    return emb, labels, meta
