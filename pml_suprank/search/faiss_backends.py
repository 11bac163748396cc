"""faiss backends of :class:`~pml_suprank.search.RetrievalIndex`, all by inner product (faiss imported only here,
when used: ``pip install pml-suprank[faiss]``).

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

from .topk import merge_topk

__all__ = ["FAISS_BACKENDS", "FAISS_GPU_MAX_K", "FaissSearcher", "default_options", "import_faiss"]

FAISS_BACKENDS = ("faiss", "faiss-ivf", "faiss-hnsw")
FAISS_GPU_MAX_K = 2048


def import_faiss() -> Any:
    try:
        import faiss
    except ImportError as e:
        raise ImportError(
            "the faiss backends of RetrievalIndex need faiss: pip install 'pml-suprank[faiss]' (faiss-cpu), or "
            "'pml-suprank[faiss-gpu]' (faiss-gpu-cu12, CUDA 12 on Linux x86_64)"
        ) from e
    return faiss


def default_options(backend: str, num_items: int) -> dict[str, int]:
    """Default parameters of ``backend`` for ``num_items`` rows (``{}`` for the exact backends). IVF: ``nlist =
    clamp(round(4·sqrt(N)), 1, N)``, ``nprobe = min(16, nlist)``, ``train_size = N``; HNSW: ``hnsw_m = 32``,
    ``ef_construction = ef_search = 64``."""
    if backend == "faiss-ivf":
        nlist = int(min(max(1, round(4 * math.sqrt(max(num_items, 1)))), max(num_items, 1)))
        return {"nlist": nlist, "nprobe": min(16, nlist), "train_size": num_items}
    if backend == "faiss-hnsw":
        return {"hnsw_m": 32, "ef_construction": 64, "ef_search": 64}
    return {}


def _float32(x: Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())


class FaissSearcher:
    """A faiss index (``backend`` of :data:`FAISS_BACKENDS`, width ``dim``, resolved ``options``) with ``add`` and
    ``search`` on torch tensors; a CUDA ``device`` puts the flat index on that GPU when faiss has GPU support."""

    def __init__(self, backend: str, dim: int, options: dict[str, int], device: torch.device) -> None:
        faiss = import_faiss()
        self.backend = backend
        self.options = dict(options)
        self.trained_rows = 0
        self.gpu = False
        if backend == "faiss":
            index = faiss.IndexFlatIP(dim)
            if device.type == "cuda" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
                self._resources = faiss.StandardGpuResources()
                index = faiss.index_cpu_to_gpu(self._resources, device.index or 0, index)
                self.gpu = True
        elif backend == "faiss-ivf":
            self._quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFFlat(self._quantizer, dim, options["nlist"], faiss.METRIC_INNER_PRODUCT)
            index.nprobe = options["nprobe"]
        elif backend == "faiss-hnsw":
            index = faiss.IndexHNSWFlat(dim, options["hnsw_m"], faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = options["ef_construction"]
            index.hnsw.efSearch = options["ef_search"]
        else:  # pragma: no cover - checked by RetrievalIndex
            raise ValueError(f"backend must be one of {FAISS_BACKENDS}; got {backend!r}")
        self.index = index

    def train(self, embeddings: Tensor) -> None:
        """Train the IVF quantizer on ``embeddings`` ``(N, D)`` (needs ``N >= nlist``); no-op for other kinds."""
        if self.backend != "faiss-ivf":
            return
        nlist = self.options["nlist"]
        embeddings = embeddings[: self.options["train_size"]]
        if embeddings.shape[0] < nlist:
            raise ValueError(
                f"backend='faiss-ivf' needs at least nlist={nlist} embeddings to train its {nlist} cells; got "
                f"{embeddings.shape[0]} (lower nlist)"
            )
        self.index.train(_float32(embeddings))
        self.trained_rows = int(embeddings.shape[0])

    def add(self, embeddings: Tensor) -> None:
        if not self.index.is_trained:
            self.train(embeddings)
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
        scores = torch.from_numpy(scores)
        indices = torch.from_numpy(indices).long()
        # equal scores within the returned k in increasing gallery index (faiss's own order among ties varies)
        return merge_topk(scores.masked_fill(indices < 0, float("-inf")), indices, k)
