"""Exact per-query retrieval metrics from a ``(Q, N)`` score matrix (thin wrappers) and the engine's public names.

Each function here computes :func:`~pml_suprank.metrics.ranks.retrieval_ranks` (positions of the relevant items in
the pessimistic full ranking, without sorting whole rows) and then the one implementation of the metric in
:mod:`pml_suprank.metrics.from_ranks`; the evaluator calls the same implementations through the metric registry
(:mod:`pml_suprank.metrics.registry`).

Conventions:
    * ``scores`` ``(Q, N)``: similarity of every gallery item to every query (higher = closer).
    * ``levels`` ``(Q, N)``: level of every gallery item for every query, in ``{0, ..., L}``; ``L`` = same fine
      class, ``0`` = negative (see :func:`pml_suprank.relevance.level_matrix`). A bool tensor is a binary
      (one-level) relevance.
    * ``mask`` ``(Q, N)`` bool, optional: ``False`` removes an item from the gallery of that query.
    * **Ties are resolved pessimistically**: among items with exactly equal scores the less relevant ones are ranked
      first, so no result depends on the input order and tied items of equal relevance never penalise each other.
    * Binary metrics take ``min_level``: positives are the items at level ``>= min_level`` (default ``L``).
    * Queries without any positive get ``NaN`` (they are excluded from means, never scored 0).

References:
    Ramzi et al., "Optimization of Rank Losses for Image Retrieval" (SupRank, TPAMI 2025): H-AP Eqs. 18-20, NDCG
    Eq. 23, ASI App. C-A1, ΣwAP supplementary Sec. B-B3 (Property 1).
"""

from __future__ import annotations

from torch import Tensor

from .from_ranks import (
    RankStats,
    ap_from_ranks,
    asi_from_ranks,
    hap_from_ranks,
    map_at_k_from_ranks,
    map_at_r_from_ranks,
    ndcg_from_ranks,
    precision_at_k_from_ranks,
    property1_hap,
    r_precision_from_ranks,
    recall_at_k_from_ranks,
    true_recall_at_k_from_ranks,
    weighted_sum_ap_from_ranks,
)
from .ranks import COUNTING_METHODS, RetrievalRanks, rank_relevant_items, retrieval_ranks
from .registry import metrics_from_ranks

__all__ = [
    "COUNTING_METHODS",
    "RankStats",
    "RetrievalRanks",
    "ap_from_ranks",
    "asi",
    "asi_from_ranks",
    "average_precision",
    "hap_from_ranks",
    "hierarchical_average_precision",
    "map_at_k",
    "map_at_k_from_ranks",
    "map_at_r",
    "map_at_r_from_ranks",
    "metrics_from_ranks",
    "ndcg",
    "ndcg_from_ranks",
    "precision_at_k",
    "precision_at_k_from_ranks",
    "property1_hap",
    "r_precision",
    "r_precision_from_ranks",
    "rank_relevant_items",
    "recall_at_k",
    "recall_at_k_from_ranks",
    "retrieval_ranks",
    "true_recall_at_k",
    "true_recall_at_k_from_ranks",
    "weighted_sum_ap",
    "weighted_sum_ap_from_ranks",
]


def average_precision(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """Average precision per query ``(Q,)``; positives are the items at level ``>= min_level`` (default ``L``).

    ``AP = (1/|Ω⁺|) Σ_{k∈Ω⁺} rank⁺(k) / rank(k)`` in the pessimistic order; NaN for queries without positives.
    """
    return ap_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), min_level)


def map_at_r(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """mAP@R per query ``(Q,)`` (Musgrave et al., "A Metric Learning Reality Check"); NaN without positives."""
    return map_at_r_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), min_level)


def map_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """mAP@k per query ``(Q,)`` (sum of precisions at the positives within the top ``k``, over ``min(R, k)``)."""
    return map_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def recall_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """R@k per query ``(Q,)``: 1.0 if a positive is in the top ``k`` (the retrieval "recall" / hit rate)."""
    return recall_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def true_recall_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """True recall@k per query ``(Q,)``: positives in the top ``k`` / ``min(#positives, k)``."""
    return true_recall_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def precision_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """P@k per query ``(Q,)``: positives in the top ``k`` / ``k``."""
    return precision_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def r_precision(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """R-precision per query ``(Q,)``."""
    return r_precision_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), min_level)


def hierarchical_average_precision(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    relevance: Tensor | None = None,
    alpha: float = 1.0,
) -> Tensor:
    """H-AP per query ``(Q,)`` (SupRank Eq. 19); see :func:`hap_from_ranks` for ``relevance`` / ``alpha``.

    The default relevance counts ``|Ω^(l)|`` over the items kept by ``mask``; pass an explicit ``(Q, L + 1)`` table to
    use another convention (e.g. the reference code's counts, which include the query itself).
    """
    ranks = retrieval_ranks(scores, levels, mask, num_levels=num_levels)
    return hap_from_ranks(ranks, relevance=relevance, alpha=alpha)


def ndcg(scores: Tensor, levels: Tensor, mask: Tensor | None = None, *, num_levels: int | None = None) -> Tensor:
    """NDCG per query ``(Q,)`` (SupRank Eq. 23, gains ``2^l − 1``, ideal DCG from the same gallery)."""
    return ndcg_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels))


def asi(scores: Tensor, levels: Tensor, mask: Tensor | None = None, *, num_levels: int | None = None) -> Tensor:
    """Average Set Intersection per query ``(Q,)`` (SupRank App. C-A1)."""
    return asi_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels))


def weighted_sum_ap(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    weights: Tensor | list[float] | None = None,
) -> Tensor:
    """ΣwAP per query ``(Q,)``; see :func:`weighted_sum_ap_from_ranks`."""
    return weighted_sum_ap_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), weights)
