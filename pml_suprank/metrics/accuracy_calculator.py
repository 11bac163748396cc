"""A PML ``AccuracyCalculator`` that adds the registry's exact metrics and accepts 2-D (hierarchical) labels."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import EQUALITY, AccuracyCalculator

from .._validation import check_bool, check_device, check_embeddings, check_labels
from ..relevance import Hierarchy, as_hierarchy, hierarchical_label_pair
from .evaluator import RetrievalEvaluator
from .multilabel_eval import multilabel_groups
from .registry import METRICS, MULTILABEL_GROUPS, MetricSpec

__all__ = ["HierarchicalAccuracyCalculator"]

#: the registry's metric groups added to PML's (a group PML already defines, e.g. ``precision_at_1``, stays PML's)
_ADDED = tuple(name for name in METRICS if not hasattr(AccuracyCalculator, f"calculate_{name}"))


class HierarchicalAccuracyCalculator(AccuracyCalculator):
    """PML 2.x ``AccuracyCalculator`` plus exact full-ranking metrics (:class:`RetrievalEvaluator`).

    Same ``get_accuracy`` call as PML, so PML testers and hooks can use it. Labels may be 1-D, 2-D ``(N, L)``
    (column 0 finest) or 1-D fine labels expanded through ``hierarchy``.

    * PML's own metrics (``precision_at_1``, ``mean_average_precision_at_r``, ``NMI``, ...) are computed by PML on
      the **fine** labels, re-indexed to ``0..K-1``.
    * Added: every registry group (:data:`pml_suprank.metrics.registry.METRICS`) PML does not define, computed
      exactly by :class:`RetrievalEvaluator` (pessimistic ties): ``"ap"``, ``"h_ap"``, ``"ndcg"``, ``"asi"``, top-k
      groups (``"recall_at_k"`` → ``"recall_at_{k}"``), per-level groups (``"ap_level"`` → ``"ap_level{h}"``), ...
    * **One name per number.** A key of ours equal to one PML computes in the same call (``map_at_r`` =
      ``mean_average_precision_at_r``, ``recall_at_1`` = ``precision_at_1``) is left out unless its group is in
      ``include``; a key spelled like PML's always keeps PML's value.

    Float labels must hold integer values (else ``ValueError``). With a custom ``label_comparison_fn`` the added
    metrics are skipped with a ``UserWarning``. Every function of :meth:`get_function_dict` can be called the way
    PML calls it (``fn(**kwargs)``).

    Args:
        include, exclude: metric names, PML's and the added ones.
        k_values, alpha, level_weights, hierarchy, chunk_size: as in :class:`RetrievalEvaluator`.
        multilabel: labels are ``(N, M)`` fine-label sets padded with ``-1``; only the registry's multi-label groups
            are computed (PML's own metrics named in ``include`` raise ``ValueError``).
        avg_of_avgs, return_per_class, k, label_comparison_fn, device, knn_func, kmeans_func: PML's, in its order.
        **kwargs: forwarded to PML's ``AccuracyCalculator`` (arguments of later PML releases).
    """

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        avg_of_avgs: bool = False,
        return_per_class: bool = False,
        k: Any = None,
        label_comparison_fn: Any = None,
        device: Any = None,
        knn_func: Any = None,
        kmeans_func: Any = None,
        *,
        k_values: Sequence[int] = (1, 10, 100),
        alpha: float = 1.0,
        level_weights: Sequence[float] | None = None,
        hierarchy: Hierarchy | torch.Tensor | None = None,
        chunk_size: int | None = None,
        multilabel: bool = False,
        **kwargs: Any,
    ) -> None:
        self.multilabel = check_bool("multilabel", multilabel)
        self._cache: dict[str, Any] = {}
        self._num_levels = 1
        self._include = tuple(include)
        device = check_device("device", device)
        super().__init__(
            include, exclude, avg_of_avgs, return_per_class, k, label_comparison_fn, device, knn_func, kmeans_func,
            **kwargs,
        )  # fmt: skip
        self.hierarchy = as_hierarchy(hierarchy)
        self._evaluator_kwargs = dict(
            k_values=tuple(k_values), alpha=alpha, chunk_size=chunk_size, level_weights=level_weights
        )
        RetrievalEvaluator(**self._evaluator_kwargs)  # validate now
        if multilabel:
            self._multilabel_groups(include)  # validate now

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
        custom = self.label_comparison_fn is not EQUALITY  # labels passed to PML as they are
        query, query_labels, reference, reference_labels, riq = _inputs(
            query, query_labels, reference, reference_labels, ref_includes_query, integer_labels if not custom else None
        )
        if len(query) != len(query_labels) or len(reference) != len(reference_labels):
            raise ValueError("embeddings and labels must have the same length")
        # before PML's ref_includes_query check, which reports NaN rows as "reference must be equal to query"
        check_embeddings("query", query)
        check_embeddings("reference", reference)
        wanted = list(self.get_function_dict(include, exclude))
        theirs = [m for m in wanted if m not in _ADDED]
        named = set(include) if include else set(self._include)
        if custom:
            skipped = [m for m in wanted if m in _ADDED]
            if skipped:
                warnings.warn(
                    f"label_comparison_fn is set: the added metrics {skipped} rank items by label levels and cannot "
                    "honour a custom comparison, so they are skipped (PML's metrics are computed with it)",
                    UserWarning,
                    stacklevel=2,
                )
            args = (query, query_labels, reference, reference_labels, riq)
            return super().get_accuracy(*args, include=tuple(theirs)) if theirs else {}
        result: dict[str, Any] = {}
        if self.multilabel:
            ours = [m for m in self._multilabel_groups(include) if m in wanted]
        else:
            # a multi-label group (mean_label_ap) is computed on single-label data only when named: it repeats "ap"
            ours = [m for m in wanted if m in _ADDED and (METRICS[m].single_label or m in named)]
            if theirs:  # PML's metrics on the fine labels (column 0 of the levels), re-indexed to 0..K-1
                ql = check_labels("query_labels", query_labels, len(query), n_name="query")
                rl = check_labels("reference_labels", reference_labels, len(reference), n_name="reference")
                ql, rl = hierarchical_label_pair(ql, rl, self.hierarchy, names=("query_labels", "reference_labels"))
                both = torch.cat([ql[:, 0], rl[:, 0].to(ql.device)])
                fine = torch.unique(both, return_inverse=True)[1]
                Q = len(query)
                result.update(super().get_accuracy(query, fine[:Q], reference, fine[Q:], riq, include=tuple(theirs)))
        if ours:
            self._cache, self._num_levels = self._run(ours, query, query_labels, reference, reference_labels, riq)
            self._collect(ours, named, result)
        return result

    def _get_accuracy(self, function_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """PML's ``_get_accuracy``; called with the kNN results only (no ``query``/``reference``), the added metrics
        are skipped with one ``UserWarning`` naming them."""
        if "query" in kwargs and "reference" in kwargs:
            return super()._get_accuracy(function_dict, **kwargs)
        skipped = [name for name in function_dict if name in _ADDED]
        if skipped:
            warnings.warn(
                f"{type(self).__name__}: {', '.join(skipped)} need the embeddings (query= and reference=) and are "
                "skipped on the kNN-only path; call get_accuracy(query, query_labels, ...) to compute them",
                UserWarning,
                stacklevel=2,
            )
        return super()._get_accuracy({k: v for k, v in function_dict.items() if k not in _ADDED}, **kwargs)

    def _evaluate_group(self, spec: MetricSpec, kwargs: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``(values, L)`` of the group ``spec`` on the inputs PML passes to a metric function (``fn(**kwargs)``)."""
        missing = [k for k in ("query", "query_labels") if k not in kwargs]
        if missing:
            raise ValueError(
                f"calculate_{spec.name} needs the inputs PML passes to metric functions ({missing} missing); "
                "call get_accuracy(...) or pass query=, query_labels=, reference=, reference_labels="
            )
        inputs = [kwargs["query"], kwargs["query_labels"], kwargs.get("reference"), kwargs.get("reference_labels")]
        return self._run([spec.name], *_inputs(*inputs, bool(kwargs.get("ref_includes_query")), integer_labels))

    def _multilabel_groups(self, include: Sequence[str]) -> list[str]:
        """The added groups named in ``include`` (this call's, else the constructor's), or every multi-label one."""
        named = tuple(include) if include else self._include
        pml_named = [m for m in named if m not in _ADDED]
        if pml_named:
            raise ValueError(
                f"include: PML's metrics {pml_named} are not defined for multilabel=True; multi-label metrics: "
                f"{[m for m in MULTILABEL_GROUPS if m in _ADDED]}"
            )
        if named:
            return list(multilabel_groups(named))
        return [m for m in MULTILABEL_GROUPS if m in _ADDED]

    def _run(
        self, groups: Sequence[str], query: Any, ql: Any, reference: Any, rl: Any, riq: bool
    ) -> tuple[dict[str, Any], int]:
        """``(evaluate's result, L)`` of the added ``groups`` (multi-label when the calculator is)."""
        kw = dict(self._evaluator_kwargs, device=self.device, hierarchy=self.hierarchy, multilabel=self.multilabel)
        same = reference is query  # the query set itself: the evaluator's default, each query removed by index
        gallery = (None, None) if same else (reference.float(), rl)
        values = RetrievalEvaluator(metrics=groups, **kw).evaluate(query.float(), ql, *gallery, ref_includes_query=riq)
        return values, sum(key.startswith("num_queries_without_positives_level") for key in values)

    def _collect(self, ours: Sequence[str], named: set[str], result: dict[str, Any]) -> None:
        """Add the cached values of the groups ``ours`` (and the query counts) to ``result``."""
        for name in ours:
            value = getattr(self, f"calculate_{name}")()
            pml_names = dict(METRICS[name].pml_names)
            for key, v in (value if isinstance(value, dict) else {name: value}).items():
                pml = pml_names.get(key)
                if pml is not None and pml in result and (key == pml or name not in named):
                    continue  # PML reports this number under its own name
                result[key] = v
        for key, value in self._cache.items():
            if key.startswith("num_queries"):
                result[key] = value
        self._cache = {}


def _inputs(query: Any, query_labels: Any, reference: Any, reference_labels: Any, riq: bool, labels: Any) -> tuple:
    """PML's inputs as tensors, labels converted by ``labels(name, value)`` (None: as they are); ``reference`` None:
    the query set itself (``ref_includes_query``)."""
    convert = labels or (lambda name, value: c_f.numpy_to_torch(value))
    query, query_labels = c_f.numpy_to_torch(query), convert("query_labels", query_labels)
    if reference is None:
        return query, query_labels, query, query_labels, True
    return query, query_labels, c_f.numpy_to_torch(reference), convert("reference_labels", reference_labels), riq


def integer_labels(name: str, labels: Any) -> Any:
    """Float ``labels`` holding integers as an integer tensor (PML stores labels as float), else ValueError naming
    ``name``; anything else unchanged."""
    labels = c_f.numpy_to_torch(labels)
    if isinstance(labels, torch.Tensor) and labels.is_floating_point():
        if not bool(torch.isfinite(labels).all()):
            raise ValueError(f"{name}: float labels must be finite integer values; got NaN or inf")
        if not bool((labels == labels.round()).all()):
            bad = labels[labels != labels.round()][:3].tolist()
            raise ValueError(f"{name}: float labels must hold integer values (e.g. 3.0); got {bad}")
        return labels.long()
    return labels


def _calculate(spec: MetricSpec) -> Any:
    """The ``calculate_<group>`` method of ``spec`` (a float, or ``{key: float}`` for a ``{k}``/``{h}`` pattern)."""

    def calculate(self: HierarchicalAccuracyCalculator, **kwargs: Any) -> float | dict[str, float]:
        if kwargs:  # called the way PML calls metric functions: evaluate on the inputs given
            cache, num_levels = self._evaluate_group(spec, kwargs)
        else:  # inside get_accuracy: the evaluation ran once for every group
            cache, num_levels = self._cache, self._num_levels
        if spec.key == spec.name:
            return cache[spec.key]
        ks = self._evaluator_kwargs["k_values"] if spec.takes_k else (None,)
        hs = range(num_levels) if spec.per_level else (None,)
        return {key: cache[key] for key in dict.fromkeys(spec.format_key(k, h) for h in hs for k in ks)}

    calculate.__name__ = calculate.__qualname__ = f"calculate_{spec.name}"
    calculate.__doc__ = f"{spec.description} (``{spec.key}``); computed once per ``get_accuracy`` call."
    return calculate


for _name in _ADDED:
    setattr(HierarchicalAccuracyCalculator, f"calculate_{_name}", _calculate(METRICS[_name]))
del _name
