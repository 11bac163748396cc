"""Exact retrieval evaluation: one engine, one metric registry.

:mod:`.ranks` positions the relevant items in the pessimistic full ranking, :mod:`.from_ranks` computes every metric
from them once, :mod:`.registry` holds one :class:`MetricSpec` per metric; :mod:`.functional` (score matrices),
:mod:`.evaluator` (chunked, :mod:`.multilabel_eval`), :mod:`.graded`, :mod:`.accuracy_calculator` (PML),
:mod:`.report` and :mod:`.decomposability` (SupRank Eq. 6) build on them. Submodules are imported lazily (no
scikit-learn/faiss unless :class:`HierarchicalAccuracyCalculator` is used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import functional, graded, landmark, multilabel_eval, report
from .evaluator import METRIC_GROUPS, RetrievalEvaluator, compute_embeddings
from .landmark import landmark_map_at_k, revisited_map
from .registry import METRICS, TOP_K_GROUPS, MetricSpec

__all__ = [
    "METRICS",
    "METRIC_GROUPS",
    "HierarchicalAccuracyCalculator",
    "MetricSpec",
    "RetrievalEvaluator",
    "RetrievalMetric",
    "compute_embeddings",
    "decomposability_gap",
    "functional",
    "graded",
    "landmark",
    "landmark_map_at_k",
    "report",
    "revisited_map",
]

_LAZY = {
    "HierarchicalAccuracyCalculator": ".accuracy_calculator",
    "decomposability_gap": ".decomposability",
    "RetrievalMetric": ".retrieval_metric",  # streaming update/compute/reset, gathered across processes
}

if TYPE_CHECKING:  # pragma: no cover
    from .accuracy_calculator import HierarchicalAccuracyCalculator
    from .decomposability import decomposability_gap
    from .retrieval_metric import RetrievalMetric


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
