"""Sup-NDCG (SupRank paper Eqs. 23-24): a smooth upper bound of 1 − NDCG with hierarchical gains, as a PML loss."""

from __future__ import annotations

from torch import Tensor

from ..ranking import dense_sup_ndcg_scores, sup_ndcg_scores
from ..relevance import Hierarchy
from ._hierarchical import HierarchicalRankLoss

__all__ = ["SupNDCGLoss"]


class SupNDCGLoss(HierarchicalRankLoss):
    """Sup-NDCG loss (Ramzi et al., SupRank TPAMI 2025, Eq. 24).

    ``L = mean_q [1 − DCG_s(q) / iDCG(q)]`` with ``DCG_s = Σ_{i: T_i > 0} (2^{T_i} − 1) / log2(1 + rank(i))`` where
    ``rank`` is the level-aware SupRank rank (``H⁻`` towards strictly less relevant items, Heaviside otherwise, as in
    :class:`~pml_suprank.losses.SupHAPLoss`) and ``iDCG`` is the DCG of the same reference set (the valid items)
    ordered by decreasing level (Eq. 23, gains ``2^l − 1``). Upper bound of ``1 − NDCG`` for the default offset.

    Args:
        hierarchy: fine → ancestors table for 1-D fine labels.
        **suprank_kwargs: ``tau`` (alias ``temperature``), ``rho``, ``delta``, ``start``, ``offset``,
            ``include_self``, ``chunk_size`` and BaseRankLoss / PML options.

    Shapes: ``embeddings (B, D)``; ``labels (B, L)`` or ``(B,)`` with ``hierarchy``; returns a scalar.
    """

    kernels = ("auto", "dense", "sorted")

    def __init__(self, hierarchy: Hierarchy | Tensor | None = None, **suprank_kwargs):
        super().__init__(hierarchy=hierarchy, **suprank_kwargs)

    def dense_query_scores(
        self, scores: Tensor, levels: Tensor, valid: Tensor, num_levels: int
    ) -> tuple[Tensor, Tensor]:
        return dense_sup_ndcg_scores(scores, levels, num_levels, valid, self.constant_step())

    def query_scores(self, scores: Tensor, levels: Tensor, valid: Tensor, num_levels: int) -> tuple[Tensor, Tensor]:
        return sup_ndcg_scores(scores, levels, num_levels, valid, step=self.step, chunk_size=self.chunk_size)
