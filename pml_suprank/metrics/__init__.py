"""Exact retrieval evaluation: one engine, one metric registry.

* :mod:`.ranks`: positions of the relevant items in the pessimistic full ranking (no full-row sort).
* :mod:`.from_ranks`: every metric computed from those positions, each implemented once.
* :mod:`.registry`: one :class:`MetricSpec` per metric (key pattern, label, flags, function); the evaluator's
  groups, the accuracy calculator's methods and the reports derive from it.
* :mod:`.functional`: the same metrics from a ``(Q, N)`` score matrix; :mod:`.evaluator`: the chunked full-ranking
  evaluator (:mod:`.multilabel_eval`: its ``multilabel=True`` mode); :mod:`.graded`: metrics of a graded pairwise
  relevance; :mod:`.accuracy_calculator`: a PML ``AccuracyCalculator`` subclass; :mod:`.report`: labels and
  printed tables; :mod:`.decomposability`: the decomposability gap (SupRank Eq. 6).

Submodules are imported lazily so that ``import pml_suprank.metrics`` does not import scikit-learn/faiss
(pulled in by PML's ``AccuracyCalculator``) unless :class:`HierarchicalAccuracyCalculator` is used.
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
