"""A PML ``AccuracyCalculator`` that adds the exact hierarchical metrics and accepts 2-D labels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from .._validation import check_labels
from ..relevance import Hierarchy, as_hierarchical_labels, as_hierarchy
from .evaluator import RetrievalEvaluator

__all__ = ["HierarchicalAccuracyCalculator"]

#: metric names added to PML's (same names as the RetrievalEvaluator groups); the per-level and top-k groups
#: expand into several keys (``ap_level0``, ``recall_at_10``, ...)
_ADDED = (
    "ap",
    "map_at_r",
    "h_ap",
    "ndcg",
    "asi",
    "sum_w_ap",
    "ap_level",
    "map_at_r_level",
    "recall_at_k",
)


class HierarchicalAccuracyCalculator(AccuracyCalculator):
    """PML 2.x ``AccuracyCalculator`` plus exact full-ranking metrics (:class:`RetrievalEvaluator`).

    Same call as PML: ``get_accuracy(query, query_labels, reference=None, reference_labels=None,
    ref_includes_query=False, include=(), exclude=())``, so PML testers and hooks can use it. Labels may be 1-D, 2-D
    ``(N, L)`` (column 0 finest) or 1-D fine labels expanded through ``hierarchy``.

    * PML's own metrics (``precision_at_1``, ``mean_average_precision_at_r``, ``r_precision``, ``NMI``, ...) are
      computed by PML on the **fine** labels, which are first re-indexed to ``0..K-1`` so that PML's float32 label
      cast cannot merge large label values.
    * Added metrics (exact, whole gallery, pessimistic ties, queries without positives excluded):
      ``"ap"``, ``"map_at_r"``, ``"h_ap"``, ``"ndcg"``, ``"asi"``, ``"sum_w_ap"``, ``"ap_level"`` (→ ``"ap_level{h}"``),
      ``"map_at_r_level"`` (→ ``"map_at_r_level{h}"``), ``"recall_at_k"`` (→ ``"recall_at_{k}"``).

    Args:
        include, exclude: metric names, PML's and the added ones.
        k_values: ``k`` of ``recall_at_k``.
        alpha: H-AP relevance exponent.
        level_weights: ΣwAP weights.
        hierarchy: fine -> ancestors table for 1-D labels.
        chunk_size: queries per chunk of the exact evaluation.
        **kwargs: forwarded to PML's ``AccuracyCalculator`` (``k``, ``avg_of_avgs``, ``knn_func``, ``device``, ...).
    """

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        *,
        k_values: Sequence[int] = (1, 10, 100),
        alpha: float = 1.0,
        level_weights: Sequence[float] | None = None,
        hierarchy: Hierarchy | torch.Tensor | None = None,
        chunk_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        self._cache: dict[str, Any] = {}
        super().__init__(include=include, exclude=exclude, **kwargs)
        self.hierarchy = as_hierarchy(hierarchy)
        self._evaluator_kwargs = dict(
            k_values=tuple(k_values), alpha=alpha, chunk_size=chunk_size, level_weights=level_weights
        )
        RetrievalEvaluator(**self._evaluator_kwargs)  # validate now

    # PML discovers metrics through ``calculate_<name>``; the values are computed once in ``get_accuracy``
    def calculate_ap(self, **kwargs: Any) -> float:
        return self._cache["ap"]

    def calculate_map_at_r(self, **kwargs: Any) -> float:
        return self._cache["map_at_r"]

    def calculate_h_ap(self, **kwargs: Any) -> float:
        return self._cache["h_ap"]

    def calculate_ndcg(self, **kwargs: Any) -> float:
        return self._cache["ndcg"]

    def calculate_asi(self, **kwargs: Any) -> float:
        return self._cache["asi"]

    def calculate_sum_w_ap(self, **kwargs: Any) -> float:
        return self._cache["sum_w_ap"]

    def calculate_ap_level(self, **kwargs: Any) -> dict[str, float]:
        return {k: v for k, v in self._cache.items() if k.startswith("ap_level")}

    def calculate_map_at_r_level(self, **kwargs: Any) -> dict[str, float]:
        return {k: v for k, v in self._cache.items() if k.startswith("map_at_r_level")}

    def calculate_recall_at_k(self, **kwargs: Any) -> dict[str, float]:
        return {f"recall_at_{k}": self._cache[f"recall_at_{k}"] for k in self._evaluator_kwargs["k_values"]}

    def get_accuracy(
        self,
        query: Any,
        query_labels: Any,
        reference: Any = None,
        reference_labels: Any = None,
        ref_includes_query: bool = False,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
    ) -> dict[str, Any]:
        """PML's ``get_accuracy`` with hierarchical labels and the added exact metrics (flattened into the dict)."""
        self.check_primary_metrics(include, exclude)
        query = c_f.numpy_to_torch(query)
        query_labels = c_f.numpy_to_torch(query_labels)
        if reference is None:
            reference, reference_labels, ref_includes_query = query, query_labels, True
        else:
            reference = c_f.numpy_to_torch(reference)
            reference_labels = c_f.numpy_to_torch(reference_labels)
        if len(query) != len(query_labels) or len(reference) != len(reference_labels):
            raise ValueError("embeddings and labels must have the same length")
        query_labels = check_labels("query_labels", query_labels, len(query), n_name="query")
        reference_labels = check_labels("reference_labels", reference_labels, len(reference), n_name="reference")
        ql = as_hierarchical_labels(query_labels, self.hierarchy, name="query_labels")
        rl = as_hierarchical_labels(reference_labels, self.hierarchy, name="reference_labels")
        if ql.shape[1] != rl.shape[1]:
            raise ValueError(
                f"query_labels and reference_labels must have the same number of levels; got {ql.shape[1]} "
                f"and {rl.shape[1]}"
            )
        wanted = list(self.get_function_dict(include, exclude))
        ours = [m for m in wanted if m in _ADDED]
        theirs = [m for m in wanted if m not in _ADDED]
        result: dict[str, Any] = {}
        if theirs:
            Q = len(query)
            _, fine = torch.unique(torch.cat([ql[:, 0], rl[:, 0].to(ql.device)]), return_inverse=True)
            result.update(
                super().get_accuracy(
                    query,
                    fine[:Q],
                    reference,
                    fine[Q:],
                    ref_includes_query,
                    include=tuple(theirs),
                )
            )
        if ours:
            evaluator = RetrievalEvaluator(metrics=ours, device=self.device, **self._evaluator_kwargs)
            same = reference is query
            self._cache = evaluator.evaluate(
                query.float(),
                ql,
                None if same else reference.float(),
                None if same else rl,
                ref_includes_query=ref_includes_query and not same,
            )
            for name in ours:
                value = getattr(self, f"calculate_{name}")()
                if isinstance(value, dict):
                    result.update(value)
                else:
                    result[name] = value
            for key, value in self._cache.items():
                if key.startswith("num_queries"):
                    result[key] = value
            self._cache = {}
        return result
