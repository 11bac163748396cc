"""The backends of :class:`~pml_suprank.search.RetrievalIndex` beside ``"torch"``, their options and the one option
validator (constructor, :meth:`~pml_suprank.search.RetrievalIndex.set_search_options`, the loader of ``index.json``).
All search by inner product; faiss is imported only here, when used (``pip install pml-suprank[faiss]``).

* ``"faiss"``: ``IndexFlatIP``, exact; on a GPU when faiss has GPU support and the index device is CUDA (``k <=
  2048``). Tied scores follow faiss' own order.
* ``"faiss-ivf"``: ``nlist`` k-means cells, ``nprobe`` scanned per query; trained once on the first ``train_size``
  embeddings (fixed seed), later ``add`` calls only assign.
* ``"faiss-hnsw"``: an HNSW graph with ``hnsw_m`` links per node, ``ef_construction`` / ``ef_search`` candidates.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_positive_int
from .topk import merge_topk

__all__ = ["BACKENDS", "INT32_MAX", "OPTIONS", "FaissSearcher", "check_option", "import_faiss", "resolve_options"]

FAISS_BACKENDS = ("faiss", "faiss-ivf", "faiss-hnsw")
BACKENDS = ("torch", *FAISS_BACKENDS)
FAISS_GPU_MAX_K = 2048
#: the largest value faiss stores in its C ``int`` fields
INT32_MAX = 2**31 - 1
#: option -> (the backend it configures, its largest value). ``nlist`` is further bounded by the rows it is trained on
#: and ``nprobe`` by ``nlist``; ``hnsw_m`` (``2·M`` int32 links per item) and the HNSW candidate lists (one heap of
#: that size per search) are bounded well above any useful setting (faiss suggests M in 4 ... 64, ef in the hundreds)
#: and well below an allocation that could not succeed.
OPTIONS = {
    "nlist": ("faiss-ivf", INT32_MAX),
    "nprobe": ("faiss-ivf", INT32_MAX),
    "train_size": ("faiss-ivf", INT32_MAX),
    "hnsw_m": ("faiss-hnsw", 512),
    "ef_construction": ("faiss-hnsw", 65536),
    "ef_search": ("faiss-hnsw", 65536),
}


def check_option(name: str, value: Any, backend: str) -> int:
    """Check one option: a name of :data:`OPTIONS` (else ``TypeError``) that belongs to ``backend`` (else
    ``ValueError``) and an int (else ``TypeError``, bools refused) in ``[1, maximum]`` (else ``ValueError``)."""
    if name not in OPTIONS:
        raise TypeError(f"unknown option {name!r}; options are {sorted(OPTIONS)}")
    owner, maximum = OPTIONS[name]
    if owner != backend:
        raise ValueError(f"{name} applies to backend={owner!r}; got backend={backend!r}")
    value = check_positive_int(name, value)
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}; got {value}")
    return value


def resolve_options(backend: str, given: dict[str, Any], num_items: int) -> dict[str, int]:
    """The options of an index of ``num_items`` rows: the defaults (IVF: ``nlist = clamp(round(4·sqrt(N)), 1, N)``,
    ``nprobe = min(16, nlist)``, ``train_size = N``; HNSW: ``hnsw_m = 32``, ``ef_construction = ef_search = 64``;
    ``{}`` for the exact backends) overridden by the non-``None`` entries of ``given``, each checked by
    :func:`check_option`, then ``nlist <= min(train_size, num_items)`` and ``nprobe <= nlist``, before anything is
    allocated."""
    options: dict[str, int] = {}
    if backend == "faiss-ivf":
        nlist = int(min(max(1, round(4 * math.sqrt(max(num_items, 1)))), max(num_items, 1)))
        options = {"nlist": nlist, "nprobe": min(16, nlist), "train_size": num_items}
    elif backend == "faiss-hnsw":
        options = {"hnsw_m": 32, "ef_construction": 64, "ef_search": 64}
    options |= {name: check_option(name, value, backend) for name, value in given.items() if value is not None}
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


def import_faiss() -> Any:
    try:
        import faiss
    except ImportError as e:
        raise ImportError(
            "the faiss backends of RetrievalIndex need faiss: pip install 'pml-suprank[faiss]' (faiss-cpu), or "
            "'pml-suprank[faiss-gpu]' (faiss-gpu-cu12, CUDA 12 on Linux x86_64)"
        ) from e
    return faiss


def _float32(x: Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())


class FaissSearcher:
    """A faiss index (``backend`` of :data:`FAISS_BACKENDS`, width ``dim``, resolved ``options``) with ``add`` and
    ``search`` on torch tensors; a CUDA ``device`` puts the flat index on that GPU when faiss has GPU support."""

    def __init__(self, backend: str, dim: int, options: dict[str, int], device: torch.device) -> None:
        faiss = import_faiss()
        self.backend, self.options, self.gpu = backend, options, False  # options: the index's own dict, kept current
        if backend == "faiss":
            index = faiss.IndexFlatIP(dim)
            if device.type == "cuda" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
                self._resources = faiss.StandardGpuResources()
                index = faiss.index_cpu_to_gpu(self._resources, device.index or 0, index)
                self.gpu = True
        elif backend == "faiss-ivf":
            self._quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFFlat(self._quantizer, dim, options["nlist"], faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexHNSWFlat(dim, options["hnsw_m"], faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = options["ef_construction"]
        self.index = index
        for name in ("nprobe", "ef_search"):
            if name in options:
                self.set_search_option(name, options[name])

    def add(self, embeddings: Tensor) -> None:
        """Add ``(M, D)`` rows; an untrained IVF index is first trained on the leading ``train_size`` of them (at
        least ``nlist``: :func:`resolve_options` checked it for the rows the index is built with)."""
        if not self.index.is_trained:
            train = embeddings[: self.options["train_size"]]
            self.index.train(_float32(train))
            self.options["train_size"] = int(train.shape[0])
        self.index.add(_float32(embeddings))

    def set_search_option(self, name: str, value: int) -> None:
        """Set ``nprobe`` (IVF) or ``ef_search`` (HNSW) on the built index."""
        self.options[name] = value
        if name == "nprobe":
            self.index.nprobe = value
        else:
            self.index.hnsw.efSearch = value

    def search(self, queries: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """``(scores (Q, k) float32, indices (Q, k) long)`` on the CPU, equal scores ordered by increasing index; an
        approximate backend that finds fewer than ``k`` items pads with index ``-1`` and score ``-inf`` (last)."""
        if self.gpu and k > FAISS_GPU_MAX_K:
            raise ValueError(f"k={k} exceeds faiss-GPU's limit of {FAISS_GPU_MAX_K}; use backend='torch'")
        scores, indices = self.index.search(_float32(queries), k)
        indices = torch.from_numpy(indices).long()
        # equal scores within the returned k in increasing gallery index (faiss's own order among ties varies)
        return merge_topk(torch.from_numpy(scores).masked_fill(indices < 0, float("-inf")), indices, k)
