"""Input preparation shared by every loss of :mod:`pml_suprank.losses`; this module imports no loss.

Conventions (PML's call ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None)``): the
reference set *is* the batch when ``ref_emb is None or ref_emb is embeddings``, and the query is then removed from
it by index unless ``include_self=True`` (SupRank reference code). An ``indices_tuple`` of pairs ``(a1, p, a2, n)``
or triplets ``(a, p, n)`` restricts the counted (query, reference) pairs. Scores are cosine / dot-product
similarities in full precision. Hierarchical labels are ``(N, L)`` (column 0 finest), or ``(N,)`` fine labels with a
:class:`~pml_suprank.relevance.Hierarchy`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pytorch_metric_learning.distances import DotProductSimilarity
from pytorch_metric_learning.reducers import (
    AvgNonZeroReducer,
    MeanReducer,
    MultipleReducers,
    SumReducer,
    ThresholdReducer,
)
from torch import Tensor

from .._async_check import check_async, check_value
from .._precision import float32_forward
from .._similarity import similarity_scores
from .._validation import check_embeddings, check_labels
from ..relevance import Hierarchy

__all__ = [
    "PreparedForwardMixin",
    "RankInputs",
    "check_embedding_size",
    "check_indices_tuple",
    "check_similarity",
    "entry_reducer",
    "fine_labels",
    "prepare_inputs",
    "reduce_loss_dict",
    "reference_mask",
    "require_hierarchy",
    "scores_and_mask",
    "similarity_matrix",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass
class RankInputs:
    """What :meth:`pml_suprank.losses.BaseRankLoss.compute_query_losses` receives.

    Attributes:
        scores: ``(B, N)`` similarities ``sim(embeddings[b], ref_emb[j])`` in float32/float64, with gradient.
        valid: ``(B, N)`` bool, the counted pairs (:func:`reference_mask`).
        labels: ``(B,)`` (or ``(B, L)`` for hierarchical subclasses) integer labels of the queries.
        ref_labels: ``(N,)`` (or ``(N, L)``) labels of the reference items.
        same_source: True when the reference set is the batch itself (``ref_emb is None or ref_emb is embeddings``).
        positive_mask: ``None``, or ``(B, N)`` bool given positives (binary pseudo-queries: per-label AP).
    """

    scores: Tensor
    valid: Tensor
    labels: Tensor
    ref_labels: Tensor
    same_source: bool
    positive_mask: Tensor | None = None

    def positives(self) -> Tensor:
        """``(B, N)`` bool: :attr:`positive_mask`, else the valid items with the same (1-D) label as the query."""
        if self.positive_mask is not None:
            return self.positive_mask
        return self.valid & (self.labels.unsqueeze(1) == self.ref_labels.unsqueeze(0))


def entry_reducer(reducer, name: str):
    """The reducer of the loss-dict entry ``name`` under ``reducer`` (``MultipleReducers``: its own or the default)."""
    if isinstance(reducer, MultipleReducers):
        return reducer.reducers[name] if name in reducer.reducers else reducer.default_reducer
    return reducer


# reducers whose already-reduced path returns the value unchanged (BaseReducer.already_reduced_reduction)
_PASS_THROUGH_REDUCERS = (MeanReducer, AvgNonZeroReducer, SumReducer, ThresholdReducer)


def reduce_loss_dict(reducer, loss_dict: dict, embeddings: Tensor, labels: Tensor | None):
    """``reducer(loss_dict, embeddings, labels)``; a plain ``MultipleReducers`` (stats off) over already-reduced 0-d
    entries of standard PML reducers is summed directly (the same value, without its indexed copies)."""
    # len() > 0, not bool(dict): dynamo of torch 2.11 cannot trace bool() of a dict (fullgraph=True fails)
    direct = type(reducer) is MultipleReducers and not reducer.collect_stats and len(loss_dict) > 0
    for name, entry in loss_dict.items() if direct else ():
        sub = entry_reducer(reducer, name)
        value = entry.get("losses")
        if not (
            entry.get("reduction_type") == "already_reduced"
            and isinstance(value, Tensor)
            and value.dim() == 0
            and type(sub) in _PASS_THROUGH_REDUCERS
            and not sub.collect_stats
        ):
            direct = False
            break
    if not direct:
        return reducer(loss_dict, embeddings, labels)
    values = [entry["losses"] for entry in loss_dict.values()]
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total if total.dtype == embeddings.dtype else total.to(embeddings.dtype)


def check_similarity(owner: str, distance) -> None:
    """Accept only cosine / dot-product similarities (``CosineSimilarity``, ``DotProductSimilarity``, power 1).

    Raises:
        ValueError: naming ``owner`` and the received distance otherwise.
    """
    ok = (
        isinstance(distance, DotProductSimilarity)
        and distance.power == 1
        and distance.is_inverted
        and (not distance.normalize_embeddings or distance.p == 2)
    )
    if not ok:
        raise ValueError(
            f"{owner} needs distance=CosineSimilarity() or DotProductSimilarity() (power=1, p=2): rank losses are "
            f"defined on similarity scores; got distance={type(distance).__name__}"
            f"(p={getattr(distance, 'p', None)}, power={getattr(distance, 'power', None)}, "
            f"normalize_embeddings={getattr(distance, 'normalize_embeddings', None)})"
        )


def check_indices_tuple(indices_tuple, num_queries: int, num_refs: int) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """Validate a PML ``indices_tuple`` and return it as pairs ``(a1, p, a2, n)`` (``None`` stays ``None``).

    Args:
        indices_tuple: ``None``, pairs ``(a1, p, a2, n)`` or triplets ``(a, p, n)`` of 1-D integer tensors.
        num_queries: ``B``.
        num_refs: ``N``.

    Raises:
        ValueError / TypeError: naming ``indices_tuple`` and what was received.
    """
    if indices_tuple is None:
        return None
    if not isinstance(indices_tuple, (tuple, list)) or len(indices_tuple) not in (3, 4):
        raise ValueError(
            "indices_tuple must be None, a 4-tuple of pair indices (anchors1, positives, anchors2, negatives) or a "
            f"3-tuple of triplet indices (anchors, positives, negatives); got {type(indices_tuple).__name__} of "
            f"length {len(indices_tuple) if isinstance(indices_tuple, (tuple, list)) else 'n/a'}"
        )
    for k, idx in enumerate(indices_tuple):
        if not isinstance(idx, Tensor) or idx.dim() != 1 or idx.is_floating_point() or idx.dtype == torch.bool:
            raise TypeError(f"indices_tuple[{k}] must be a 1-D integer tensor; got {getattr(idx, 'dtype', idx)}")
    if len(indices_tuple) == 3:
        a, p, n = indices_tuple
        if not len(a) == len(p) == len(n):
            raise ValueError(f"indices_tuple triplets must have equal lengths; got {len(a)}, {len(p)}, {len(n)}")
        pairs = (a, p, a, n)
    else:
        pairs = tuple(indices_tuple)
        if len(pairs[0]) != len(pairs[1]) or len(pairs[2]) != len(pairs[3]):
            raise ValueError(
                "indices_tuple pairs must have len(anchors1) == len(positives) and len(anchors2) == len(negatives); "
                f"got {[len(x) for x in pairs]}"
            )
    for k, (idx, bound, what) in enumerate(
        zip(pairs, (num_queries, num_refs) * 2, ("embeddings", "ref_emb") * 2, strict=True)
    ):
        if len(idx):  # sync-free on accelerators (a device-side assert there), a ValueError on the CPU

            def error(k=k, idx=idx, bound=bound, what=what) -> ValueError:
                return ValueError(
                    f"indices_tuple entry {k} indexes {what} (size {bound}); "
                    f"got values in [{int(idx.min())}, {int(idx.max())}]"
                )

            check_async(((idx >= 0) & (idx < bound)).all(), error, f"indices_tuple entry {k} out of range")
    return pairs


def reference_mask(
    num_queries: int,
    num_refs: int,
    device: torch.device,
    *,
    same_source: bool,
    include_self: bool,
    indices_tuple=None,
) -> Tensor:
    """``(B, N)`` bool mask of the counted (query, reference) pairs: all, or those of ``indices_tuple`` (how PML's
    ``CrossBatchMemory`` removes the queries' own copies), minus the query itself when ``same_source`` unless
    ``include_self``."""
    pairs = check_indices_tuple(indices_tuple, num_queries, num_refs)
    if pairs is None:
        if same_source and not include_self:  # every pair but the diagonal, in two operators
            return ~torch.eye(num_queries, num_refs, dtype=torch.bool, device=device)
        valid = torch.ones(num_queries, num_refs, dtype=torch.bool, device=device)
    else:
        valid = torch.zeros(num_queries, num_refs, dtype=torch.bool, device=device)
        a1, p, a2, n = (x.to(device=device, dtype=torch.long) for x in pairs)
        valid[a1, p] = True
        valid[a2, n] = True
    if same_source and not include_self:
        idx = torch.arange(min(num_queries, num_refs), device=device)
        valid[idx, idx] = False
    return valid


def _check_reference(owner: str, embeddings: Tensor, labels: Tensor, ref_emb, ref_labels, allow_2d: bool):
    ref_emb = check_embeddings("ref_emb", ref_emb, asynchronous=True)
    if ref_emb.shape[1] != embeddings.shape[1]:
        raise ValueError(
            f"ref_emb must have the embedding size of embeddings ({embeddings.shape[1]}); got shape "
            f"{tuple(ref_emb.shape)}"
        )
    if ref_emb.device != embeddings.device:
        raise ValueError(f"ref_emb must be on {embeddings.device}; got {ref_emb.device}")
    if ref_labels is None:
        raise ValueError(f"{owner} requires ref_labels when ref_emb is given; got None")
    ref_labels = check_labels("ref_labels", ref_labels, ref_emb.shape[0], allow_2d=allow_2d, n_name="ref_emb")
    ref_labels = ref_labels.to(embeddings.device)
    if ref_labels.shape[1:] != labels.shape[1:]:
        raise ValueError(
            f"ref_labels must have the label columns of labels {tuple(labels.shape[1:])}; got shape "
            f"{tuple(ref_labels.shape)}"
        )
    return ref_emb, ref_labels


def prepare_inputs(owner: str, embeddings, labels, ref_emb, ref_labels, *, allow_2d_labels: bool = False):
    """Validate a loss call and resolve the reference set (PML's identity convention).

    Args:
        owner: the loss's name, used in error messages.
        embeddings: ``(B, D)`` floating tensor.
        labels: ``(B,)`` (or ``(B, L)`` with ``allow_2d_labels``) integer tensor.
        ref_emb: ``None``, ``embeddings`` itself, or ``(N, D)`` on the device of ``embeddings``.
        ref_labels: ``None`` (or equal to ``labels``) when the reference set is the batch, else ``(N,)``/``(N, L)``.
        allow_2d_labels: accept ``(B, L)`` labels.

    Returns:
        ``(embeddings, labels, ref_emb, ref_labels, same_source)``: fp16/bf16 up-cast to float32, ``ref_emb is
        embeddings`` for the batch, labels on the embeddings' device.
    """
    same_source = ref_emb is None or ref_emb is embeddings
    embeddings = check_embeddings("embeddings", embeddings, asynchronous=True)
    if labels is None:
        raise ValueError(f"{owner} requires labels (an integer tensor of shape (batch_size,)); got None")
    labels = check_labels("labels", labels, embeddings.shape[0], allow_2d=allow_2d_labels)
    if labels.device != embeddings.device:
        labels = labels.to(embeddings.device)
    if same_source:
        if ref_labels is not None and ref_labels is not labels:
            ref_labels = check_labels("ref_labels", ref_labels, embeddings.shape[0], allow_2d=allow_2d_labels)
            ref_labels = ref_labels.to(labels.device)

            def error() -> ValueError:
                return ValueError("ref_labels must be None or equal to labels when ref_emb is None")

            if ref_labels.shape != labels.shape:
                raise error()
            check_value((ref_labels == labels).all(), error, "ref_labels must be None or equal to labels")
        ref_labels = labels
    else:
        ref_emb, ref_labels = _check_reference(owner, embeddings, labels, ref_emb, ref_labels, allow_2d_labels)
    if embeddings.dtype in _LOW_PRECISION:
        embeddings = embeddings.float()
    if same_source:
        ref_emb = embeddings
    elif ref_emb.dtype != embeddings.dtype:
        ref_emb = ref_emb.to(embeddings.dtype)
    return embeddings, labels, ref_emb, ref_labels, same_source


def check_embedding_size(embeddings: Tensor, embedding_size: int) -> None:
    """Refuse ``(B, D)`` embeddings with ``D`` other than a proxy loss's ``embedding_size`` (``ValueError``)."""
    if embeddings.shape[1] != embedding_size:
        raise ValueError(
            f"embeddings must have embedding_size={embedding_size} columns (one proxy coordinate each); "
            f"got shape {tuple(embeddings.shape)}"
        )


def similarity_matrix(distance, embeddings: Tensor, ref_emb: Tensor) -> Tensor:
    """``(B, N)`` similarity matrix in full precision (:func:`~pml_suprank._similarity.similarity_scores`)."""
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        return similarity_scores(distance, embeddings, ref_emb)


def scores_and_mask(distance, embeddings: Tensor, ref_emb: Tensor, include_self: bool, indices_tuple):
    """``(scores (B, N), valid (B, N))`` of prepared inputs: :func:`similarity_matrix` and :func:`reference_mask`
    (the reference set is the batch when ``ref_emb is embeddings``)."""
    scores = similarity_matrix(distance, embeddings, ref_emb)
    valid = reference_mask(
        embeddings.shape[0],
        ref_emb.shape[0],
        embeddings.device,
        same_source=ref_emb is embeddings,
        include_self=include_self,
        indices_tuple=indices_tuple,
    )
    return scores, valid


def fine_labels(labels: Tensor) -> Tensor:
    """The finest level of ``labels``: column 0 of ``(N, L)`` labels, ``(N,)`` labels unchanged."""
    return labels[:, 0] if labels.dim() == 2 else labels


def require_hierarchy(owner: str, labels: Tensor, hierarchy: Hierarchy | None, name: str = "labels") -> None:
    """Refuse 1-D ``labels`` without a ``hierarchy`` (a hierarchical loss would silently train flat on them).

    Raises:
        ValueError: naming ``owner``, ``name`` and both ways out (2-D labels or ``hierarchy=``).
    """
    if labels.dim() == 1 and hierarchy is None:
        raise ValueError(
            f"{owner} is a hierarchical loss: pass 2-D {name} of shape (N, L) (column 0 = finest level; "
            f"{name}[:, None] for a deliberate single level) or build it with hierarchy= (a fine -> ancestors table) "
            f"to use 1-D fine {name}; got {name} of shape {tuple(labels.shape)} and hierarchy=None, which would "
            "silently train a flat loss"
        )


class PreparedForwardMixin:
    """PML ``forward`` with :meth:`prepare_inputs` in place of PML's ``set_ref_emb`` (the host is a PML
    ``BaseMetricLossFunction`` with an ``allow_2d_labels`` attribute)."""

    def prepare_inputs(self, embeddings, labels, ref_emb=None, ref_labels=None):
        """Validated ``(embeddings, labels, ref_emb, ref_labels)`` (:func:`prepare_inputs`)."""
        emb, labels, ref, ref_labels, _ = prepare_inputs(
            type(self).__name__, embeddings, labels, ref_emb, ref_labels, allow_2d_labels=self.allow_2d_labels
        )
        return emb, labels, ref, ref_labels

    def prepared_loss_dict(self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None):
        """``(loss_dict, embeddings, labels)`` of a call (embedding regularization included), as the reducer needs."""
        self.reset_stats()
        embeddings, labels, ref_emb, ref_labels = self.prepare_inputs(embeddings, labels, ref_emb, ref_labels)
        loss_dict = self.compute_loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return loss_dict, embeddings, labels

    @float32_forward
    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """Compute the loss (see the class docstring); a scalar tensor, float32 under autocast
        (:func:`~pml_suprank._precision.float32_forward`)."""
        loss_dict, embeddings, labels = self.prepared_loss_dict(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        return reduce_loss_dict(self.reducer, loss_dict, embeddings, labels)
