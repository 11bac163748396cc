"""Exact distributed rank losses: this process's queries ranked against the global batch, normalised globally.

A rank loss on the *global* batch is not the average of per-process rank losses (PML's
``DistributedLossWrapper(efficient=True)``). :func:`reference_loss` normalises with the **global** counts of the
loss's PML reducer; :class:`DistributedRankLoss` wraps any loss with it. Without a process group: the plain call.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.reducers import DoNothingReducer, MeanReducer, SumReducer, ThresholdReducer
from torch import Tensor, nn

from .._validation import check_choice, check_embeddings, check_labels
from ..collectives import gather_batch, is_distributed, max_label_width, pad_label_sets
from ._inputs import entry_reducer, fine_labels

__all__ = ["DistributedRankLoss", "is_multilabel_loss", "pairs_without_self", "reference_loss"]

DistributedMode = Literal["local_queries", "all"]


def is_multilabel_loss(loss: Any) -> bool:
    """True when ``loss`` takes ``(N, M)`` fine-label sets padded with ``-1``: ``relevance == "multilabel"``
    (Sup-H-AP, HAPPIER, Sup-NDCG, ROD-NDCG) or ``multilabel == "per_label"`` (SupAP, ROADMAP); never guessed from
    the labels' shape (other 2-D labels are ``(N, L)`` levels)."""
    return getattr(loss, "relevance", None) == "multilabel" or getattr(loss, "multilabel", None) == "per_label"


def check_self_index(self_index: Any, num_queries: int, num_refs: int) -> Tensor:
    """Check ``self_index``: a ``(B,)`` integer tensor with values in ``[-1, N)`` (``-1``: no own copy).

    Raises:
        TypeError: not an integer tensor.
        ValueError: wrong shape, or a value outside ``[-1, N)``; the message names ``self_index`` and ``N``.
    """
    if not isinstance(self_index, Tensor) or self_index.is_floating_point() or self_index.dtype == torch.bool:
        raise TypeError(
            f"self_index must be an integer torch.Tensor of shape ({num_queries},); got "
            f"{getattr(self_index, 'dtype', type(self_index).__name__)}"
        )
    if self_index.shape != (num_queries,):
        raise ValueError(
            f"self_index must have shape (B,) = ({num_queries},), one reference row per query; got shape "
            f"{tuple(self_index.shape)}"
        )
    if num_queries and (int(self_index.min()) < -1 or int(self_index.max()) >= num_refs):
        raise ValueError(
            f"self_index must lie in [-1, {num_refs}) (rows of ref_emb, -1 = no own copy); got values in "
            f"[{int(self_index.min())}, {int(self_index.max())}]"
        )
    return self_index.long()


def pairs_without_self(labels: Tensor, ref_labels: Tensor, self_index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """All (query, reference) pairs except each query's own copy, as a PML pair tuple.

    Args:
        labels: ``(B,)`` or ``(B, L)`` query labels (column 0 of 2-D labels = finest).
        ref_labels: ``(N,)`` or ``(N, L)`` reference labels.
        self_index: ``(B,)`` long, the reference row holding query ``b``'s own copy (``-1``: none).

    Returns:
        ``(a1, p, a2, n)``: positive (same finest label) and negative pairs, without ``(b, self_index[b])``.
    """
    fine, ref_fine = fine_labels(labels), fine_labels(ref_labels)
    self_index = check_self_index(self_index, fine.shape[0], ref_fine.shape[0]).to(fine.device)
    same = fine.unsqueeze(1) == ref_fine.unsqueeze(0)
    rows = torch.arange(fine.shape[0], device=fine.device)
    keep = torch.ones_like(same)
    has_self = self_index >= 0
    keep[rows[has_self], self_index[has_self]] = False
    a1, p = torch.nonzero(same & keep, as_tuple=True)
    a2, n = torch.nonzero(~same & keep, as_tuple=True)
    return a1, p, a2, n


def _sum_and_count(loss: nn.Module, name: str, entry: dict, like: Tensor) -> tuple[Tensor, int | None]:
    """Local numerator and denominator of one loss-dict entry under the loss's reducer (``None``: no division)."""
    losses, rtype = entry["losses"], entry["reduction_type"]
    if not isinstance(losses, Tensor) and losses == 0:  # PML's zero_loss(): nothing to count on this process
        return like.sum() * 0, 0
    reducer = entry_reducer(getattr(loss, "reducer", None), name)
    if rtype == "already_reduced":
        raise ValueError(
            f"{type(loss).__name__} returns its sub-loss {name!r} already reduced on each process, which cannot be "
            "normalised over all processes exactly; use DistributedRankLoss(mode='all')"
        )
    if isinstance(reducer, DoNothingReducer):
        raise ValueError(f"{type(loss).__name__} uses DoNothingReducer, which has no scalar loss to distribute")
    losses = losses.reshape(-1)
    if isinstance(reducer, SumReducer):
        return losses.sum(), None
    if isinstance(reducer, ThresholdReducer):  # includes AvgNonZeroReducer (low=0)
        keep = torch.ones_like(losses, dtype=torch.bool)
        if reducer.low is not None:
            keep &= losses > reducer.low
        if reducer.high is not None:
            keep &= losses < reducer.high
        return losses[keep].sum(), int(keep.sum())
    if isinstance(reducer, MeanReducer) or type(reducer).__name__ == "MeanReducer":
        return losses.sum(), int(losses.numel())
    raise ValueError(
        f"{type(loss).__name__} uses reducer {type(reducer).__name__}; reference_loss supports MeanReducer, "
        "AvgNonZeroReducer/ThresholdReducer and SumReducer (use DistributedRankLoss(mode='all') otherwise)"
    )


def _local_terms(loss: nn.Module, queries, labels, indices_tuple, ref_emb, ref_labels) -> list[tuple[Tensor, Any]]:
    """``[(local_sum, local_count), ...]`` for every sub-loss of ``loss`` on the local queries."""
    if not isinstance(loss, BaseMetricLossFunction):
        raise TypeError(
            f"loss must be a pytorch-metric-learning BaseMetricLossFunction (or a pml_suprank loss); got "
            f"{type(loss).__name__}"
        )
    prepare = getattr(loss, "prepare_inputs", None)
    if prepare is not None:  # pml_suprank losses: the validation and dtype handling of their own forward
        queries, labels, ref_emb, ref_labels = prepare(queries, labels, ref_emb, ref_labels)
    elif ref_emb is None:  # PML's set_ref_emb: the batch is the reference set
        ref_emb, ref_labels = queries, labels
    loss.reset_stats()
    sub = getattr(loss, "decomposability_loss", None)  # CombinedRankLoss: the rank term, then L_dec in its parts
    if hasattr(loss, "rank_entry"):  # the kept rows, not a mean already reduced on this process
        entry = loss.rank_entry(queries, labels, indices_tuple, ref_emb, ref_labels)
        loss_dict = {"loss" if sub is None else "rank_loss": entry}
    else:
        loss_dict = loss.compute_loss(queries, labels, indices_tuple, ref_emb, ref_labels)
    loss.add_embedding_regularization_to_loss_dict(loss_dict, queries)
    terms = [_sum_and_count(loss, name, entry, queries) for name, entry in loss_dict.items()]
    if sub is not None:
        args = loss.decomposability_arguments(queries, labels, indices_tuple, ref_emb, ref_labels)
        parts = _local_terms(sub, *args, *(None,) * (5 - len(args)))
        terms.extend((float(loss.decomposability_weight) * s, c) for s, c in parts)
    return terms


def reference_loss(
    loss: nn.Module,
    queries: Tensor,
    labels: Tensor,
    ref_emb: Tensor,
    ref_labels: Tensor,
    *,
    self_index: Tensor | None = None,
    group: Any = None,
) -> Tensor:
    """Loss of this process's queries against a reference set, normalised over all processes.

    ``ref_emb`` is the gathered global batch (:func:`~pml_suprank.collectives.gather_batch`) or a shared set (a
    memory). Each sub-loss ``k`` is ``Σ_r S_k^r / Σ_r C_k^r`` (per-process numerator and count of its PML reducer),
    with the gradient of ``world_size · Σ_k S_k^r / Σ_r C_k^r``: DDP's average is the single-process gradient.

    Args:
        loss: a PML ``BaseMetricLossFunction`` (every pml_suprank loss) with a Mean / AvgNonZero / Threshold / Sum
            reducer; pml_suprank's combined losses (ROADMAP, HAPPIER, ...) are handled term by term.
        queries: ``(B_r, D)`` local query embeddings.
        labels: ``(B_r,)`` or ``(B_r, L)``.
        ref_emb: ``(N, D)`` reference embeddings (the same on every process).
        ref_labels: ``(N,)`` or ``(N, L)``.
        self_index: ``(B_r,)`` long, the row of ``ref_emb`` holding each query's own copy, removed from the counted
            pairs (``-1`` or ``None``: nothing removed; pass it with ``include_self=False``).
        group: process group.

    Returns:
        A scalar tensor.
    """
    indices_tuple = None if self_index is None else pairs_without_self(labels, ref_labels, self_index)
    if not is_distributed(group):
        return loss(queries, labels, indices_tuple, ref_emb, ref_labels)
    ws = torch.distributed.get_world_size(group)
    terms = _local_terms(loss, queries, labels, indices_tuple, ref_emb, ref_labels)
    sums = torch.stack([s.detach().to(torch.float64) for s, _ in terms])
    counts = torch.tensor([-1 if c is None else c for _, c in terms], dtype=torch.float64, device=sums.device)
    stats = torch.cat([sums, counts.clamp(min=0)])
    torch.distributed.all_reduce(stats, group=group)
    g_sums, g_counts = stats[: len(terms)], stats[len(terms) :]
    local = queries.sum() * 0
    value = 0.0
    for k, (s, c) in enumerate(terms):
        if c is None:  # SumReducer
            local = local + s
            value += float(g_sums[k])
        elif float(g_counts[k]) > 0:
            local = local + s / float(g_counts[k])
            value += float(g_sums[k]) / float(g_counts[k])
    local = ws * local
    return local + (torch.as_tensor(value, dtype=local.dtype, device=local.device) - local).detach()


class DistributedRankLoss(nn.Module):
    """Wrap a loss so that, under ``torch.distributed``, it equals the single-process loss on the global batch.

    Called like the wrapped loss on the local batch; returns the global-batch loss (with DDP, its gradient).

    Args:
        loss: the loss to wrap (a PML ``BaseMetricLossFunction``).
        mode: ``"local_queries"`` (default, :func:`reference_loss` against the gathered batch, own copies removed
            unless ``include_self``; ``O(B_local · B_global)``) or ``"all"`` (the full loss on the gathered batch on
            every process, ``O(B_global²)``; any loss and reducer).
        group: process group (default: the world).

    A ``ref_emb`` given to ``forward`` is a shared reference set (e.g. a memory); ``indices_tuple`` only without a
    process group. Multi-label sets (:func:`is_multilabel_loss`) are padded with ``-1`` to the widest of all processes.
    """

    def __init__(self, loss: nn.Module, mode: DistributedMode = "local_queries", group: Any = None) -> None:
        super().__init__()
        if not isinstance(loss, nn.Module):
            raise TypeError(f"loss must be an nn.Module loss; got {type(loss).__name__}")
        self.loss = loss
        self.mode = check_choice("mode", mode, get_args(DistributedMode))
        self.group = group

    def forward(
        self,
        embeddings: Tensor,
        labels: Tensor,
        indices_tuple: Any = None,
        ref_emb: Tensor | None = None,
        ref_labels: Tensor | None = None,
    ) -> Tensor:
        """Loss of the global batch; ``embeddings (B_r, D)``, ``labels (B_r,)`` or ``(B_r, L)``."""
        if not is_distributed(self.group):
            return self.loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        if indices_tuple is not None:
            raise ValueError("indices_tuple is not supported by DistributedRankLoss under torch.distributed; got one")
        check_embeddings("embeddings", embeddings)
        check_labels("labels", labels, embeddings.shape[0])
        labels = labels.to(embeddings.device)
        multilabel = is_multilabel_loss(self.loss)
        if ref_emb is not None:
            if ref_labels is None:
                raise ValueError("ref_labels must be given with ref_emb; got None")
            if multilabel:
                check_labels("ref_labels", ref_labels, ref_emb.shape[0], n_name="ref_emb")
                width = max(max_label_width(labels, self.group), 1 if ref_labels.dim() == 1 else ref_labels.shape[1])
                labels, ref_labels = pad_label_sets(labels, width), pad_label_sets(ref_labels, width)
            return reference_loss(self.loss, embeddings, labels, ref_emb, ref_labels, group=self.group)
        batch = gather_batch(embeddings, labels, group=self.group, multilabel=multilabel)
        if multilabel:
            labels = pad_label_sets(labels, batch.labels.shape[1])
        if self.mode == "all":
            return self.loss(batch.embeddings, batch.labels)
        self_index = None if getattr(self.loss, "include_self", False) else batch.local
        return reference_loss(
            self.loss, embeddings, labels, batch.embeddings, batch.labels, self_index=self_index, group=self.group
        )
