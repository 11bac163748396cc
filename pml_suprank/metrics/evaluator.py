"""Chunked, exact full-ranking retrieval evaluation (:class:`RetrievalEvaluator`).

The gallery is permuted once by label path (:mod:`.eval_blocks`); each chunk of queries is one matmul against it
(or its column blocks, :func:`~.eval_blocks.block_shape`), then its relevant items are ranked and the negatives
counted (:func:`~.eval_blocks.chunk_ranks`): ``O(Q·N·D + Q·N + Σ_q P_q log P_q)``, one host transfer at the end.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from torch import Tensor

from .._eval_mode import eval_mode
from .._scaling import overflow_safe_scales
from .._validation import (
    check_bool,
    check_choice,
    check_device,
    check_embeddings,
    check_labels,
    check_level_weights,
    check_positive,
    check_positive_int,
)
from ..collectives import all_gather, comm_device, is_distributed, shard_range
from ..relevance import Hierarchy, as_hierarchy, hierarchical_label_pair
from .eval_blocks import GalleryBlocks, block_counts, block_shape, chunk_ranks, label_blocks
from .multilabel_eval import check_multilabel_labels, evaluate_multilabel, multilabel_groups, query_counts
from .ranks import COUNTING_METHODS, RetrievalRanks
from .registry import METRIC_GROUPS, SINGLE_LABEL_GROUPS, TOP_K_GROUPS, check_groups, metrics_from_ranks

__all__ = ["RetrievalEvaluator", "compute_embeddings", "METRIC_GROUPS"]


class RetrievalEvaluator:
    """Exact retrieval metrics over the whole gallery, chunked over queries, on any device.

    Metrics (means over the queries where defined; pessimistic ties; the query removed from its own gallery by
    index; queries without positives excluded and counted):

    * fine level: ``"ap"``, ``"map_at_r"``, ``"r_precision"``, ``"precision_at_1"``, ``"recall_at_{k}"`` (hit rate),
      ``"precision_at_{k}"``, ``"true_recall_at_{k}"``, ``"map_at_{k}"`` for ``k`` in ``k_values``;
    * hierarchical: ``"h_ap"`` (SupRank Eq. 19, pop relevance Eq. 20 with ``alpha``, counted on the gallery searched),
      ``"ndcg"`` (Eq. 23), ``"asi"`` (App. C-A1), ``"sum_w_ap"`` (ΣwAP with ``level_weights``);
    * per hierarchy level ``h`` (label column, 0 = finest; positives share the label of column ``h``):
      ``"ap_level{h}"``, ``"map_at_r_level{h}"``, ``"recall_at_{k}_level{h}"``;
    * counts: ``"num_queries"``, ``"num_queries_without_positives"`` (fine level),
      ``"num_queries_without_positives_level{h}"``, ``"num_queries_without_relevant"`` (nothing at any level).

    **Multi-label data** (``multilabel=True``, never guessed from the shape): ``(N, M)`` fine-label sets padded with
    ``-1``; graded ``"h_ap"``/``"ndcg"``, ``"mean_label_ap"``, no ``"asi"``/``"sum_w_ap"`` (:mod:`.multilabel_eval`).

    Embeddings must be finite; an overflowing ``max|q| · max|g| · D`` is avoided by exact power-of-two scaling.

    Args:
        k_values: the ``k`` of the top-k metrics.
        alpha: ``α`` of the H-AP relevance (1 = HAPPIER).
        chunk_size: queries per chunk; default: sized to the device
            (:func:`~pml_suprank.metrics.eval_blocks.block_shape`).
        device: where to compute (default: the device of ``query``); an unavailable backend raises ``ValueError``.
        metrics: keys of :data:`METRIC_GROUPS`; default: every single-label group
            (:data:`~pml_suprank.metrics.registry.SINGLE_LABEL_GROUPS`), or every multi-label one
            (:data:`~pml_suprank.metrics.registry.MULTILABEL_GROUPS`) for multi-label data.
        level_weights: ``w_1..w_L`` for ΣwAP (``w_L`` = finest): finite, ``>= 0``, not all zero; default uniform.
        hierarchy: fine -> ancestors table ``(num_fine, L)`` or :class:`~pml_suprank.relevance.Hierarchy`, used to
            expand 1-D labels.
        backend: ``"torch"`` (exact, every metric) or ``"faiss"`` (``IndexFlatIP`` k-NN; only the top-k metric groups
            :data:`~pml_suprank.metrics.registry.TOP_K_GROUPS`; ties in faiss order).
        progress_bar: show a tqdm bar over chunks.
        num_bins, counting: speed only, as in :func:`~pml_suprank.metrics.ranks.retrieval_ranks`.
        multilabel: default of :meth:`evaluate`'s ``multilabel``: labels are ``(N, M)`` fine-label sets.

    Example:
        >>> evaluator = RetrievalEvaluator(k_values=(1, 10))
        >>> out = evaluator.evaluate(embeddings, labels)  # labels (N,) or (N, L), column 0 finest
        >>> out["map_at_r"], out["h_ap"]
        >>> ml = RetrievalEvaluator(hierarchy=table).evaluate(embeddings, label_sets, multilabel=True)  # (N, M), -1 pad
        >>> ml["h_ap"], ml["mean_label_ap"]
    """

    def __init__(
        self,
        k_values: Sequence[int] = (1, 10, 100),
        alpha: float = 1.0,
        chunk_size: int | None = None,
        device: torch.device | str | None = None,
        *,
        metrics: Iterable[str] | None = None,
        level_weights: Sequence[float] | None = None,
        hierarchy: Hierarchy | Tensor | None = None,
        backend: str = "torch",
        progress_bar: bool = False,
        num_bins: int | None = None,
        counting: str = "auto",
        multilabel: bool = False,
    ) -> None:
        k_values = (k_values,) if isinstance(k_values, int) else tuple(k_values)
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in k_values):
            raise ValueError(f"k_values must be positive ints; got {k_values!r}")
        self.k_values = k_values
        self.alpha = check_positive("alpha", alpha, strict=False)
        self.chunk_size = check_positive_int("chunk_size", chunk_size, allow_none=True)
        self.device = check_device("device", device)
        self.backend = check_choice("backend", backend, ("torch", "faiss"))
        self.multilabel = check_bool("multilabel", multilabel)
        self._multilabel_metrics = None if metrics is None else check_groups(metrics)
        if multilabel:
            multilabel_groups(self._multilabel_metrics)  # validate now
            _check_multilabel_backend(backend)
        if metrics is None:
            metrics = TOP_K_GROUPS if backend == "faiss" else SINGLE_LABEL_GROUPS
        metrics = check_groups(metrics)
        exact_only = [m for m in metrics if m not in TOP_K_GROUPS]
        if backend == "faiss" and exact_only:
            raise ValueError(
                f"backend='faiss' only computes the top-k metrics {TOP_K_GROUPS}; got {exact_only} "
                "(use backend='torch' for exact full-ranking metrics)"
            )
        self.metrics = metrics
        self.level_weights = check_level_weights("level_weights", level_weights)
        self.hierarchy = as_hierarchy(hierarchy)
        self.progress_bar = bool(progress_bar)
        self.num_bins = check_positive_int("num_bins", num_bins, allow_none=True)
        self.counting = check_choice("counting", counting, COUNTING_METHODS)

    def __repr__(self) -> str:
        return (
            f"RetrievalEvaluator(k_values={self.k_values}, alpha={self.alpha}, chunk_size={self.chunk_size}, "
            f"device={self.device}, backend={self.backend!r})"
        )

    def evaluate(
        self,
        query: Tensor,
        query_labels: Tensor,
        reference: Tensor | None = None,
        reference_labels: Tensor | None = None,
        return_per_query: bool = False,
        *,
        ref_includes_query: bool = False,
        multilabel: bool | None = None,
        device: torch.device | str | None = None,
        distributed: bool = False,
        process_group: Any = None,
    ) -> dict[str, Any]:
        """Evaluate ``query`` against ``reference`` (default: the query set itself, each query removed by index).

        Args:
            query: ``(Q, D)`` embeddings (compared by dot product: pass L2-normalised embeddings for cosine).
            query_labels: ``(Q,)`` or ``(Q, L)`` integer labels (column 0 finest), or fine labels + ``hierarchy``.
            reference: ``(N, D)`` gallery embeddings, or None.
            reference_labels: labels of the gallery, same number of levels as ``query_labels``.
            return_per_query: also return ``"per_query"``: ``{key: (Q,) float64 tensor}`` (NaN = undefined).
            ref_includes_query: the first ``Q`` rows of ``reference`` are the queries (PML convention).
            multilabel: labels are ``(Q, M)`` / ``(N, M)`` fine-label sets padded with ``-1``; default: the
                constructor's ``multilabel``.
            device: where to compute this call; default: the constructor's ``device``, else that of ``query``.
            distributed: a collective: every process of ``process_group`` calls with the same arguments, ranks its
                share of the queries and gets the one-process result (keep ``False`` when only some evaluate).
            process_group: the ``torch.distributed`` group of ``distributed`` (default: the world).

        Returns:
            dict of float means (and int counts), plus ``"per_query"`` when asked.
        """
        multilabel = self.multilabel if multilabel is None else check_bool("multilabel", multilabel)
        check_bool("distributed", distributed)
        device = check_device("device", device)
        evaluator = self
        if device is not None and device != self.device:  # this call only: a copy with that device
            evaluator = copy.copy(self)
            evaluator.device = device
        if multilabel:
            _check_multilabel_backend(self.backend)
        check = partial(check_multilabel_labels, hierarchy=self.hierarchy) if multilabel else check_labels
        args = _check_inputs(query, query_labels, reference, reference_labels, ref_includes_query, check)
        if args[4]:  # all the queries checked, also when each process ranks a share of them
            _check_queries_first(*args[:4], label_sets=multilabel)
        if not (is_distributed(process_group) and distributed):  # the group checked whatever `distributed` says
            per_query, Q, L = evaluator._per_query(*args, multilabel)
            return self._summarise(per_query, Q, L, return_per_query)
        query, ql, reference, rl, riq = args
        total = query.shape[0]
        start, end = shard_range(total, process_group)
        stop = max(end, start + 1)
        if riq:  # this process's queries first in the gallery
            order = torch.cat([torch.arange(start, stop), torch.arange(start), torch.arange(stop, reference.shape[0])])
            reference, rl = reference[order.to(reference.device)], rl[order.to(rl.device)]
        per_query, _, L = evaluator._per_query(query[start:stop], ql[start:stop], reference, rl, riq, multilabel)
        if end == start:  # fewer queries than processes: this one ranked a query only to learn the keys
            per_query = {k: v[:0] for k, v in per_query.items()}
        keys = sorted(per_query)
        rows = torch.stack([per_query[k].double() for k in keys], 1) if keys else torch.empty(end - start, 0)
        rows = all_gather(rows.to(comm_device(process_group)), process_group).cpu()
        return self._summarise(dict(zip(keys, rows.unbind(1))), total, L, return_per_query)

    def _per_query(
        self, query: Tensor, ql: Tensor, reference: Tensor, rl: Tensor, riq: bool, multilabel: bool
    ) -> tuple[dict[str, Tensor], int, int]:
        """``({key: (Q,) float64 on the host}, Q, L)`` of checked inputs, including the ``_``-prefixed counts."""
        if multilabel:
            return evaluate_multilabel(self, query, ql, reference, rl, riq)
        ql, rl = hierarchical_label_pair(ql, rl, self.hierarchy, names=("query_labels", "reference_labels"))
        if self.backend == "faiss":
            return self._faiss_per_query(query, ql, reference, rl, riq), query.shape[0], ql.shape[1]
        device, dtype = self._device_dtype(query)
        Q, N, L = query.shape[0], reference.shape[0], ql.shape[1]
        perm, starts, ends = label_blocks(ql.cpu(), rl.cpu())
        self_col = None
        if riq:  # the column of each query in the permuted gallery
            self_col = torch.empty_like(perm).scatter_(0, perm, torch.arange(N))[:Q]
        gallery = reference.detach()[perm.to(reference.device)].to(dtype=dtype)
        # relevant slots per query, read once from host tensors: they size chunks and slot widths (no read-back)
        n_block = (ends[:, 0] - starts[:, 0]).tolist()
        # bytes the gallery would take on an accelerator it is not on yet (host memory is never the limit)
        moved = 0 if device.type in ("cpu", gallery.device.type) else gallery.numel() * gallery.element_size()
        chunk, width = block_shape(N, max(n_block, default=0), device, L, self.chunk_size, moved)
        order = None
        # streamed gallery: queries in gallery order, the relevant columns of a chunk are a narrow band
        if width < N:
            order = torch.sort(starts[:, 0], stable=True).indices
            starts, ends = starts[order], ends[order]
            self_col = None if self_col is None else self_col[order]
            n_block = [n_block[i] for i in order.tolist()]
        block_sizes = [max(n_block[i : i + chunk]) for i in range(0, Q, chunk)]
        starts, ends = starts.to(device), ends.to(device)
        self_col = None if self_col is None else self_col.to(device)
        workspace: dict[str, Tensor] = {}

        def per_chunk(i: int, s: int, e: int, scores: Tensor | GalleryBlocks) -> dict[str, Tensor]:
            cols = None if self_col is None else self_col[s:e]
            args = (self.num_bins, workspace, self.counting, block_sizes[i])
            return self._metrics_from_ranks(chunk_ranks(scores, starts[s:e], ends[s:e], cols, *args))

        return self._scan(query, gallery, device, chunk, per_chunk, width, order), Q, L

    def _device_dtype(self, query: Tensor) -> tuple[torch.device, torch.dtype]:
        """Where this evaluation computes (the evaluator's device, else the query's) and in which float dtype."""
        dtype = query.dtype if query.dtype in (torch.float32, torch.float64) else torch.float32
        return torch.device(self.device if self.device is not None else query.device), dtype

    def _scan(
        self,
        query: Tensor,
        gallery: Tensor,
        device: torch.device,
        chunk: int,
        per_chunk: Callable[[int, int, int, Tensor | GalleryBlocks], dict[str, Tensor]],
        width: int | None = None,
        order: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """``{key: (Q,) float64 on the host}`` in query order from ``per_chunk(i, start, end, scores)`` of the
        ``i``-th chunk of ``chunk`` queries (taken in ``order`` when given): ``(C, N)`` scores on ``device`` in the
        gallery's dtype, or :class:`GalleryBlocks` of ``width < N`` columns."""
        Q, N = query.shape[0], gallery.shape[0]
        query_scale, gallery = overflow_safe_scales(query, gallery)
        if width is None or width == N:  # whole rows: the gallery on the device once
            width, gallery = N, gallery.to(device)
            score_buf = torch.empty(min(chunk, Q), N, dtype=gallery.dtype, device=device)
        per_query: dict[str, list[Tensor]] = {}
        with torch.no_grad():
            for i, s in enumerate(_progress(range(0, Q, chunk), not self.progress_bar, "retrieval eval")):
                e = min(s + chunk, Q)
                rows = slice(s, e) if order is None else order[s:e].to(query.device)
                queries = query.detach()[rows].to(device=device, dtype=gallery.dtype)  # travel chunk by chunk
                if query_scale != 1.0:
                    queries = queries * query_scale
                if width == N:
                    scores = torch.mm(queries, gallery.T, out=score_buf[: e - s])
                else:  # the gallery travels block by block
                    scores = GalleryBlocks(queries, gallery, width)
                for key, value in per_chunk(i, s, e, scores).items():
                    per_query.setdefault(key, []).append(value)  # stays on the device until the end
        keys = list(per_query)
        host = torch.stack([torch.cat(per_query[k]) for k in keys]).cpu() if keys else ()  # one transfer
        per_query = dict(zip(keys, host))
        if order is not None:  # back to query order (the inverse permutation)
            inverse = torch.argsort(order)
            per_query = {key: value[inverse] for key, value in per_query.items()}
        return per_query

    def _metrics_from_ranks(self, ranks: RetrievalRanks) -> dict[str, Tensor]:
        out = metrics_from_ranks(
            ranks, k_values=self.k_values, groups=self.metrics, alpha=self.alpha, level_weights=self.level_weights
        )
        return out | query_counts(ranks.counts)

    @staticmethod
    def _summarise(per_query: dict[str, Tensor], Q: int, L: int, return_per_query: bool) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, v in per_query.items():
            if key.startswith("_"):
                continue
            ok = ~torch.isnan(v)
            result[key] = float(v[ok].mean()) if bool(ok.any()) else float("nan")
        result["num_queries"] = Q
        without = [int((per_query[f"_n_pos_level{h}"] == 0).sum()) for h in range(L)]
        result["num_queries_without_positives"] = without[0]
        result["num_queries_without_relevant"] = without[L - 1]
        result.update({f"num_queries_without_positives_level{h}": n for h, n in enumerate(without)})
        if return_per_query:
            result["per_query"] = {k: v for k, v in per_query.items() if not k.startswith("_")}
        return result

    def _faiss_per_query(
        self, query: Tensor, ql: Tensor, reference: Tensor, rl: Tensor, riq: bool
    ) -> dict[str, Tensor]:
        try:
            import faiss
        except ImportError as e:
            raise ImportError("backend='faiss' needs faiss: pip install 'pml-suprank[faiss]' (or '[faiss-gpu]')") from e
        import numpy as np

        Q, N = query.shape[0], reference.shape[0]
        kmax = min(max(self.k_values + (1,)), N - riq)
        index = faiss.IndexFlatIP(reference.shape[1])
        index.add(np.ascontiguousarray(reference.detach().cpu().float().numpy()))
        _, nn = index.search(np.ascontiguousarray(query.detach().cpu().float().numpy()), kmax + riq)
        nn = torch.from_numpy(nn).long()
        if riq:  # drop the query itself by index (keep the first kmax others)
            keep = nn != torch.arange(Q)[:, None]
            order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :kmax]
            nn = nn.gather(1, order)
        ranks = _knn_ranks(nn, ql.cpu(), rl.cpu(), riq)
        return {k: v.double() for k, v in self._metrics_from_ranks(ranks).items()}


def _check_multilabel_backend(backend: str) -> None:
    if backend != "torch":
        raise ValueError(f"multilabel=True needs backend='torch' (exact full ranking); got backend={backend!r}")


def _check_inputs(query: Any, query_labels: Any, reference: Any, reference_labels: Any, riq: bool, check: Callable):
    """Checked ``(query, query_labels, reference, reference_labels, ref_includes_query)`` (``reference`` None: the
    queries themselves), labels checked by ``check(name, labels, n, n_name=...)``."""
    query = check_embeddings("query", query)
    query_labels = check("query_labels", query_labels, query.shape[0], n_name="query")
    if reference is None:
        if reference_labels is not None:
            raise ValueError("reference_labels given without reference")
        return query, query_labels, query, query_labels, True
    reference = check_embeddings("reference", reference)
    if reference_labels is None:
        raise ValueError("reference_labels must be given with reference")
    reference_labels = check("reference_labels", reference_labels, reference.shape[0], n_name="reference")
    if reference.shape[1] != query.shape[1]:
        raise ValueError(
            f"query and reference must have the same embedding size; got {query.shape[1]} and {reference.shape[1]}"
        )
    return query, query_labels, reference, reference_labels, riq


def _check_queries_first(query: Tensor, ql: Tensor, reference: Tensor, rl: Tensor, label_sets: bool) -> None:
    """``ref_includes_query=True``: the first ``Q`` rows of ``reference``/``rl`` must equal ``query``/``ql`` (labels
    compared as sets with ``label_sets``); ``ValueError`` otherwise."""
    Q = query.shape[0]
    if reference.shape[0] < Q:
        raise ValueError(
            f"ref_includes_query=True needs the queries as the first rows of reference; reference has "
            f"{reference.shape[0]} rows for {Q} queries"
        )
    if reference is query:
        return
    if label_sets:
        width = max(ql.shape[1], rl.shape[1])
        ql, rl = (torch.nn.functional.pad(x, (0, width - x.shape[1]), value=-1).sort(1).values for x in (ql, rl[:Q]))
    if not (torch.equal(ql, rl[:Q].to(ql.device)) and torch.allclose(query, reference[:Q].to(query.device))):
        raise ValueError(
            "ref_includes_query=True: the first len(query) rows of reference (and reference_labels) must equal "
            "query (and query_labels)"
        )


def _knn_ranks(nn: Tensor, query_labels: Tensor, ref_labels: Tensor, removes_self: bool) -> RetrievalRanks:
    """:class:`RetrievalRanks` of a k-NN search: the relevant items among the ``(Q, k)`` neighbours ``nn`` (``-1`` =
    none) at positions ``1..k``, and the level counts of the whole gallery."""
    Q, L = query_labels.shape
    nn_labels = ref_labels[nn.clamp_min(0)]  # (Q, k, L)
    # level = number of agreeing label columns, counted from the coarsest while they agree
    agree = (nn_labels == query_labels[:, None, :]).flip(-1).long().cumprod(-1)
    level = agree.sum(-1) * (nn >= 0)
    order = torch.sort((level == 0).to(torch.int8), dim=1, stable=True).indices  # relevant first, search order kept
    levels = level.gather(1, order)
    positions = (order + 1).masked_fill_(levels == 0, 0)
    _, starts, ends = label_blocks(query_labels, ref_labels)
    has_self = torch.full((Q,), int(removes_self), dtype=torch.long)
    return RetrievalRanks(levels, positions, block_counts(starts, ends, has_self, ref_labels.shape[0]), L)


@torch.no_grad()
def compute_embeddings(
    model: torch.nn.Module,
    dataloader: Iterable[Any],
    *,
    accelerator: Any = None,
    device: torch.device | str | None = None,
    normalize: bool = True,
    input_key: str | None = None,
    label_key: str | None = None,
    return_indices: bool = False,
    progress: bool = False,
    description: str = "embedding",
) -> tuple[Tensor, ...]:
    """Embed a whole dataloader with ``model`` (eval mode) and return ``(embeddings, labels)`` on the CPU.

    Batches are ``(inputs, labels, ...)`` tuples or dicts (inputs: the first of ``"pixel_values"``, ``"image"``,
    ``"images"``, ``"input"``; labels: ``"labels"`` or ``"label"``; indices: ``"index"`` or the third element). With an
    ``accelerate.Accelerator``, runs under its ``autocast()`` and gathers with ``gather_for_metrics``.

    Args:
        model: maps a batch of inputs to ``(B, D)`` embeddings.
        dataloader: iterable of batches.
        accelerator: optional ``accelerate.Accelerator``.
        device: where to run the model (default: ``accelerator.device`` or the model's parameters' device).
        normalize: L2-normalise the embeddings (then dot products are cosine similarities).
        input_key, label_key: dict keys of the inputs / labels.
        return_indices: also return the ``(N,)`` dataset indices of the items (dict key ``"index"``).
        progress, description: show a tqdm bar (if installed; local main process only) with this label.

    Returns:
        ``(N, D)`` float32 embeddings and ``(N,)`` or ``(N, L)`` labels, plus ``(N,)`` indices with
        ``return_indices``.
    """
    device = check_device("device", device)
    if device is None:
        p = next(iter(model.parameters()), None)
        device = accelerator.device if accelerator is not None else torch.device("cpu") if p is None else p.device
    outputs: list[list[Tensor]] = [[], [], []]
    disable = not progress or not getattr(accelerator, "is_local_main_process", True)
    with eval_mode(model):
        for batch in _progress(dataloader, disable, description):
            x, *parts = _split_batch(batch, input_key, label_key, return_indices)
            x = x.to(device, non_blocking=True) if isinstance(x, Tensor) else x
            parts = [torch.as_tensor(t).to(device) for t in parts]
            with getattr(accelerator, "autocast", nullcontext)():
                e = model(x)
            e = (e[0] if isinstance(e, (tuple, list)) else e).float()
            if normalize:
                e = torch.nn.functional.normalize(e, dim=-1)
            parts = [e, *parts]
            if accelerator is not None:
                parts = accelerator.gather_for_metrics(tuple(t.contiguous() for t in parts))
            for store, t in zip(outputs, parts):
                store.append(t.detach().cpu())
    if not outputs[0]:
        raise ValueError("dataloader yielded no batch")
    return tuple(torch.cat(store) for store in outputs[: 3 if return_indices else 2])


def _progress(iterable: Iterable[Any], disable: bool, description: str) -> Iterable[Any]:
    """``iterable`` with a tqdm bar unless ``disable`` (none without tqdm, which is in the recipes extra)."""
    if disable:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=description, dynamic_ncols=True, mininterval=1.0, leave=False)


def _split_batch(batch: Any, input_key: str | None, label_key: str | None, with_indices: bool) -> list[Any]:
    """``[inputs, labels]`` of a batch, plus its int64 dataset indices ``with_indices``."""
    if isinstance(batch, dict):
        ik = input_key or next((k for k in ("pixel_values", "image", "images", "input") if k in batch), None)
        lk = label_key or next((k for k in ("labels", "label") if k in batch), None)
        if ik is None or ik not in batch or lk is None or lk not in batch:
            raise ValueError(
                f"cannot find inputs/labels in a batch with keys {sorted(batch)}; pass input_key= and label_key="
            )
        out, index = [batch[ik], batch[lk]], batch.get("index")
    elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
        out, index = list(batch[:2]), batch[2] if len(batch) >= 3 else None
    else:
        raise TypeError(f"batches must be (inputs, labels, ...) tuples or dicts; got {type(batch).__name__}")
    if not with_indices:
        return out
    if index is None:
        raise ValueError("return_indices=True needs batches with an 'index' entry or (inputs, labels, indices) tuples")
    return [*out, torch.as_tensor(index).long()]
