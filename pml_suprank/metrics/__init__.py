"""Exact retrieval evaluation: functional per-query metrics, a chunked full-ranking evaluator, a PML
``AccuracyCalculator`` subclass with the hierarchical metrics, and the decomposability gap (SupRank Eq. 6).

Submodules are imported lazily so that ``import pml_suprank.metrics`` does not import scikit-learn/faiss
(pulled in by PML's ``AccuracyCalculator``) unless :class:`HierarchicalAccuracyCalculator` is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import functional
from .evaluator import METRIC_GROUPS, RetrievalEvaluator, compute_embeddings

__all__ = [
    "METRIC_GROUPS",
    "HierarchicalAccuracyCalculator",
    "RetrievalEvaluator",
    "compute_embeddings",
    "decomposability_gap",
    "functional",
]

_LAZY = {
    "HierarchicalAccuracyCalculator": ".accuracy_calculator",
    "decomposability_gap": ".decomposability",
}

if TYPE_CHECKING:  # pragma: no cover
    from .accuracy_calculator import HierarchicalAccuracyCalculator
    from .decomposability import decomposability_gap


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
