"""``BaseRankLoss``: the PML ``BaseMetricLossFunction`` subclass shared by every rank loss of the package.

It owns everything that is not the rank surrogate itself: the score matrix, which reference items count for each
query (``include_self``, ``indices_tuple``), mixed precision, dropping queries without a positive and PML reducers
(input validation lives in :mod:`pml_suprank.losses._inputs`). Subclasses implement one hook,
:meth:`BaseRankLoss.compute_query_losses`. Combining a rank loss with a decomposability term (SupRank paper
Eq. 12) is :class:`~pml_suprank.losses.CombinedRankLoss`'s job (the one way to combine losses).
"""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.reducers import MeanReducer
from torch import Tensor

from ..ranking.dense import KERNELS, choose_kernel
from ..ranking.flat import PairGroups
from ._inputs import (
    PreparedForwardMixin,
    RankInputs,
    check_similarity,
    prepare_inputs,
    reference_mask,
    similarity_matrix,
)
from .compile_guard import GuardedCompileMixin

__all__ = ["BaseRankLoss"]


class BaseRankLoss(GuardedCompileMixin, PreparedForwardMixin, BaseMetricLossFunction):
    """Base class of the rank losses (Smooth-AP, SupAP, Sup-R@k, Sup-H-AP, Sup-NDCG, and their combinations).

    Call: ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None)`` like any PML loss.

    Semantics: scores are cosine / dot-product similarities (``distance`` must be a
    ``DotProductSimilarity``/``CosineSimilarity``; anything else raises ``ValueError``); the reference set is the
    batch unless ``ref_emb``/``ref_labels`` are given; when it is the batch (``ref_emb is None or ref_emb is
    embeddings``) the query is removed from its own reference set *by index* unless ``include_self=True`` (the
    reference code's convention, used by the golden vectors); an ``indices_tuple`` of pairs/triplets restricts the
    (query, reference) pairs that count; queries without a positive are dropped; if no query has one the loss is
    a zero connected to the graph. fp16/bf16 embeddings are up-cast and the loss is computed in float32.

    Extension contract (how to write a rank loss on top of this class):

    1. Implement ``compute_query_losses(self, inputs: RankInputs) -> (losses, query_idx)``. ``inputs.scores`` is
       the ``(B, N)`` differentiable score matrix, ``inputs.valid`` the ``(B, N)`` bool mask of counted pairs,
       ``inputs.labels``/``inputs.ref_labels`` the labels as given. Return the per-query losses ``(Q,)`` of the
       queries you keep (those with at least one positive / relevant item) and their row indices ``(Q,)`` long —
       or, without a host synchronisation, the losses of all ``B`` queries (finite everywhere) and a ``(B,)`` bool
       mask of the kept ones (:meth:`kept_queries`).
       They are reduced by the loss's PML reducer (``MeanReducer`` by default, i.e. the mean over kept queries).
       For ranks use :mod:`pml_suprank.ranking`: ``suprank_negative_sum`` / ``heaviside_positive_count`` /
       ``sigmoid_rank_sums`` (flat) or ``window_sum`` (any sigmoid window); they are ``O(pairs × N)`` in
       time and never save ``pairs × N`` tensors for backward.
    2. Hierarchical losses set the class attribute ``allow_2d_labels = True`` to accept ``(N, L)`` labels
       (column 0 = finest); the base validates them and passes them through unchanged.
    3. Combined losses (``(1 − λ)·rank loss + λ·decomposability loss``, SupRank Eq. 12): wrap the loss in
       :class:`~pml_suprank.losses.CombinedRankLoss` (``CombinedRankLoss(MyRankLoss(), "calibration", 0.1)``), the
       one way to combine losses. A rank loss alone returns a single ``"loss"`` entry.

    4. Kernels: the class attribute ``kernels`` lists the ``kernel=`` values a loss accepts. Every loss of the
       package has ``("auto", "dense", "sorted")`` and branches on :meth:`resolved_kernel`; a new subclass
       inherits ``("auto", "sorted")`` until it implements a dense path (``kernel="dense"`` then raises
       ``ValueError`` naming what is supported).
    5. ``loss.compile(...)`` compiles in place and checks the first call against eager (value and embedding
       gradient, :mod:`pml_suprank.losses.compile_guard`): a mismatch raises ``CompiledLossMismatchError``.

    Args:
        include_self: keep the query as its own positive when the reference set is the batch (reference code).
        kernel: ``"auto"`` (default: the per-device cost model of :func:`pml_suprank.ranking.choose_kernel`),
            ``"dense"`` (every ``(query, item, reference)`` difference in query blocks under a memory budget, no
            host synchronisation; :mod:`pml_suprank.ranking.dense`) or ``"sorted"`` (sorted thresholds and
            chunked windows over the (query, positive) pairs; :mod:`pml_suprank.ranking.flat`). Same values and
            gradients up to rounding.
        **kwargs: passed to ``BaseMetricLossFunction`` (``distance``, ``reducer``, ``embedding_regularizer``, ...).
    """

    allow_2d_labels = False
    kernels: tuple[str, ...] = ("auto", "sorted")

    def __init__(
        self,
        include_self: bool = False,
        *,
        kernel: str = "auto",
        **kwargs,
    ):
        if kernel not in self.kernels:
            raise ValueError(
                f"{type(self).__name__} supports kernel in {self.kernels}; got kernel={kernel!r}"
                + (" (this loss implements no dense kernel)" if kernel in KERNELS else "")
            )
        removed = sorted(set(kwargs) & {"decomposability", "decomposability_weight", "num_classes", "embedding_size"})
        if removed:
            raise TypeError(
                f"{type(self).__name__} got {', '.join(removed)}: a rank loss has no decomposability term of its own; "
                f"combine it with CombinedRankLoss({type(self).__name__}(), 'calibration', weight=0.1)"
            )
        if not isinstance(include_self, bool):
            raise TypeError(f"include_self must be a bool; got {type(include_self).__name__} {include_self!r}")
        super().__init__(**kwargs)
        self.kernel = kernel  # before include_self: vars(loss) keeps ending with the former hyper-parameters
        self.include_self = include_self
        check_similarity(type(self).__name__, self.distance)
        self.add_to_recordable_attributes(list_of_names=["num_kept_queries"], is_stat=True)

    def get_default_distance(self):
        return CosineSimilarity()

    # ------------------------------------------------------------------ PML entry points
    def prepare_inputs(self, embeddings, labels, ref_emb=None, ref_labels=None):
        """Validate a call and resolve the reference set: ``(embeddings, labels, ref_emb, ref_labels)``.

        fp16/bf16 embeddings are up-cast to float32; ``ref_emb is embeddings`` when the reference set is the batch;
        labels are moved to the embeddings' device. ``compute_loss``/``rank_entry`` expect inputs prepared this way.
        """
        emb, labels, ref, ref_labels, _ = prepare_inputs(
            type(self).__name__, embeddings, labels, ref_emb, ref_labels, allow_2d_labels=self.allow_2d_labels
        )
        return emb, labels, ref, ref_labels

    def rank_inputs(self, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> RankInputs:
        """Build :class:`RankInputs` (scores + validity mask) for already-prepared inputs."""
        same_source = ref_emb is embeddings
        scores = similarity_matrix(self.distance, embeddings, ref_emb)
        valid = reference_mask(
            embeddings.shape[0],
            ref_emb.shape[0],
            embeddings.device,
            same_source=same_source,
            include_self=self.include_self,
            indices_tuple=indices_tuple,
        )
        return RankInputs(scores=scores, valid=valid, labels=labels, ref_labels=ref_labels, same_source=same_source)

    def rank_entry(
        self,
        embeddings,
        labels,
        indices_tuple,
        ref_emb,
        ref_labels,
        *,
        scale: float | None = None,
        reducer=None,
        inputs: RankInputs | None = None,
    ) -> dict:
        """The PML loss-dict entry of the rank term on prepared inputs: ``scale`` × the per-query losses.

        ``scale=None`` is 1 (the rank loss alone); :class:`CombinedRankLoss` passes ``1 − λ``.
        ``reducer`` is the PML reducer that will reduce the entry (``None``: unknown). When it is PML's plain
        ``MeanReducer``, statistics are off and :meth:`compute_query_losses` returned a bool ``kept`` mask, the mean
        over the kept queries is formed here, without a host synchronisation, and returned already reduced;
        otherwise the entry is ``{"losses": (Q,), "indices": (Q,) kept query rows, "reduction_type": "element"}``
        (any reducer, :func:`~pml_suprank.losses.reference_loss`), or PML's zero loss when no query has a positive.
        Records ``num_kept_queries`` when stats are collected. ``inputs``: the :meth:`rank_inputs` of these arguments
        when the caller has already built them (a combined loss sharing its score matrix).
        """
        if scale is None:
            scale = 1.0
        if inputs is None:
            inputs = self.rank_inputs(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        losses, rows = self.compute_query_losses(inputs)
        if rows.dtype == torch.bool:
            if type(reducer) is MeanReducer and not self.collect_stats:
                mean = (losses * rows).sum() / rows.sum().clamp_min(1)
                self.num_kept_queries = 0
                mean = mean if scale == 1.0 else scale * mean
                return {"losses": mean, "indices": None, "reduction_type": "already_reduced"}
            rows = torch.nonzero(rows, as_tuple=True)[0]
            losses = losses[rows]
        self.num_kept_queries = int(len(rows)) if self.collect_stats else 0
        if len(rows) == 0:
            return self.zero_loss()
        return {"losses": scale * losses, "indices": rows, "reduction_type": "element"}

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        entry = self.rank_entry(embeddings, labels, indices_tuple, ref_emb, ref_labels, reducer=self.reducer)
        return {"loss": entry}

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        """Per-query losses ``(Q,)`` and the kept query rows ``(Q,)`` long; see the class docstring."""
        raise NotImplementedError

    def resolved_kernel(self, inputs: RankInputs, levels: int = 1) -> str:
        """``"dense"`` or ``"sorted"``: :attr:`kernel` resolved for these inputs (``"auto"``: the cost model of
        :func:`~pml_suprank.ranking.choose_kernel` by device type; ``levels``: 1 for a flat loss, the number of
        hierarchy levels for a hierarchical one)."""
        num_queries, num_refs = inputs.scores.shape
        return choose_kernel(self.kernel, inputs.scores.device, num_queries, num_refs, levels=levels)

    # ------------------------------------------------------------------ helpers for flat AP-like losses
    @staticmethod
    def segment_mean(
        values: Tensor, query_idx: Tensor, num_queries: int, groups: PairGroups | None = None
    ) -> tuple[Tensor, Tensor]:
        """Mean of ``values`` per query (pairs grouped by ``query_idx``) → ``(per_query (Q,), kept rows (Q,))``.

        With the pairs' ``groups`` (:func:`~pml_suprank.ranking.positive_pair_groups`) the kept rows come without a
        host synchronisation; without, from ``torch.nonzero``.
        """
        sums = values.new_zeros(num_queries).index_add(0, query_idx, values)
        if groups is None:
            counts = torch.zeros(num_queries, dtype=torch.long, device=values.device)
            counts = counts.index_add_(0, query_idx, torch.ones_like(query_idx))  # bincount syncs on CUDA
            kept = torch.nonzero(counts > 0, as_tuple=True)[0]
        else:
            counts, kept = groups.counts, groups.kept_rows()
        return sums[kept] / counts[kept].to(values.dtype), kept

    @staticmethod
    def kept_queries(per_query: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """``(per_query (B,), kept (B,) bool)`` with ``kept`` the rows whose positive count is > 0 (dense path).

        No host synchronisation: :meth:`rank_entry` reduces over ``kept`` arithmetically (plain ``MeanReducer``) or
        selects the rows for any other reducer. ``per_query`` must be finite on every row.
        """
        return per_query, counts > 0
