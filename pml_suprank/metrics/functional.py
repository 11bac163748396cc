"""Exact per-query retrieval metrics from a ``(Q, N)`` score matrix and the engine's public names.

Each score-matrix function is ``*_from_ranks(retrieval_ranks(scores, levels, mask))``: the one implementation in
:mod:`pml_suprank.metrics.from_ranks`, which the evaluator calls through :mod:`pml_suprank.metrics.registry`.

Shapes, pessimistic ties, ``min_level``, ``NaN`` and references: see :mod:`pml_suprank.metrics.ranks` and
:mod:`pml_suprank.metrics.from_ranks` (``levels`` from :func:`pml_suprank.relevance.level_matrix`).
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


def _on_scores(name: str, from_ranks: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``name(scores, levels[, k], mask=None, *, num_levels=None, **options) -> (Q,)`` =
    ``from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels)[, k], **options)``."""
    options = list(inspect.signature(from_ranks).parameters.values())[1:]
    cutoff = [p for p in options if p.name == "k"]
    keywords = [p.replace(kind=_P.KEYWORD_ONLY) for p in options if p.name != "k"]
    signature = inspect.Signature(
        [_P(n, _P.POSITIONAL_OR_KEYWORD, annotation=Tensor) for n in ("scores", "levels")]
        + cutoff
        + [_P("mask", _P.POSITIONAL_OR_KEYWORD, default=None, annotation="Tensor | None")]
        + [_P("num_levels", _P.KEYWORD_ONLY, default=None, annotation="int | None")]
        + keywords,
        return_annotation=Tensor,
    )

    def metric(*args, **kwargs) -> Tensor:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        ranks = retrieval_ranks(a.pop("scores"), a.pop("levels"), a.pop("mask"), num_levels=a.pop("num_levels"))
        return from_ranks(ranks, **a)

    metric.__name__ = metric.__qualname__ = name
    metric.__module__, metric.__signature__ = __name__, signature
    metric.__doc__ = f"{from_ranks.__doc__}\n\nFrom scores: ``{from_ranks.__name__}(retrieval_ranks(...))``."
    return metric


average_precision = _on_scores("average_precision", ap_from_ranks)
map_at_r = _on_scores("map_at_r", map_at_r_from_ranks)
map_at_k = _on_scores("map_at_k", map_at_k_from_ranks)
recall_at_k = _on_scores("recall_at_k", recall_at_k_from_ranks)
true_recall_at_k = _on_scores("true_recall_at_k", true_recall_at_k_from_ranks)
precision_at_k = _on_scores("precision_at_k", precision_at_k_from_ranks)
r_precision = _on_scores("r_precision", r_precision_from_ranks)
hierarchical_average_precision = _on_scores("hierarchical_average_precision", hap_from_ranks)
ndcg = _on_scores("ndcg", ndcg_from_ranks)
asi = _on_scores("asi", asi_from_ranks)
weighted_sum_ap = _on_scores("weighted_sum_ap", weighted_sum_ap_from_ranks)
