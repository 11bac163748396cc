"""The file format of a saved :class:`~pml_suprank.search.RetrievalIndex`: safetensors + JSON, validated, no pickle.

A folder with ``index.safetensors`` (``"embeddings"`` ``(N, D)`` float32/float64, optional ``"labels"`` ``(N,)`` /
``(N, L)`` int64) and ``index.json`` (format, version, backend, options, shapes, ids, the tensor file's sha256).
Approximate faiss structures are rebuilt on load from the embeddings and options (nothing unpickled, no faiss binary
parsed). Every field is checked on load (keys, types, checksum, tensor names, shapes, dtypes, finiteness, options
through :func:`~pml_suprank.search.options.resolve_options`) with a ``ValueError`` naming the file and field; a file
that is a symbolic link leading outside the folder is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._safe_json import load_json
from ..version import __version__
from .options import BACKENDS, check_ids, resolve_options

__all__ = ["INDEX_FORMAT", "JSON_NAME", "TENSORS_NAME", "read_index_files", "sha256_file", "write_index_files"]

INDEX_FORMAT = "pml_suprank.RetrievalIndex"
FORMAT_VERSION = 1
TENSORS_NAME = "index.safetensors"
JSON_NAME = "index.json"
_KEYS = {
    "format",
    "format_version",
    "backend",
    "options",
    "num_items",
    "dim",
    "dtype",
    "label_shape",
    "ids",
    "sha256",
    "pml_suprank_version",
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _inside(folder: Path, path: Path) -> Path:
    """``path`` (a file of ``folder``) if it resolves inside ``folder``; a link pointing elsewhere is refused, so
    ``load`` never reads, and ``save`` never overwrites, a file outside the index folder."""
    if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
        raise ValueError(
            f"{path} is a symbolic link to {path.resolve()}, outside the index folder {folder}: refused (copy the "
            f"file into the folder instead)"
        )
    return path


def write_index_files(folder: str | Path, embeddings: Tensor, labels: Tensor | None, meta: dict[str, Any]) -> Path:
    """Write ``index.safetensors`` (``embeddings``, ``labels``) and ``index.json`` (``meta`` — ``backend``,
    ``options``, ``ids`` — completed with the format, shapes and checksum) to ``folder`` (created if needed)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in (TENSORS_NAME, JSON_NAME):
        _inside(folder, folder / name)
    tensors = {"embeddings": embeddings.detach().cpu().contiguous()}
    if labels is not None:
        tensors["labels"] = labels.cpu().contiguous()
    save_file(tensors, str(folder / TENSORS_NAME), metadata={"format": INDEX_FORMAT})
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
        "sha256": sha256_file(folder / TENSORS_NAME),
        "pml_suprank_version": __version__,
    }
    (folder / JSON_NAME).write_text(json.dumps(record, indent=1))
    return folder


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = load_json(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object; got {type(meta).__name__}")
    if meta.get("format") != INDEX_FORMAT:
        raise ValueError(f"{path}: 'format' must be {INDEX_FORMAT!r}; got {meta.get('format')!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported format_version {meta.get('format_version')!r} (expected 1)")
    missing, unknown = sorted(_KEYS - set(meta)), sorted(set(meta) - _KEYS)
    if missing or unknown:
        raise ValueError(f"{path}: missing keys {missing}, unknown keys {unknown}")
    if meta["backend"] not in BACKENDS:
        raise ValueError(f"{path}: 'backend' must be one of {BACKENDS}; got {meta['backend']!r}")
    for key in ("num_items", "dim"):
        if not _is_int(meta[key]) or meta[key] < 1:
            raise ValueError(f"{path}: {key!r} must be a positive int; got {meta[key]!r}")
    if meta["dtype"] not in _DTYPES:
        raise ValueError(f"{path}: 'dtype' must be one of {sorted(_DTYPES)}; got {meta['dtype']!r}")
    shape = meta["label_shape"]
    if shape is not None and not (
        isinstance(shape, list) and (shape == [] or (len(shape) == 1 and _is_int(shape[0]) and shape[0] >= 1))
    ):
        raise ValueError(f"{path}: 'label_shape' must be null, [] or [L] with L >= 1; got {shape!r}")
    options = meta["options"]
    if not isinstance(options, dict):
        raise ValueError(f"{path}: 'options' must be an object; got {type(options).__name__}")
    try:  # the constructor's own validator: types, bounds, nlist <= training rows, nprobe <= nlist
        resolve_options(meta["backend"], options, meta["num_items"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: 'options': {e}") from e
    if not isinstance(meta["sha256"], str) or len(meta["sha256"]) != 64:
        raise ValueError(f"{path}: 'sha256' must be a 64-character hex digest; got {meta['sha256']!r}")
    if meta["ids"] is not None:
        try:
            check_ids("ids", meta["ids"], meta["num_items"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from e
    return meta


def read_index_files(folder: str | Path) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
    """``(embeddings (N, D), labels (N, ...) or None, meta)`` of a folder written by :func:`write_index_files`, every
    field validated (``FileNotFoundError``: the folder or a file is missing; ``ValueError``: a field or tensor disagrees
    with the format, the JSON file or the checksum)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder (expected one written by RetrievalIndex.save)")
    json_path, tensor_path = folder / JSON_NAME, folder / TENSORS_NAME
    for path in (json_path, tensor_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing (a RetrievalIndex folder holds {JSON_NAME} and {TENSORS_NAME})")
        _inside(folder, path)
    meta = _read_meta(json_path)
    if sha256_file(tensor_path) != meta["sha256"]:
        raise ValueError(
            f"{tensor_path} does not match the sha256 recorded in {json_path}: the file was modified or replaced"
        )
    try:
        tensors = load_file(str(tensor_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{tensor_path}: not a readable safetensors file ({e})") from e
    expected = {"embeddings"} | ({"labels"} if meta["label_shape"] is not None else set())
    if set(tensors) != expected:
        raise ValueError(f"{tensor_path}: expected tensors {sorted(expected)}; got {sorted(tensors)}")
    n, d = meta["num_items"], meta["dim"]
    emb = tensors["embeddings"]
    if emb.dtype != _DTYPES[meta["dtype"]] or tuple(emb.shape) != (n, d):
        raise ValueError(
            f"{tensor_path}: 'embeddings' must be {meta['dtype']} of shape ({n}, {d}) as {json_path} says; got "
            f"{emb.dtype} {tuple(emb.shape)}"
        )
    if not bool(torch.isfinite(emb).all()):
        raise ValueError(f"{tensor_path}: 'embeddings' contains NaN or inf values")
    labels = tensors.get("labels")
    if labels is not None and (labels.dtype != torch.int64 or list(labels.shape) != [n, *meta["label_shape"]]):
        raise ValueError(
            f"{tensor_path}: 'labels' must be int64 of shape {tuple([n, *meta['label_shape']])}; got "
            f"{labels.dtype} {tuple(labels.shape)}"
        )
    train_size = meta["options"].get("train_size")
    if train_size is not None and train_size > n:
        raise ValueError(f"{json_path}: option train_size={train_size} exceeds num_items={n}")
    return emb, labels, meta
