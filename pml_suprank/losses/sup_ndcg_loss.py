"""Sup-NDCG (SupRank paper Eqs. 23-24): a smooth upper bound of 1 − NDCG with hierarchical gains, as a PML loss."""

from __future__ import annotations

import torch
from torch import Tensor

from ..ranking.dense_hierarchical import dense_hierarchical_query_ranks, dense_sup_ndcg_scores
from ..ranking.hierarchical import hierarchical_ranks, sup_ndcg_scores
from ..relevance import Hierarchy
from ._hierarchical import HierarchicalRankLoss
from ._multilabel import graded_dcg_scores
from ._suprank_step import STEP_OPTIONS
from .registry import SUPRANK_PAPER, register_loss

__all__ = ["SupNDCGLoss"]


@register_loss("Sup-NDCG", hierarchical=True, multilabel=True, paper=SUPRANK_PAPER, options=(*STEP_OPTIONS, "kernel"))
class SupNDCGLoss(HierarchicalRankLoss):
    """Sup-NDCG loss (Ramzi et al., SupRank TPAMI 2025, Eq. 24).

    ``L = mean_q [1 − DCG_s(q) / iDCG(q)]`` with ``DCG_s = Σ_{i: T_i > 0} (2^{T_i} − 1) / log2(1 + rank(i))`` where
    ``rank`` is the level-aware SupRank rank (``H⁻`` towards strictly less relevant items, Heaviside otherwise, as in
    :class:`~pml_suprank.losses.SupHAPLoss`) and ``iDCG`` is the DCG of the same reference set (the valid items)
    ordered by decreasing level (Eq. 23, gains ``2^l − 1``). Upper bound of ``1 − NDCG`` for the default offset.

    Multi-label (``relevance="multilabel"``): ``(B, M)`` fine-label sets padded with ``-1`` (column 0 a label;
    ``ref_labels`` ``(N, M)`` likewise); gains ``2^{rel(q, j)} − 1`` with ``rel`` of the thesis' Algorithm 1, as
    :func:`pml_suprank.metrics.graded.graded_ndcg` (upper bound of ``1 −`` that NDCG); with one label per item and
    ``L`` levels the gains are ``2^{T/L} − 1``.

    Args:
        hierarchy: fine → ancestors table for 1-D fine labels (and for the multi-label relevance).
        relevance: ``"levels"`` (default) or ``"multilabel"`` (``(B, M)`` padded label sets, thesis Algorithm 1).
        **suprank_kwargs: ``tau`` (alias ``temperature``), ``rho``, ``delta``, ``start``, ``offset``,
            ``include_self``, ``chunk_size`` and BaseRankLoss / PML options.

    Shapes: ``embeddings (B, D)``; ``labels (B, L)`` or ``(B,)`` with ``hierarchy`` (``(B, M)`` label sets with
    ``relevance="multilabel"``); returns a scalar.
    """

    def __init__(self, hierarchy: Hierarchy | Tensor | None = None, relevance: str = "levels", **suprank_kwargs):
        super().__init__(hierarchy=hierarchy, relevance=relevance, **suprank_kwargs)

    def query_scores(self, scores, levels, valid, num_levels, rel, dense) -> tuple[Tensor, Tensor]:
        step = self.constant_step()
        if rel is None:
            if dense:
                return dense_sup_ndcg_scores(scores, levels, num_levels, valid, step)
            return sup_ndcg_scores(scores, levels, num_levels, valid, step=step, chunk_size=self.chunk_size)
        if num_levels == 0:  # no query has a relevant item
            return scores.new_zeros(0), torch.zeros(0, dtype=torch.long, device=scores.device)
        gains = torch.pow(2.0, rel) - 1.0  # graded_ndcg's exponential gain of each level's relevance
        if dense:
            rank, _ = dense_hierarchical_query_ranks(scores, levels, None, valid, step)
        else:
            rank, _ = hierarchical_ranks(scores, levels, None, num_levels, valid, step, None, self.chunk_size)
        return graded_dcg_scores(rank, levels, gains, valid)
