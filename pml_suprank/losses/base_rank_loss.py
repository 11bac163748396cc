"""``BaseRankLoss``: the PML ``BaseMetricLossFunction`` subclass shared by every rank loss of the package (scores,
counted pairs, mixed precision, kept queries, reducers); subclasses implement
:meth:`BaseRankLoss.compute_query_losses`."""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.reducers import MeanReducer
from torch import Tensor

from .._validation import check_bool
from ..ranking.dense import KERNELS, choose_kernel
from ..ranking.flat import PairGroups
from ._inputs import PreparedForwardMixin, RankInputs, check_similarity, scores_and_mask
from .compile_guard import GuardedCompileMixin

__all__ = ["BaseRankLoss"]


class BaseRankLoss(GuardedCompileMixin, PreparedForwardMixin, BaseMetricLossFunction):
    """Base class of the rank losses (Smooth-AP, SupAP, Sup-R@k, Sup-H-AP, Sup-NDCG, and their combinations).

    Call: ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None)`` like any PML loss.

    Semantics as in :mod:`pml_suprank.losses._inputs` (another ``distance`` than cosine / dot product raises
    ``ValueError``); queries without a positive are dropped (none: a zero connected to the graph); float32.

    Extension contract:

    1. Implement ``compute_query_losses(self, inputs: RankInputs) -> (losses, query_idx)``: the per-query losses
       ``(Q,)`` of the kept queries (with a positive) and their rows ``(Q,)`` long, or, without host
       synchronisation, all ``B`` (finite) losses and a ``(B,)`` bool kept mask (:meth:`kept_queries`); the PML
       reducer reduces them. Ranks: :mod:`pml_suprank.ranking`.
    2. Hierarchical losses set ``allow_2d_labels = True`` to accept ``(N, L)`` labels (column 0 = finest).
    3. Combine with a decomposability term (SupRank Eq. 12) through :class:`~pml_suprank.losses.CombinedRankLoss`.
    4. ``kernels`` lists the accepted ``kernel=`` values; a subclass without a dense path keeps
       ``("auto", "sorted")`` and branches on :meth:`resolved_kernel`.
    5. ``loss.compile(...)`` checks the compiled call against eager (:mod:`pml_suprank.losses.compile_guard`).

    Args:
        include_self: keep the query as its own positive when the reference set is the batch (reference code).
        kernel: ``"auto"`` (the cost model of :func:`pml_suprank.ranking.choose_kernel`), ``"dense"``
            (:mod:`pml_suprank.ranking.dense`, no host synchronisation) or ``"sorted"``
            (:mod:`pml_suprank.ranking.flat`); same values and gradients up to rounding.
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
        check_bool("include_self", include_self)
        super().__init__(**kwargs)
        self.kernel = kernel  # before include_self: vars(loss) keeps ending with the former hyper-parameters
        self.include_self = include_self
        check_similarity(type(self).__name__, self.distance)
        self.add_to_recordable_attributes(list_of_names=["num_kept_queries"], is_stat=True)

    def get_default_distance(self):
        return CosineSimilarity()

    def rank_inputs(self, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> RankInputs:
        """Build :class:`RankInputs` (scores + validity mask) for already-prepared inputs."""
        scores, valid = scores_and_mask(self.distance, embeddings, ref_emb, self.include_self, indices_tuple)
        return RankInputs(scores, valid, labels, ref_labels, same_source=ref_emb is embeddings)

    def rank_entry(
        self,
        embeddings,
        labels,
        indices_tuple,
        ref_emb,
        ref_labels,
        *,
        scale: float = 1.0,
        reducer=None,
        inputs: RankInputs | None = None,
    ) -> dict:
        """The PML loss-dict entry of the rank term on prepared inputs: ``scale`` (``1 − λ`` in
        :class:`CombinedRankLoss`) × the per-query losses.

        Already reduced under PML's plain ``MeanReducer`` (stats off, bool kept mask); otherwise ``{"losses": (Q,),
        "indices": (Q,), "reduction_type": "element"}``, or PML's zero loss when no query has a positive.
        ``inputs``: prebuilt :meth:`rank_inputs` (a combined loss sharing its score matrix).
        """
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
        """``"dense"`` or ``"sorted"``: :attr:`kernel` resolved for these inputs by
        :func:`~pml_suprank.ranking.choose_kernel` (``levels``: 1 for a flat loss, else the hierarchy's)."""
        num_queries, num_refs = inputs.scores.shape
        return choose_kernel(self.kernel, inputs.scores.device, num_queries, num_refs, levels=levels)

    @staticmethod
    def segment_mean(
        values: Tensor, query_idx: Tensor, num_queries: int, groups: PairGroups | None = None
    ) -> tuple[Tensor, Tensor]:
        """Mean of ``values`` per query (pairs grouped by ``query_idx``) → ``(per_query (Q,), kept rows (Q,))``;
        ``groups`` (:func:`~pml_suprank.ranking.positive_pair_groups`) give the kept rows without host sync."""
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
        """``(per_query (B,), kept (B,) bool)`` with ``kept`` the rows whose positive count is > 0 (dense path, no
        host synchronisation; ``per_query`` must be finite on every row)."""
        return per_query, counts > 0
