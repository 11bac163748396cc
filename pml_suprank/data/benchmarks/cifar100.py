"""CIFAR-100 (Krizhevsky, 2009), fine label (100) → coarse label (20), from the Toronto release
``cifar-100-python/`` (its ``{train,test}`` pickles read by :func:`load_restricted_pickle`: builtin containers and
numpy arrays only) or a Hub dataset with ``img`` / ``fine_label`` / ``coarse_label`` columns (e.g.
``uoft-cs/cifar100``: the only benchmark that may touch the network). Splits: ``train`` / ``test`` as distributed and
the open-set ``open_train`` / ``open_test`` (the 3 smallest fine ids of every coarse class train, the other 2 test).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..loading import HFRetrievalDataset, open_set_classes
from ._native import ArrayImageDataset, NativeImageDataset, Record, encode_levels, encode_split, layout_error

__all__ = [
    "CIFAR100_LABEL_NAMES",
    "CIFAR100_SPLITS",
    "CIFAR100_TRAIN_CLASSES_PER_COARSE",
    "HubImageDataset",
    "RestrictedUnpickler",
    "load_cifar100",
    "load_restricted_pickle",
]

CIFAR100_LABEL_NAMES = ("fine_label", "coarse_label")
CIFAR100_SPLITS = ("train", "test", "open_train", "open_test")
CIFAR100_TRAIN_CLASSES_PER_COARSE = 3
_ALLOWED_GLOBALS = frozenset(
    {
        ("_codecs", "encode"),  # bytes in protocol-2 pickles
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),  # numpy scalars (np.int64(3)) inside containers
        ("numpy._core.multiarray", "scalar"),
    }
)


class RestrictedUnpickler(pickle.Unpickler):
    """Builds builtin containers and numpy arrays / scalars only: a pickle naming any other global (``os.system``,
    ``builtins.eval`` ...) raises ``pickle.UnpicklingError`` before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed (only numpy arrays and builtins)")


def load_restricted_pickle(path: Path, what: str, *, encoding: str = "ASCII") -> Any:
    """The content of the pickle file ``path`` read with :class:`RestrictedUnpickler` (``encoding`` of Python 2
    ``str``). ``ValueError`` naming ``what`` the file should hold: missing, or not a pickle of builtins and numpy
    arrays."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: missing file ({what})")
    try:
        with open(path, "rb") as f:
            return RestrictedUnpickler(f, encoding=encoding).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise layout_error(path, None, f"not a readable {what} ({err})") from None


def _local_part(folder: Path, part: str) -> tuple[np.ndarray, list[Record], list[str]]:
    """Pixels ``(N, 32, 32, 3)``, records ``(i, (fine, coarse), where)`` and file names of one pickle."""
    path = folder / part
    content = load_restricted_pickle(path, "CIFAR-100 pickle", encoding="bytes")
    if not isinstance(content, dict):
        raise layout_error(path, None, f"expected a dict; got {type(content).__name__}")
    content = {k.encode() if isinstance(k, str) else k: v for k, v in content.items()}
    missing = [k.decode() for k in (b"data", b"fine_labels", b"coarse_labels") if k not in content]
    if missing:
        raise layout_error(path, None, f"missing keys {missing}; got {sorted(map(repr, content))}")
    data = np.asarray(content[b"data"])
    fine, coarse = list(content[b"fine_labels"]), list(content[b"coarse_labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or not len(data) == len(fine) == len(coarse):
        raise layout_error(
            path,
            None,
            f"data must be (N, 3072) uint8 with N fine/coarse labels; got {data.dtype} {data.shape}, "
            f"{len(fine)} fine and {len(coarse)} coarse labels",
        )
    keys = [
        (_label(a, path, i, "fine_labels"), _label(b, path, i, "coarse_labels"))
        for i, (a, b) in enumerate(zip(fine, coarse))
    ]
    names = content.get(b"filenames") or [f"{part}_{i:05d}.png" for i in range(len(data))]
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    records = [(i, key, f"{path}, item {i}") for i, key in enumerate(keys)]
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), records, names


def _label(value: Any, path: Path, item: int, key: str) -> int:
    """An integer label of a CIFAR pickle, or a ``ValueError`` naming the file, the key and the item."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise layout_error(path, f"{key}[{item}]", f"labels must be integers; got {value!r} ({type(value).__name__})")
    return int(value)


def _open_set_keep(keys: list[tuple[int, int]], part: str, everything: list[tuple[int, int]]) -> list[int]:
    """Indices of ``keys`` on the open-set side ``part`` (3 training classes per coarse class over ``everything``)."""
    train, _ = open_set_classes(torch.tensor(everything), train_classes_per_coarse=CIFAR100_TRAIN_CLASSES_PER_COARSE)
    inside = torch.isin(torch.tensor([fine for fine, _ in keys]), train)
    return torch.nonzero(inside == (part == "train")).flatten().tolist()


class HubImageDataset(NativeImageDataset):
    """A Hub ``datasets.Dataset`` split with an image column, decoded lazily (used for ``cifar100`` Hub ids)."""

    def __init__(self, hf_dataset: Any, image_column: str, labels: Any, label_names: Any, **kwargs: Any) -> None:
        self._images = hf_dataset.select_columns([image_column])
        self.image_column = image_column
        super().__init__(labels, label_names, [f"{i:06d}.png" for i in range(len(hf_dataset))], **kwargs)

    get_image = HFRetrievalDataset.get_image


def _from_hub(repo_id: str, split: str, transform: Callable | None) -> HubImageDataset:
    import datasets

    base = split.removeprefix("open_")
    ds = datasets.load_dataset(repo_id, split=base)
    keys = list(zip(map(int, ds["fine_label"]), map(int, ds["coarse_label"])))
    labels = encode_levels(keys, [f"{repo_id} [{base}] row {i}" for i in range(len(keys))], CIFAR100_LABEL_NAMES)
    if split.startswith("open_"):
        keep = _open_set_keep(keys, base, keys)
        ds, labels = ds.select(keep), labels[keep]
    return HubImageDataset(
        ds, "img", labels, CIFAR100_LABEL_NAMES, transform=transform, benchmark="cifar100", split=split
    )


def load_cifar100(root: str | Path, split: str, transform: Callable | None = None) -> NativeImageDataset:
    """CIFAR-100 ``split`` of ``cifar-100-python/`` (or its parent) or a Hub id: labels ``(N, 2)`` = (fine, coarse).
    ``ValueError``: a missing or malformed pickle, a fine label under two coarse labels."""
    path = Path(root)
    folder = path / "cifar-100-python" if (path / "cifar-100-python").is_dir() else path
    if not path.exists() and str(root).count("/") == 1 and not str(root).startswith((".", "/", "~")):
        return _from_hub(str(root), split, transform)
    base = split.removeprefix("open_")
    parts = {part: _local_part(folder, part) for part in ("train", "test")}
    pixels, records, names = parts[base]
    _, labels = encode_split({p: r for p, (_, r, _) in parts.items()}, base, CIFAR100_LABEL_NAMES)
    if split.startswith("open_"):
        keep = _open_set_keep([r[1] for r in records], base, [r[1] for _, rs, _ in parts.values() for r in rs])
        pixels, labels, names = pixels[keep], labels[keep], [names[i] for i in keep]
    return ArrayImageDataset(
        labels, CIFAR100_LABEL_NAMES, pixels, names, transform=transform, benchmark="cifar100", split=split
    )
