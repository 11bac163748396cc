"""Sup-H-AP (SupRank paper Eq. 21; HAPPIER, ECCV 2022): a smooth upper bound of 1 − H-AP, as a PML loss."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from .._validation import check_bool, check_level_weights, check_positive
from ..ranking.dense_hierarchical import dense_sup_hap_scores
from ..ranking.hierarchical import sup_hap_scores
from ..ranking.steps import HRankParams
from ..relevance import Hierarchy, level_counts, pop_relevance, property1_relevance
from ._hierarchical import HierarchicalRankLoss
from ._suprank_step import STEP_OPTIONS
from .registry import HAPPIER_PAPER, register_loss

__all__ = ["SupHAPLoss"]


@register_loss(
    "Sup-H-AP", hierarchical=True, multilabel=True, paper=HAPPIER_PAPER, options=(*STEP_OPTIONS, "kernel", "alpha")
)
class SupHAPLoss(HierarchicalRankLoss):
    """Sup-H-AP loss (Ramzi et al., SupRank TPAMI 2025, Eqs. 18-21; HAPPIER ECCV 2022, Eq. 5).

    For every query ``q`` and its relevant items ``i`` (level ``T_i > 0``: levels shared with ``q`` from the top):

    * ``H-rank⁺(i) = rel_i + Σ_{j≠i} min(rel_i, rel_j) · H(s_j − s_i)`` (Eq. 18, no gradient), or with
      ``with_hrank=True`` the HAPPIER lower bound ``H_s^>`` (App. A.3, Eq. 43, ``min(ν t + μ, 1)`` for ``t > 0`` and
      ``γ t`` for ``t ≤ 0``) towards strictly more relevant items ``j``;
    * ``rank(i) = 1 + Σ_{j≠i, T_j ≥ T_i} H(s_j − s_i) + Σ_{j: T_j < T_i} H⁻(s_j − s_i)`` — the SupRank step ``H⁻``
      (Eq. 4) only towards strictly less relevant items;
    * ``L = mean_q [1 − Σ_i H-rank⁺(i) / rank(i) / Σ_j rel_j]`` (Eq. 21), over queries with a relevant item.

    Relevance (Eq. 20): ``rel(l) = (l / L)^α / |Ω^(l)|`` (``α > 1``: HAPPIER_F); ``level_weights``: Property-1
    relevance (supplementary Eq. 44, H-AP = ``Σ_l w_l AP^(l)``).
    Since ``H⁻ ≥ H`` and ``H_s^> ≤ H``, the loss is ``≥ 1 − H-AP``; with one level it equals SupAP.

    Multi-label (``relevance="multilabel"``): labels are ``(B, M)`` fine-label sets padded with ``-1`` (column 0 a
    label; ``ref_labels`` ``(N, M)`` likewise), ``rel(q, j)`` of the thesis' Algorithm 1 (HAPPIER Eqs. 2-3;
    :mod:`pml_suprank.losses._multilabel`); ``loss ≥ 1 − H-AP`` of
    :func:`pml_suprank.metrics.functional.graded_average_precision`. ``alpha`` must stay 1, ``level_weights`` unset.
    Cost: ``O(L · B · N log N)`` plus the sigmoid-window pairs, ``O(L · B · N)`` extra memory; never ``B × N × N``.

    Args:
        hierarchy: fine → ancestors table (needed with 1-D fine labels).
        alpha: ``α ≥ 0`` of Eq. 20.
        with_hrank: use ``H_s^>`` in H-rank⁺ (off in every reference config).
        hrank_nu, hrank_mu, hrank_gamma: ``ν > 0``, ``μ ∈ [0, 1]``, ``γ ≥ 0`` of ``H_s^>`` (paper: 25, 0.5, 10).
        relevance: ``"levels"`` (default: Eq. 20 or Property 1) or ``"multilabel"`` (thesis Algorithm 1).
        level_weights: optional ``L`` finite, non-negative, not all zero weights ``w_1..w_L`` (``w_L`` = finest)
            selecting the Property-1 relevance (ΣwAP) instead of Eq. 20 (``alpha`` unused); ``ValueError`` otherwise.
        **suprank_kwargs: ``tau`` (alias ``temperature``), ``rho``, ``delta``, ``start``, ``offset``,
            ``include_self``, ``chunk_size``, ``kernel`` and PML options (``distance``, ``reducer``, ...).

    Shapes: ``embeddings (B, D)``; ``labels (B, L)`` or ``(B,)`` fine labels with ``hierarchy``; optional
    ``ref_emb (N, D)``, ``ref_labels`` like ``labels``; returns a scalar.
    """

    def __init__(
        self,
        hierarchy: Hierarchy | Tensor | None = None,
        alpha: float = 1.0,
        with_hrank: bool = False,
        hrank_nu: float = 25.0,
        hrank_mu: float = 0.5,
        hrank_gamma: float = 10.0,
        level_weights: Sequence[float] | Tensor | None = None,
        relevance: str = "levels",
        **suprank_kwargs,
    ):
        super().__init__(hierarchy=hierarchy, relevance=relevance, **suprank_kwargs)
        self.alpha = check_positive("alpha", alpha, strict=False)
        self.with_hrank = check_bool("with_hrank", with_hrank)
        self.hrank = HRankParams(nu=hrank_nu, mu=hrank_mu, gamma=hrank_gamma)
        num_levels = None if self.hierarchy is None else self.hierarchy.num_levels
        self.level_weights = check_level_weights("level_weights", level_weights, num_levels)
        if relevance == "multilabel" and (self.alpha != 1.0 or self.level_weights is not None):
            raise ValueError(
                "relevance='multilabel' takes its relevance from the label sets: alpha must be 1 and level_weights "
                f"None; got alpha={alpha!r}, level_weights={level_weights!r}"
            )
        self.add_to_recordable_attributes(list_of_names=["alpha"], is_stat=False)

    def level_relevance(self, levels: Tensor, valid: Tensor, num_levels: int, dtype) -> Tensor:
        """``(B, L + 1)`` relevance of each level for each query, counted over the valid reference items."""
        counts = level_counts(levels, num_levels, mask=valid)
        if self.level_weights is not None:
            if len(self.level_weights) != num_levels:
                raise ValueError(
                    f"level_weights has {len(self.level_weights)} entries but the labels have {num_levels} levels"
                )
            return property1_relevance(counts, self.level_weights, dtype=dtype)
        return pop_relevance(counts, self.alpha, dtype=dtype)

    def query_scores(self, scores, levels, valid, num_levels, rel, dense) -> tuple[Tensor, Tensor]:
        if rel is None:
            rel = self.level_relevance(levels, valid, num_levels, scores.dtype)
        hrank = self.hrank if self.with_hrank else None
        step, rel = self.constant_step(), rel.to(scores.dtype)
        if dense:
            return dense_sup_hap_scores(scores, levels, rel, valid, step, hrank)
        return sup_hap_scores(scores, levels, rel, num_levels, valid, step, hrank, self.chunk_size)
