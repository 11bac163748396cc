"""``RetrievalMetric``: the exact retrieval evaluator as a streaming ``update`` / ``compute`` / ``reset`` metric that
gathers its data across processes (``torch.distributed``, hence Accelerate, Lightning, torchrun).

Exact ranking metrics are not decomposable over batches, so the metric keeps what it is given and evaluates once:

    result = RetrievalEvaluator(**kwargs).evaluate(cat_r cat_b E_{r,b}, cat_r cat_b Y_{r,b})

(``r`` processes in rank order, ``b`` ``update`` calls in order; each query against all other items). With
``indices`` the gathered items are put in index order and repeated indices kept once, dropping the padding copies of
a ``DistributedSampler``. Each process ranks its share of the queries (``evaluate(distributed=True)``) and returns
the one-process result. Memory: ``N × D`` per process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_bool, check_embeddings, check_labels
from ..collectives import all_gather, comm_device, is_distributed
from .evaluator import RetrievalEvaluator

__all__ = ["RetrievalMetric"]


def make_evaluator(evaluator: RetrievalEvaluator | None, evaluator_kwargs: dict[str, Any]) -> RetrievalEvaluator:
    """``evaluator``, or ``RetrievalEvaluator(**evaluator_kwargs)`` when it is None (never both)."""
    if evaluator is None:
        return RetrievalEvaluator(**evaluator_kwargs)
    if evaluator_kwargs:
        raise ValueError(f"give either evaluator or evaluator kwargs, not both; got {sorted(evaluator_kwargs)}")
    if not isinstance(evaluator, RetrievalEvaluator):
        raise TypeError(f"evaluator must be a RetrievalEvaluator; got {type(evaluator).__name__}")
    return evaluator


def append_update(
    embeddings: Tensor, labels: Tensor, indices: Tensor | None, kept: tuple[list[Tensor], list[Tensor], list[Tensor]]
) -> None:
    """Validate one ``update`` (as :meth:`RetrievalMetric.update`) against the batches ``kept`` so far and append it
    to them detached (``ValueError`` / ``TypeError`` naming the argument)."""
    seen_embeddings, seen_labels, seen_indices = kept
    embeddings = check_embeddings("embeddings", embeddings)
    labels = check_labels("labels", labels, embeddings.shape[0])
    if seen_embeddings:
        first_e, first_l = seen_embeddings[0], seen_labels[0]
        if embeddings.shape[1] != first_e.shape[1]:
            raise ValueError(
                f"embeddings must have width {first_e.shape[1]} like the earlier updates; got {embeddings.shape[1]}"
            )
        if labels.shape[1:] != first_l.shape[1:]:
            raise ValueError(
                f"labels must have shape {_batch_shape(first_l)} like the earlier updates; got {tuple(labels.shape)}"
            )
        if (indices is None) != (not seen_indices):
            raise ValueError("indices must be given in every update or in none")
    if indices is not None:
        if not isinstance(indices, Tensor) or indices.dtype.is_floating_point or indices.dtype == torch.bool:
            raise TypeError(f"indices must be an integer Tensor of shape (B,); got {indices!r:.80}")
        if tuple(indices.shape) != (embeddings.shape[0],):
            raise ValueError(f"indices must have shape ({embeddings.shape[0]},); got {tuple(indices.shape)}")
        seen_indices.append(indices.detach().long())
    seen_embeddings.append(embeddings.detach())
    seen_labels.append(labels.detach().long())


def dedupe_by_index(emb: Tensor, labels: Tensor, indices: Tensor) -> tuple[Tensor, Tensor]:
    """The items in dataset-index order, each repeated index kept once (a ``DistributedSampler``'s padding)."""
    order = torch.argsort(indices.cpu(), stable=True)
    sorted_idx = indices.cpu()[order]
    first = torch.ones_like(sorted_idx, dtype=torch.bool)
    first[1:] = sorted_idx[1:] != sorted_idx[:-1]
    keep = order[first]
    return emb[keep.to(emb.device)], labels[keep.to(labels.device)]


class RetrievalMetric:
    """Streaming exact retrieval metrics (AP, mAP@R, R@k, H-AP, NDCG, ASI, per-level AP, ...).

    Args:
        evaluator: a configured :class:`RetrievalEvaluator` (default: ``RetrievalEvaluator(**evaluator_kwargs)``).
        process_group: the ``torch.distributed`` group to gather over (default: the world, when initialised).
        sync: gather across processes in :meth:`compute` (``False``: this process's data only).
        **evaluator_kwargs: passed to :class:`RetrievalEvaluator` when ``evaluator`` is None.

    Example:
        >>> metric = RetrievalMetric(k_values=(1, 10))
        >>> for images, labels in loader:
        ...     metric.update(model(images), labels)       # (B, D), (B,) or (B, L)
        >>> metric.compute()["map_at_r"]
        >>> metric.reset()
    """

    def __init__(
        self,
        evaluator: RetrievalEvaluator | None = None,
        *,
        process_group: Any = None,
        sync: bool = True,
        **evaluator_kwargs: Any,
    ) -> None:
        self.evaluator = make_evaluator(evaluator, evaluator_kwargs)
        self.process_group = process_group
        self.sync = check_bool("sync", sync)
        self.reset()

    def reset(self) -> None:
        """Forget every update."""
        self._embeddings: list[Tensor] = []
        self._labels: list[Tensor] = []
        self._indices: list[Tensor] = []

    def __len__(self) -> int:
        """Number of items given to this process since the last :meth:`reset`."""
        return sum(int(e.shape[0]) for e in self._embeddings)

    def update(self, embeddings: Tensor, labels: Tensor, indices: Tensor | None = None) -> None:
        """Add a batch: ``embeddings (B, D)`` (finite floats; compared by dot product), ``labels (B,)`` or
        ``(B, L)`` integers (column 0 finest), optional ``indices (B,)`` dataset indices (then in every update);
        kept detached on their device."""
        append_update(embeddings, labels, indices, (self._embeddings, self._labels, self._indices))

    def _gather(self, emb: Tensor, labels: Tensor, indices: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """All processes' data in rank order (collective). Processes without data send empty tensors shaped like
        the others'; embeddings travel as float64 when any process holds float64, else float32."""
        group = self.process_group
        device = comm_device(group, emb.device if emb.numel() else None)
        has = bool(self._embeddings)
        shape = [emb.shape[0], emb.shape[1], labels.dim(), labels.shape[1] if labels.dim() == 2 else 0]
        values = [*shape, int(emb.dtype == torch.float64), int(indices is not None)] if has else [0, -1, -1, 0, 0, -1]
        table = all_gather(torch.tensor([values], device=device), group).cpu()  # one row per process
        full = table[table[:, 0] > 0]
        if full.shape[0] == 0:
            raise ValueError("RetrievalMetric.compute() called before any update() on every process")
        for col, what in ((1, "embedding widths"), (2, "label shapes"), (3, "label shapes"), (5, "use of indices")):
            if len(set(full[:, col].tolist())) > 1:
                raise ValueError(f"processes disagree on their {what}: {full[:, col].tolist()}")
        dtype = torch.float64 if bool(full[:, 4].any()) else torch.float32
        if not has:
            width, ndim, cols = (int(v) for v in full[0, 1:4])
            emb = torch.empty(0, width)
            labels = torch.empty((0,) if ndim == 1 else (0, cols), dtype=torch.long)
            indices = torch.empty(0, dtype=torch.long) if bool(full[0, 5]) else None
        emb = all_gather(emb.to(device, dtype), group)
        labels = all_gather(labels.to(device), group)
        indices = None if indices is None else all_gather(indices.to(device), group)
        return emb, labels, indices

    def compute(self, **evaluate_kwargs: Any) -> dict[str, Any]:
        """Evaluate everything given since the last :meth:`reset` (a collective when distributed and ``sync``: every
        process calls it, with or without data); keyword arguments go to :meth:`RetrievalEvaluator.evaluate`.

        Returns:
            what ``RetrievalEvaluator.evaluate`` returns on the gathered, concatenated data.
        """
        split = self.sync and is_distributed(self.process_group)
        if not (split or self._embeddings):
            raise ValueError("RetrievalMetric.compute() called before any update()")
        emb = torch.cat(self._embeddings) if self._embeddings else torch.empty(0, 0)
        labels = torch.cat(self._labels) if self._labels else torch.empty(0, dtype=torch.long)
        indices = torch.cat(self._indices) if self._indices else None
        if split:
            emb, labels, indices = self._gather(emb, labels, indices)
        if indices is not None:
            emb, labels = dedupe_by_index(emb, labels, indices)
        if split:  # every process ranks its share of the queries against all the items; results gathered once
            evaluate_kwargs = {"distributed": True, "process_group": self.process_group, **evaluate_kwargs}
        return self.evaluator.evaluate(emb, labels, **evaluate_kwargs)


def _batch_shape(labels: Tensor) -> str:
    """``"(B,)"`` or ``"(B, L)"`` with ``labels``' trailing size, for an error message."""
    return "(B,)" if labels.dim() == 1 else f"(B, {', '.join(str(n) for n in labels.shape[1:])})"
