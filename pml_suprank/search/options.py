"""Names shared by the index and its file format: the backends, which backend each option belongs to, the id check."""

from __future__ import annotations

from typing import Any

from .faiss_backends import FAISS_BACKENDS

__all__ = ["BACKENDS", "OPTION_BACKENDS", "check_ids"]

BACKENDS = ("torch", *FAISS_BACKENDS)
#: constructor option -> the backend it configures
OPTION_BACKENDS = {
    "nlist": "faiss-ivf",
    "nprobe": "faiss-ivf",
    "train_size": "faiss-ivf",
    "hnsw_m": "faiss-hnsw",
    "ef_construction": "faiss-hnsw",
    "ef_search": "faiss-hnsw",
}


def check_ids(name: str, ids: Any, n: int) -> list[str | int]:
    """Check ``ids`` is a sequence of ``n`` str / int item identifiers (JSON-able); return it as a list."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name} must be a list of str or int ids, one per embedding; got {type(ids).__name__}")
    ids = list(ids)
    if len(ids) != n:
        raise ValueError(f"{name} must have one id per embedding ({n}); got {len(ids)}")
    bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, (str, int))), None)
    if bad is not None:
        raise TypeError(f"{name} must contain str or int ids; got {type(bad).__name__} {bad!r}")
    return ids
