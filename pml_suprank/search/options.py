"""Names shared by the index and its file format: the backends, which backend each option belongs to, the bounds of
every option, the one option validator (used by the constructor, :meth:`RetrievalIndex.set_search_options` and the
loader of ``index.json``) and the id check."""

from __future__ import annotations

from typing import Any

from .._validation import check_positive_int
from .faiss_backends import FAISS_BACKENDS, default_options

__all__ = ["BACKENDS", "INT32_MAX", "OPTION_BACKENDS", "OPTION_MAXIMA", "check_ids", "check_option", "resolve_options"]

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
#: the largest value faiss stores in its C ``int`` fields
INT32_MAX = 2**31 - 1
#: the largest value each option accepts. ``nlist`` is further bounded by the rows it is trained on and ``nprobe`` by
#: ``nlist``; ``hnsw_m`` (links per node: ``2·M`` int32 per item at level 0) and the HNSW candidate lists
#: ``ef_construction`` / ``ef_search`` (one heap of that size per search) are bounded well above any useful setting
#: (faiss suggests M in 4 ... 64, ef in the hundreds) and well below an allocation that could not succeed.
OPTION_MAXIMA = {
    "nlist": INT32_MAX,
    "nprobe": INT32_MAX,
    "train_size": INT32_MAX,
    "hnsw_m": 512,
    "ef_construction": 65536,
    "ef_search": 65536,
}


def check_option(name: str, value: Any, backend: str) -> int:
    """Check one backend option: it belongs to ``backend`` (else ``ValueError``) and is an int (else ``TypeError``,
    bools refused) in ``[1, OPTION_MAXIMA[name]]`` (else ``ValueError``)."""
    if name not in OPTION_BACKENDS:
        raise ValueError(f"unknown option {name!r}; options are {sorted(OPTION_BACKENDS)}")
    if OPTION_BACKENDS[name] != backend:
        raise ValueError(f"{name} applies to backend={OPTION_BACKENDS[name]!r}; got backend={backend!r}")
    value = check_positive_int(name, value)
    if value > OPTION_MAXIMA[name]:
        raise ValueError(f"{name} must be <= {OPTION_MAXIMA[name]}; got {value}")
    return value


def resolve_options(backend: str, given: dict[str, Any], num_items: int) -> dict[str, int]:
    """The options of an index of ``num_items`` rows: ``backend``'s defaults overridden by the non-``None`` entries
    of ``given``, each checked by :func:`check_option`, then ``nlist <= min(train_size, num_items)`` and ``nprobe <=
    nlist`` (before anything is allocated). ``ValueError`` / ``TypeError`` naming the option, bound and value."""
    options = default_options(backend, num_items)
    for name, value in given.items():
        if value is not None:
            options[name] = check_option(name, value, backend)
    if backend == "faiss-ivf":
        rows = min(options["train_size"], num_items)
        if options["nlist"] > rows:
            raise ValueError(
                f"backend='faiss-ivf' needs at least nlist={options['nlist']} embeddings to train its "
                f"{options['nlist']} cells; got {rows} (lower nlist to at most {rows})"
            )
        if options["nprobe"] > options["nlist"]:
            raise ValueError(f"nprobe must be <= nlist={options['nlist']}; got {options['nprobe']}")
    return options


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
