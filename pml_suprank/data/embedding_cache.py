"""Embed a dataset once: an on-disk cache of a model's per-item outputs, reused across commands and resumed after an
interruption (``--embedding_cache DIR`` of ``evaluate``, ``search``, ``fit_heat`` and ``ood_score``; off by default).

**Key** (:func:`cache_key`): the weights (:func:`state_digest`, SHA-256 of names, dtypes, shapes and values); the data
(:func:`data_identity`: type, length, labels and the files in dataset order with resolved path, size and mtime, the
pixels of an in-memory array, the ``datasets`` fingerprint, or a synthetic set's parameters); the transform
(:func:`transform_identity`: each step's ``repr`` and exact mean / std); the feature kind, storage dtype and mixed
precision (not the device). A dataset or transform that cannot be identified (unknown class, ``Lambda``, random
augmentation) is embedded without the cache, with a warning.

**Layout.** ``DIR/<sha256 of the key>/manifest.json`` and ``shard-00000.safetensors``, ... of ``shard_size``
consecutive items (per-item tensors plus metadata ``{"key", "start", "stop"}``), each written to a temporary file and
moved into place: a shard exists whole or not at all, and a re-run embeds only the missing ones.

**Files are data.** Nothing is unpickled; everything is written inside ``DIR``; the manifest is read bounded and
checked value by value, a shard only if it is a bounded regular file (not a link) whose metadata and tensors match
(names, rows, dtypes, finite values).
Anything else is recomputed with a warning. ``dtype="float16"`` halves the disk (values rounded, returned as float32).
Under Accelerate process 0 writes the manifest, shard ``j`` is embedded by process ``j mod num_processes``, and after
a barrier every process reads all shards.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping
from contextlib import nullcontext, suppress
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset, Subset

from .._safe_json import atomic_write, load_json
from .._validation import check_choice, check_positive_int

__all__ = [
    "cache_key",
    "cached_embeddings",
    "cached_features",
    "data_identity",
    "state_digest",
    "transform_identity",
]

FORMAT = 1
MANIFEST = "manifest.json"
#: default items per shard (the unit of resumption)
SHARD_SIZE = 4096
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
_MAX_MANIFEST_BYTES = 1 << 20
_MAX_SHARD_SIZE = 1 << 20
_MAX_ROW_BYTES = 1 << 20  # a shard file may hold at most this many bytes per item (plus 1 MiB of header)
_STALE_TMP_SECONDS = 3600
_TENSOR_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_RANDOM_STEPS = re.compile(r"Random|RandAugment|AugMix|TrivialAugment|ColorJitter|Lambda| at 0x")


def _feed(digest: Any, x: Any) -> None:
    t = torch.as_tensor(x).detach().cpu().contiguous()
    digest.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def state_digest(module: Any) -> str:
    """SHA-256 (hex) of a module's tensors (names, dtypes, shapes, values), independent of any file layout."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}|".encode())
        _feed(digest, tensor)
    return digest.hexdigest()


def _tensor_sha256(x: Any) -> str:
    digest = hashlib.sha256()
    _feed(digest, x)
    return digest.hexdigest()


def _files_sha256(paths: Any) -> str:
    """SHA-256 of ``(resolved path, size, mtime_ns)`` of each file, in the given order (missing files included)."""
    digest = hashlib.sha256()
    for p in paths:
        try:
            st = os.stat(p)
            digest.update(f"{os.path.realpath(p)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{p}|missing\n".encode())
    return digest.hexdigest()


def _hf_identity(hf: Any, column: str | None) -> dict[str, Any] | None:
    """The ``datasets`` fingerprint, and the files of an image column that stores paths without bytes."""
    fingerprint = getattr(hf, "_fingerprint", None)
    if not isinstance(fingerprint, str):
        return None
    out: dict[str, Any] = {"fingerprint": fingerprint}
    table = getattr(hf, "data", None)
    if column is not None and table is not None and column in table.column_names:
        import pyarrow as pa
        import pyarrow.compute as pc

        col = table.column(column)
        if pa.types.is_struct(col.type) and {"path", "bytes"} <= {f.name for f in col.type}:
            paths = pc.struct_field(col, "path").to_pylist()
            no_bytes = pc.is_null(pc.struct_field(col, "bytes")).to_pylist()
            out["files_sha256"] = _files_sha256([p for p, n in zip(paths, no_bytes, strict=True) if n and p])
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            out["files_sha256"] = _files_sha256(col.to_pylist())
    return out


def data_identity(dataset: Any) -> dict[str, Any] | None:
    """What identifies ``dataset``'s items (module docstring) as a JSON-able dict; ``None``: not identifiable."""
    if isinstance(dataset, Subset):
        inner = data_identity(dataset.dataset)
        return None if inner is None else {"subset_of": inner, "indices_sha256": _tensor_sha256(list(dataset.indices))}
    out: dict[str, Any] = {
        "type": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        "num_items": len(dataset),
    }
    if getattr(dataset, "labels", None) is not None:
        out["labels_sha256"] = _tensor_sha256(dataset.labels)
        out["label_names"] = [str(n) for n in getattr(dataset, "label_names", None) or []]
    if type(dataset).__module__.startswith(f"{__package__}.synthetic"):  # rendered from its parameters alone
        scalars = (bool, int, float, str, list, tuple)
        out["params"] = {k: v for k, v in sorted(vars(dataset).items()) if isinstance(v, scalars)
                         and not k.startswith("_") and k not in ("label_names", "cache")}  # fmt: skip
    elif isinstance(getattr(dataset, "paths", None), list):  # image files (benchmarks, ImageFiles)
        out["files_sha256"] = _files_sha256(dataset.paths)
    elif isinstance(getattr(dataset, "members", None), list):  # zip members
        out["files_sha256"] = _files_sha256(sorted({a for a, _ in dataset.members}))
        out["members_sha256"] = hashlib.sha256("\n".join(f"{a}|{m}" for a, m in dataset.members).encode()).hexdigest()
    elif getattr(dataset, "pixels", None) is not None:  # an in-memory (N, H, W, 3) array
        out["pixels_sha256"] = _tensor_sha256(torch.from_numpy(dataset.pixels))
    else:
        hf = getattr(dataset, "hf_dataset", None) or getattr(dataset, "_images", None)
        hf_id = None if hf is None else _hf_identity(hf, getattr(dataset, "image_column", None))
        if hf_id is None:
            return None
        out["hf"] = hf_id
    return out


def transform_identity(transform: Any) -> list[str] | None:
    """The ``repr`` of each step of ``transform`` (``[]`` for none) with the exact mean / std of a normalisation;
    ``None`` when a step is random or its ``repr`` does not describe it (a ``Lambda``, a function)."""
    steps = [] if transform is None else list(getattr(transform, "transforms", [transform]))
    out = []
    for step in steps:
        text = repr(step)
        if _RANDOM_STEPS.search(f"{type(step).__name__} {text}"):
            return None
        for name in ("mean", "std"):
            if getattr(step, name, None) is not None:
                text += f"|{name}={torch.as_tensor(getattr(step, name), dtype=torch.float64).tolist()!r}"
        out.append(text)
    return out


def cache_key(
    model: nn.Module, dataset: Any, *, feature_kind: str, dtype: str = "float32", mixed_precision: str = "no"
) -> dict[str, Any] | None:
    """The key of the (unwrapped) ``model``'s ``feature_kind`` outputs (e.g. ``"embedding"``) on ``dataset`` (its
    or its base dataset's ``transform`` included), stored as ``dtype`` under ``mixed_precision``; ``None``: not
    identifiable, no caching."""
    base = dataset.dataset if isinstance(dataset, Subset) else dataset
    data, transform = data_identity(dataset), transform_identity(getattr(base, "transform", None))
    if data is None or transform is None:
        return None
    key = {"format": FORMAT, "weights_sha256": state_digest(model), "data": data, "transform": transform,
           "feature_kind": str(feature_kind), "dtype": dtype, "mixed_precision": str(mixed_precision)}  # fmt: skip
    return json.loads(json.dumps(key))  # the JSON form, as a manifest reads back


def _shard_names(num_items: int, shard_size: int) -> list[str]:
    return [f"shard-{j:05d}.safetensors" for j in range(math.ceil(num_items / shard_size))]


def _refuse(path: Path, why: str) -> None:
    warnings.warn(f"embedding cache: {path} is refused ({why}); recomputing it", stacklevel=3)


def _read_manifest(folder: Path, key: dict, num_items: int) -> tuple[int, list[str]] | None:
    path = folder / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        return _refuse(path, "not a regular file")
    try:
        m = load_json(path, what="embedding cache manifest", expected=dict, max_bytes=_MAX_MANIFEST_BYTES)
    except ValueError as e:
        return _refuse(path, str(e))
    size = m.get("shard_size")
    if set(m) != {"format", "key", "num_items", "shard_size", "shards"} or m["format"] != FORMAT:
        why = f"keys {str(sorted(m))[:200]} / format {m.get('format')!r:.40}; expected format {FORMAT}"
    elif m["key"] != key:
        why = "its key is not this model / data / transform"
    elif m["num_items"] != num_items or type(size) is not int or not 1 <= size <= _MAX_SHARD_SIZE:
        why = f"num_items {m['num_items']!r:.40} / shard_size {size!r:.40}; expected {num_items} / 1..{_MAX_SHARD_SIZE}"
    elif m["shards"] != _shard_names(num_items, size):
        why = "the shard names must be shard-00000.safetensors, shard-00001.safetensors, ... in this folder"
    else:
        return size, m["shards"]
    return _refuse(path, why)


def _write_manifest(folder: Path, key: dict, num_items: int, shard_size: int) -> tuple[int, list[str]]:
    for stale in folder.glob(".*.tmp"):  # left by a killed pass
        with suppress(OSError):
            if not stale.is_symlink() and time.time() - stale.stat().st_mtime > _STALE_TMP_SECONDS:
                stale.unlink()
    shards = _shard_names(num_items, shard_size)
    text = json.dumps({"format": FORMAT, "key": key, "num_items": num_items, "shard_size": shard_size,
                       "shards": shards}, indent=1)  # fmt: skip
    atomic_write(folder / MANIFEST, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return shard_size, shards


def _check_rows(tensors: Mapping[str, Any], rows: int, storage: torch.dtype) -> str | None:
    for name, t in tensors.items():
        if not isinstance(name, str) or not _TENSOR_NAME.fullmatch(name):
            return f"tensor name {name!r} (lowercase identifiers only)"
        if not isinstance(t, Tensor) or t.dim() < 1 or t.shape[0] != rows:
            return f"{name!r} must be a tensor of {rows} rows; got {getattr(t, 'shape', type(t).__name__)}"
        if t.dtype != (storage if t.is_floating_point() else torch.int64):
            return f"{name!r} has dtype {t.dtype}"
    return None


def _load_shard(path: Path, digest: str, start: int, stop: int, storage: torch.dtype) -> dict[str, Tensor] | None:
    from safetensors import SafetensorError, safe_open

    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        return _refuse(path, "not a regular file")
    limit = (stop - start) * _MAX_ROW_BYTES + (1 << 20)
    if path.stat().st_size > limit:
        return _refuse(path, f"{path.stat().st_size} bytes; at most {limit} for {stop - start} items")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta != {"key": digest, "start": str(start), "stop": str(stop)}:
                return _refuse(path, f"metadata {str(meta)[:200]}; expected this key and rows {start}..{stop}")
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    except (OSError, SafetensorError, ValueError, RuntimeError) as e:
        return _refuse(path, f"{type(e).__name__}: {str(e)[:200]}")
    why = _check_rows(tensors, stop - start, storage) or next(
        (f"{name!r} holds NaN or infinite values" for name, t in tensors.items()
         if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)  # fmt: skip
    return tensors if why is None else _refuse(path, why)


def _store(tensors: Mapping[str, Tensor], rows: int, storage: torch.dtype) -> dict[str, Tensor]:
    if not isinstance(tensors, Mapping) or not tensors:
        raise TypeError(f"extract must return a non-empty mapping of names to tensors; got {type(tensors).__name__}")
    out = {k: (v.detach().cpu().to(storage) if v.is_floating_point() else v.detach().cpu().long()).contiguous()
           for k, v in tensors.items()}  # fmt: skip
    why = _check_rows(out, rows, storage)
    if why is not None:
        raise ValueError(f"extract returned {why}")
    return out


def _range_loader(loader: DataLoader, start: int, stop: int) -> DataLoader:
    """Items ``start..stop`` of ``loader.dataset``, in order, batched as ``loader`` batches them."""
    batch_size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
    return DataLoader(Subset(loader.dataset, range(start, stop)), batch_size=batch_size, shuffle=False,
                      num_workers=loader.num_workers, collate_fn=loader.collate_fn)  # fmt: skip


def _barrier(accelerator: Any) -> None:
    if accelerator is not None and accelerator.num_processes > 1:
        accelerator.wait_for_everyone()


def cached_features(
    model: nn.Module,
    loader: DataLoader,
    cache_dir: str | Path,
    *,
    feature_kind: str,
    extract: Callable[[DataLoader], Mapping[str, Tensor]],
    accelerator: Any = None,
    dtype: str = "float32",
    shard_size: int = SHARD_SIZE,
) -> dict[str, Tensor]:
    """``extract``'s per-item tensors on every item of ``loader.dataset`` (map-style), read from the cache in
    ``cache_dir`` and computed shard by shard only where missing.

    Args:
        model: the model ``extract`` runs (its weights are part of the key; an Accelerate wrapper is unwrapped).
        loader: its batch size, workers and collate function are used; the shards are split across processes here.
        feature_kind: the name of what ``extract`` returns, part of the key.
        extract: maps a loader of consecutive items to ``{lowercase name: (n, ...) tensor}`` (floating tensors
            stored in ``dtype``, the others as int64).
        accelerator: optional ``accelerate.Accelerator`` (process split, mixed precision in the key).
        dtype: ``"float32"`` or ``"float16"`` storage; shard_size: items per shard of a new entry.

    Returns:
        ``{name: (N, ...) tensor}``, floating tensors as float32, in dataset order.

    Raises:
        ValueError / TypeError: a bad argument; a shard another process should have written is unreadable.
    """
    from safetensors.torch import save_file

    storage = STORAGE_DTYPES[check_choice("dtype", dtype, STORAGE_DTYPES)]
    shard_size = check_positive_int("shard_size", shard_size)
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        raise TypeError(f"loader must be a DataLoader over a map-style dataset; got {type(loader).__name__}")
    n = len(loader.dataset)
    if n == 0:
        raise ValueError("loader.dataset must hold at least one item; got an empty dataset")
    net = accelerator.unwrap_model(model) if accelerator is not None else model
    key = cache_key(net, loader.dataset, feature_kind=feature_kind, dtype=dtype,
                    mixed_precision=getattr(accelerator, "mixed_precision", "no"))  # fmt: skip
    if key is None:
        warnings.warn(f"embedding cache: {type(loader.dataset).__name__} or its transform cannot be identified; "
                      "embedding without the cache", stacklevel=2)  # fmt: skip
        return _float32(_store(extract(_range_loader(loader, 0, n)), n, storage))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    root = Path(cache_dir)
    folder = root / digest
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink():
            raise ValueError(f"embedding cache: {folder} is a symbolic link; the cache writes only inside {root}")
        folder.mkdir(exist_ok=True)
        layout = _read_manifest(folder, key, n) or _write_manifest(folder, key, n, shard_size)
    _barrier(accelerator)
    if rank != 0:
        layout = _read_manifest(folder, key, n)
        if layout is None:
            raise ValueError(f"embedding cache: {folder / MANIFEST} was not written by process 0")
    size, names = layout
    parts: dict[int, dict[str, Tensor]] = {}
    for j in range(rank, len(names), world):  # this process's shards
        start, stop = j * size, min(n, (j + 1) * size)
        parts[j] = _load_shard(folder / names[j], digest, start, stop, storage)
        if parts[j] is None:
            parts[j] = _store(extract(_range_loader(loader, start, stop)), stop - start, storage)
            meta = {"key": digest, "start": str(start), "stop": str(stop)}
            atomic_write(folder / names[j], lambda tmp, t=parts[j], m=meta: save_file(t, tmp, metadata=m))
    _barrier(accelerator)
    for j in range(len(names)):  # the other processes' shards
        if j not in parts:
            parts[j] = _load_shard(folder / names[j], digest, j * size, min(n, (j + 1) * size), storage)
            if parts[j] is None:
                raise ValueError(f"embedding cache: {folder / names[j]} (written by process {j % world}) is unreadable")
    tensor_names = set(parts[0])
    for j, part in parts.items():
        if set(part) != tensor_names:
            raise ValueError(
                f"embedding cache: {folder / names[j]} holds {sorted(part)}; expected {sorted(tensor_names)}"
            )
    return _float32({k: torch.cat([parts[j][k] for j in range(len(names))]) for k in tensor_names})


def _float32(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


@torch.no_grad()
def cached_embeddings(
    model: nn.Module,
    loader: DataLoader,
    cache_dir: str | Path | None = None,
    *,
    accelerator: Any = None,
    normalize: bool = False,
    dtype: str = "float32",
    shard_size: int = SHARD_SIZE,
    progress: bool = False,
    description: str = "embedding",
) -> tuple[Tensor, Tensor, Tensor]:
    """Embeddings, labels and indices of every item of ``loader`` in dataset order: :func:`cached_features` (kind
    ``"embedding"``, raw embeddings stored) or, with ``cache_dir=None``, :func:`pml_suprank.metrics.compute_embeddings`
    (gathered under Accelerate); ``normalize`` L2-normalises the returned embeddings.

    Returns:
        ``(embeddings (N, D) float32 on CPU, labels (N, L) or (N,) long, indices (N,) long)``.
    """
    from ..metrics.evaluator import compute_embeddings

    keys = {"input_key": "image", "label_key": "labels", "return_indices": True}
    if cache_dir is None:
        emb, lab, idx = compute_embeddings(model, loader, accelerator=accelerator, normalize=normalize,
                                           progress=progress, description=description, **keys)  # fmt: skip
        order = torch.argsort(idx)
        return emb[order], lab[order], idx[order]
    net = accelerator.unwrap_model(model) if accelerator is not None else model
    device = accelerator.device if accelerator is not None else None
    show = progress and getattr(accelerator, "is_local_main_process", True)

    def extract(shard: DataLoader) -> dict[str, Tensor]:
        with accelerator.autocast() if accelerator is not None else nullcontext():
            e, y, i = compute_embeddings(net, shard, device=device, normalize=False, progress=show,
                                         description=description, **keys)  # fmt: skip
        return {"embeddings": e, "labels": y, "indices": i}

    out = cached_features(model, loader, cache_dir, feature_kind="embedding", extract=extract,
                          accelerator=accelerator, dtype=dtype, shard_size=shard_size)  # fmt: skip
    emb = torch.nn.functional.normalize(out["embeddings"], dim=-1) if normalize else out["embeddings"]
    return emb, out["labels"], out["indices"]
