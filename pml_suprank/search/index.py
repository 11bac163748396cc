"""``RetrievalIndex``: a gallery of embeddings (with optional labels and ids) searched by inner product, exactly in
chunks (``"torch"``, :mod:`.topk`) or with faiss (:mod:`.faiss_backends`), saved as validated files (:mod:`.storage`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._scaling import times_power_of_two
from .._validation import check_bool, check_choice, check_device, check_embeddings, check_labels, check_positive_int
from ..collectives import all_gather, comm_device, is_distributed, shard_range
from .faiss_backends import BACKENDS, INT32_MAX, FaissSearcher, resolve_options
from .scale import check_scores_fit, max_abs, underflow_exponent
from .storage import check_ids, read_index_files, write_index_files
from .topk import DEFAULT_BLOCK_ELEMENTS, exact_topk

__all__ = ["RetrievalIndex"]


class RetrievalIndex:
    """A searchable gallery: ``(N, D)`` embeddings, optional ``(N,)`` / ``(N, L)`` labels and ``N`` ids.

    ``search(queries, k)`` returns, for each query ``q``, the ``k`` gallery rows ``j`` of largest score ``s_j = <q,
    g_j>`` (cosine similarity for L2-normalised embeddings, as :class:`~pml_suprank.models.RetrievalModel` outputs) by
    decreasing score; the ``"torch"`` backend orders equal scores by increasing gallery index.

    Args:
        embeddings: ``(N, D)`` finite floating-point gallery embeddings, ``N >= 1``; stored in float32 (float64 kept
            as float64 for the torch backend) on ``device``.
        labels: optional ``(N,)`` or ``(N, L)`` integer labels (column 0 finest), kept on the CPU.
        ids: optional list of ``N`` str / int identifiers (e.g. file names), saved in the JSON file.
        backend: ``"torch"`` (exact, chunked: no ``Q × N`` matrix; default), ``"faiss"`` (exact, ties in faiss
            order), ``"faiss-ivf"`` or ``"faiss-hnsw"`` (approximate).
        device: where the embeddings live and the torch backend computes (default: the device of ``embeddings``);
            ``"faiss"`` runs on that GPU when it is a CUDA device and faiss has GPU support.
        block_elements: torch backend: score entries computed at once (memory, not results), at most ``2**31 - 1``.
        **options: ``"faiss-ivf"``: ``nlist``, ``nprobe``, ``train_size`` (k-means cells, cells scanned per query,
            leading rows the quantizer is trained on); ``"faiss-hnsw"``: ``hnsw_m``, ``ef_construction``,
            ``ef_search`` (links per node, candidate-list sizes). Defaults and checks (before anything is allocated:
            ints in ``[1, maximum]`` of :data:`~pml_suprank.search.faiss_backends.OPTIONS`, ``nlist <=`` the
            training rows, ``nprobe <= nlist``): :func:`~pml_suprank.search.faiss_backends.resolve_options`.

    Example:
        >>> index = RetrievalIndex(gallery, labels=gallery_labels)
        >>> scores, indices = index.search(queries, k=10)   # (Q, 10) each
        >>> index.save("my_index"); same = RetrievalIndex.load("my_index")
    """

    def __init__(
        self,
        embeddings: Tensor,
        labels: Tensor | None = None,
        ids: Any = None,
        backend: str = "torch",
        device: torch.device | str | None = None,
        *,
        block_elements: int = DEFAULT_BLOCK_ELEMENTS,
        **options: int,
    ) -> None:
        self.backend = check_choice("backend", backend, BACKENDS)
        embeddings = check_embeddings("embeddings", embeddings)
        parsed = check_device("device", device)
        self.device = parsed if parsed is not None else embeddings.device
        self.block_elements = check_positive_int("block_elements", block_elements)
        if self.block_elements > INT32_MAX:
            raise ValueError(f"block_elements must be <= {INT32_MAX}; got {self.block_elements}")
        self.options = resolve_options(self.backend, options, int(embeddings.shape[0]))
        keep64 = embeddings.dtype == torch.float64 and self.backend == "torch"
        self.dtype = torch.float64 if keep64 else torch.float32
        self.dim = int(embeddings.shape[1])
        self._embeddings = embeddings.detach().to(self.device, self.dtype)
        self._max_abs = max_abs(self._embeddings)
        self.labels = None if labels is None else check_labels("labels", labels, embeddings.shape[0]).long().cpu()
        self.ids = None if ids is None else check_ids("ids", ids, embeddings.shape[0])
        self._faiss = None
        if self.backend != "torch":
            self._faiss = FaissSearcher(self.backend, self.dim, self.options, self.device)
            self._faiss.add(self._embeddings)  # an IVF index records the rows it was trained on in options

    def __len__(self) -> int:
        return int(self._embeddings.shape[0])

    @property
    def embeddings(self) -> Tensor:
        """The ``(N, D)`` stored gallery embeddings (read-only view; use :meth:`add` to grow the index)."""
        return self._embeddings

    def __repr__(self) -> str:
        extra = f", options={self.options}" if self.options else ""
        return (
            f"RetrievalIndex(num_items={len(self)}, dim={self.dim}, backend={self.backend!r}, device={self.device}, "
            f"labels={self.labels is not None}, ids={self.ids is not None}{extra})"
        )

    def _checked_rows(self, name: str, x: Any) -> Tensor:
        x = check_embeddings(name, x)
        if x.shape[1] != self.dim:
            raise ValueError(f"{name} must have width D={self.dim} (the index's embedding size); got {tuple(x.shape)}")
        return x

    def _checked_labels(self, labels: Any, n: int) -> Tensor:
        labels = check_labels("labels", labels, n)
        if self.labels is not None and labels.shape[1:] != self.labels.shape[1:]:
            raise ValueError(
                f"labels must have the index's label shape (n, *{tuple(self.labels.shape[1:])}); "
                f"got shape {tuple(labels.shape)}"
            )
        return labels.long()

    def add(self, embeddings: Tensor, labels: Tensor | None = None, ids: Any = None) -> RetrievalIndex:
        """Append ``(M, D)`` embeddings (and their labels / ids: required exactly when the index has them); their
        gallery indices are ``len(index) ... len(index) + M - 1``. Returns ``self``."""
        embeddings = self._checked_rows("embeddings", embeddings)
        m = embeddings.shape[0]
        for name, value, held in (("labels", labels, self.labels), ("ids", ids, self.ids)):
            if (value is None) != (held is None):
                has = "has" if held is not None else "has no"
                raise ValueError(f"{name} must be given exactly when the index has them; this index {has} {name}")
        new_labels = None if labels is None else self._checked_labels(labels, m).cpu()
        new_ids = None if ids is None else check_ids("ids", ids, m)
        new = embeddings.detach().to(self.device, self.dtype)
        if self._faiss is not None:
            self._faiss.add(new)
        self._max_abs = max(self._max_abs, max_abs(new))
        self._embeddings = torch.cat([self._embeddings, new])
        if new_labels is not None:
            self.labels = torch.cat([self.labels, new_labels])
        if new_ids is not None:
            self.ids = self.ids + new_ids
        return self

    def set_search_options(self, *, nprobe: int | None = None, ef_search: int | None = None) -> RetrievalIndex:
        """Change the search-time parameter of an approximate backend (``nprobe`` of ``"faiss-ivf"``, ``ef_search``
        of ``"faiss-hnsw"``) without rebuilding it; saved with the index. Returns ``self``."""
        given = {name: value for name, value in (("nprobe", nprobe), ("ef_search", ef_search)) if value is not None}
        resolved = resolve_options(self.backend, {**self.options, **given}, len(self))  # nprobe <= nlist too
        for name in given:
            self._faiss.set_search_option(name, resolved[name])  # and in self.options
        return self

    def search(
        self, queries: Tensor, k: int, *, progress: bool = False, distributed: bool = False, process_group: Any = None
    ) -> tuple[Tensor, Tensor]:
        """The ``k`` best gallery items of each query by inner product.

        Args:
            queries: ``(Q, D)`` finite floating-point embeddings (``Q >= 1``), the gallery's width.
            k: ``1 <= k <= len(index)``.
            progress: a tqdm bar over the query blocks (torch backend).
            distributed: a collective over ``process_group`` (default: the world), every process calling with the same
                queries and gallery: each searches its contiguous share of the queries, gathered once, so every
                process returns the one-process result. Nothing changes without a process group.

        Returns:
            ``scores (Q, k)`` (decreasing along each row) and ``indices (Q, k)`` (long gallery rows) on the index
            device; ties by increasing gallery index (torch backend); approximate backends pad with index ``-1``,
            score ``-inf``.

        Raises:
            TypeError / ValueError: bad ``queries`` or ``k``; scores that could overflow the index dtype
                (:mod:`pml_suprank.search.scale`; tiny ones that would underflow are ranked exactly).
        """
        queries = self._checked_rows("queries", queries)
        k = check_positive_int("k", k)
        if k > len(self):
            raise ValueError(f"k must be <= the number of gallery items ({len(self)}); got k={k}")
        query_abs = max_abs(queries)
        check_scores_fit("queries", queries, query_abs, self._embeddings, self._max_abs, self.dtype)
        shift = underflow_exponent(query_abs, self._max_abs, self.dtype)  # 0 unless scores would underflow
        check_bool("distributed", distributed)
        split = is_distributed(process_group) and distributed  # the group checked whatever `distributed` says
        if split:
            start, end = shard_range(queries.shape[0], process_group)
            queries = queries[start:end]
        q = times_power_of_two(queries.detach().to(self.device, self.dtype), shift)
        if q.shape[0] == 0:  # a process with no share of the queries
            scores = torch.empty(0, k, dtype=self.dtype, device=self.device)
            indices = torch.empty(0, k, dtype=torch.long, device=self.device)
        elif self._faiss is not None:
            scores, indices = self._faiss.search(q, k)
            scores, indices = scores.to(self.device), indices.to(self.device)
        else:
            scores, indices = exact_topk(q, self._embeddings, k, block_elements=self.block_elements, progress=progress)
        if split:
            wire = comm_device(process_group, self.device)
            scores = all_gather(scores.to(wire), process_group).to(self.device)
            indices = all_gather(indices.to(wire), process_group).to(self.device)
        return times_power_of_two(scores, -shift), indices

    def save(self, folder: str | Path) -> Path:
        """Write ``index.safetensors`` (embeddings, labels) and ``index.json`` (backend, options, ids, shapes, a
        SHA-256 of the tensor file) to ``folder`` (:mod:`pml_suprank.search.storage`); approximate faiss structures
        are rebuilt by :meth:`load`, not stored. Returns the folder."""
        meta = {"backend": self.backend, "options": self.options, "ids": self.ids}
        return write_index_files(folder, self._embeddings, self.labels, meta)

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str | None = "cpu") -> RetrievalIndex:
        """Read a folder written by :meth:`save`, validating every file (a ``ValueError`` naming the file and the
        field for anything tampered or inconsistent; nothing is unpickled), and rebuild the index on ``device``
        with its saved backend and options (IVF: trained on the same leading ``train_size`` rows)."""
        emb, labels, meta = read_index_files(folder)
        options = dict(meta["options"])
        m = options.pop("train_size", len(emb))
        parts = (emb, labels, meta["ids"])  # the first train_size rows build the index, the rest are added
        head, tail = ([None if p is None else p[s] for p in parts] for s in (slice(m), slice(m, None)))
        index = cls(*head, backend=meta["backend"], device=device, **options)
        return index.add(*tail) if m < len(emb) else index
