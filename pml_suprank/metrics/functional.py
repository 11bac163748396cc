"""Exact per-query retrieval metrics from a ``(Q, N)`` score matrix and the engine's public names.

Each score-matrix function is ``*_from_ranks(retrieval_ranks(scores, levels, mask))``: the one implementation in
:mod:`pml_suprank.metrics.from_ranks`, which the evaluator calls through :mod:`pml_suprank.metrics.registry`.

Conventions (those of :mod:`pml_suprank.metrics.ranks`): ``scores`` ``(Q, N)`` (higher = closer); ``levels``
``(Q, N)`` in ``{0..L}`` (``L`` = same fine class, :func:`pml_suprank.relevance.level_matrix`; bool = binary);
``mask`` ``(Q, N)`` bool, ``False`` removes an item; **ties are pessimistic** (less relevant first among equal
scores); binary metrics' positives are the items at level ``>= min_level`` (default ``L``); queries without a
positive get ``NaN`` (excluded from means).

References:
    Ramzi et al., "Optimization of Rank Losses for Image Retrieval" (SupRank, TPAMI 2025): H-AP Eqs. 18-20, NDCG
    Eq. 23, ASI App. C-A1, ΣwAP supplementary Sec. B-B3 (Property 1).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

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
from .graded import graded_average_precision, graded_ndcg
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
    "graded_average_precision",
    "graded_ndcg",
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


_P = inspect.Parameter
_BINARY = "\n\nPositives are the items at level ``>= min_level`` (default ``L``); NaN for queries without positives."


def _on_scores(name: str, from_ranks: Callable[..., Tensor], doc: str, k: bool = False, **options: object):
    """Generate ``name(scores, levels[, k], mask=None, *, num_levels=None, **options) -> (Q,)`` =
    ``from_ranks(retrieval_ranks(...)[, k], **options)``, with :data:`_BINARY` appended for binary metrics."""
    tensor = [_P(n, _P.POSITIONAL_OR_KEYWORD, annotation=Tensor) for n in ("scores", "levels")]
    cutoff = [_P("k", _P.POSITIONAL_OR_KEYWORD, annotation=int)] * k
    mask = [_P("mask", _P.POSITIONAL_OR_KEYWORD, default=None, annotation="Tensor | None")]
    keywords = [_P(n, _P.KEYWORD_ONLY, default=d) for n, d in {"num_levels": None, **options}.items()]
    signature = inspect.Signature(tensor + cutoff + mask + keywords, return_annotation=Tensor)

    def metric(*args, **kwargs) -> Tensor:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        ranks = retrieval_ranks(a.pop("scores"), a.pop("levels"), a.pop("mask"), num_levels=a.pop("num_levels"))
        return from_ranks(ranks, **a)

    metric.__name__ = metric.__qualname__ = name
    metric.__module__, metric.__signature__ = __name__, signature
    metric.__doc__ = doc + _BINARY if "min_level" in options else doc
    return metric


# fmt: off
average_precision = _on_scores("average_precision", ap_from_ranks, "Average precision per query ``(Q,)``: "
                               "``AP = (1/|Ω⁺|) Σ_{k∈Ω⁺} rank⁺(k) / rank(k)`` in the pessimistic order.",
                               min_level=None)
map_at_r = _on_scores("map_at_r", map_at_r_from_ranks, "mAP@R per query ``(Q,)`` (Musgrave et al.: A Metric Learning "
                      "Reality Check).", min_level=None)
map_at_k = _on_scores("map_at_k", map_at_k_from_ranks, "mAP@k per query ``(Q,)``: the precisions at the positives "
                      "within the top ``k``, over ``min(R, k)``.", k=True, min_level=None)
recall_at_k = _on_scores("recall_at_k", recall_at_k_from_ranks, "R@k per query ``(Q,)``: 1.0 if a positive is in the "
                         "top ``k`` (the retrieval recall, or hit rate).", k=True, min_level=None)
true_recall_at_k = _on_scores("true_recall_at_k", true_recall_at_k_from_ranks, "True recall@k per query ``(Q,)``: "
                              "positives in the top ``k`` / ``min(#positives, k)``.", k=True, min_level=None)
precision_at_k = _on_scores("precision_at_k", precision_at_k_from_ranks, "P@k per query ``(Q,)``: positives in the "
                            "top ``k`` / ``k``.", k=True, min_level=None)
r_precision = _on_scores("r_precision", r_precision_from_ranks, "R-precision per query ``(Q,)``.", min_level=None)
hierarchical_average_precision = _on_scores(
    "hierarchical_average_precision", hap_from_ranks, "H-AP per query ``(Q,)`` (SupRank Eq. 19); see "
    ":func:`hap_from_ranks` for ``relevance`` / ``alpha``.\n\nThe default relevance counts ``|Ω^(l)|`` over the items "
    "kept by ``mask``; pass an explicit ``(Q, L + 1)`` table to use another convention (e.g. the reference code's "
    "counts, which include the query itself).", relevance=None, alpha=1.0)
ndcg = _on_scores("ndcg", ndcg_from_ranks, "NDCG per query ``(Q,)`` (SupRank Eq. 23, gains ``2^l − 1``, ideal DCG from "
                  "the same gallery).")
asi = _on_scores("asi", asi_from_ranks, "Average Set Intersection per query ``(Q,)`` (SupRank App. C-A1).")
weighted_sum_ap = _on_scores("weighted_sum_ap", weighted_sum_ap_from_ranks, "ΣwAP per query ``(Q,)``; see "
                             ":func:`weighted_sum_ap_from_ranks`.", weights=None)
# fmt: on
