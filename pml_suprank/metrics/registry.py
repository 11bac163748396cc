"""The metric registry: everything the package knows about one retrieval metric, in one :class:`MetricSpec`.

:data:`METRICS` drives the evaluator's groups (:data:`METRIC_GROUPS`, :data:`TOP_K_GROUPS` for faiss), the
``calculate_*`` methods of :class:`~pml_suprank.metrics.HierarchicalAccuracyCalculator`, the display labels
(:mod:`pml_suprank.metrics.report`) and :func:`metrics_from_ranks`. Adding a metric = one function
``f(stats, args) -> (Q,) float64`` and ``METRICS.register(spec.name, spec)``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from torch import Tensor

from .._registry import Registry
from .._validation import check_level_weights
from . import from_ranks as R
from .ranks import RetrievalRanks

__all__ = [
    "METRICS",
    "METRIC_GROUPS",
    "MULTILABEL_GROUPS",
    "MULTILABEL_KINDS",
    "SINGLE_LABEL_GROUPS",
    "TOP_K_GROUPS",
    "MetricArgs",
    "MetricSpec",
    "check_groups",
    "metrics_from_ranks",
]


class MetricArgs(NamedTuple):
    """What a metric function receives besides the shared :class:`~pml_suprank.metrics.from_ranks.RankStats`.

    Attributes:
        min_level: binary positives are the items at level ``>= min_level`` (``L`` fine, ``L - h`` at level ``h``).
        k: the cutoff of a top-k metric (None otherwise).
        alpha: ``α`` of the H-AP pop relevance (SupRank Eq. 20).
        level_weights: ΣwAP weights ``w_1..w_L`` (None = uniform).
    """

    min_level: int
    k: int | None = None
    alpha: float = 1.0
    level_weights: Tensor | Iterable[float] | None = None


@dataclass(frozen=True)
class MetricSpec:
    """One retrieval metric.

    Attributes:
        name: the group name of ``RetrievalEvaluator(metrics=...)`` and ``HierarchicalAccuracyCalculator(include=...)``.
        key: result key or pattern with ``{k}`` (top-k cutoff) and/or ``{h}`` (label column, 0 = finest).
        label: display label, ``{k}`` filled in (:func:`~pml_suprank.metrics.report.metric_label`).
        compute: ``compute(stats, args) -> (Q,) float64`` (NaN where undefined).
        description: one line for documentation.
        hierarchical: uses every level at once (H-AP, NDCG, ASI, ΣwAP); otherwise binary at ``args.min_level``.
        per_level: one key per hierarchy level ``h`` (positives at level ``>= L - h``).
        top_k: computable from a k-NN search of the ``max(k)`` first items (the faiss backend).
        headline, progress: shown first in model cards / in the training progress line (``k = 1`` for top-k).
        report: position in the printed tables and the model card's headline table (None: full table only).
        pml_names: ``(our key, PML AccuracyCalculator name)`` pairs of the keys PML computes under its own name.
        multilabel: one of :data:`MULTILABEL_KINDS` for ``evaluate(..., multilabel=True)`` (see
            :mod:`pml_suprank.metrics.multilabel_eval`); None: undefined.
        single_label: among the default single-label groups (``False`` for ``mean_label_ap``).
    """

    name: str
    key: str
    label: str
    compute: Callable[[R.RankStats, MetricArgs], Tensor]
    description: str
    hierarchical: bool = False
    per_level: bool = False
    top_k: bool = False
    headline: bool = False
    progress: bool = False
    report: int | None = None
    pml_names: tuple[tuple[str, str], ...] = ()
    multilabel: str | None = None
    single_label: bool = True

    def __post_init__(self) -> None:
        if self.multilabel is not None and self.multilabel not in MULTILABEL_KINDS:
            raise ValueError(f"multilabel must be one of {MULTILABEL_KINDS} or None; got {self.multilabel!r}")

    @property
    def takes_k(self) -> bool:
        """Whether the key has a ``{k}`` cutoff."""
        return "{k}" in self.key

    def format_key(self, k: int | None = None, h: int | None = None) -> str:
        """The result key for cutoff ``k`` and hierarchy level ``h``."""
        return self.key.format(k=k, h=h)

    @property
    def report_key(self) -> str:
        """The key shown in reports (top-k: ``k = 1``; per-level: the prefix of every level's key, ``"ap_level"``)."""
        key = self.key.replace("{k}", "1")
        return key.split("{h}")[0] if self.per_level else key


#: how a metric is computed on multi-label data (see :attr:`MetricSpec.multilabel`)
MULTILABEL_KINDS = ("levels", "graded", "labels")


def _binary(fn: Callable[..., Tensor]) -> Callable[[R.RankStats, MetricArgs], Tensor]:
    """``compute`` of a binary ``*_from_ranks`` function (with the cutoff ``k`` of a top-k key)."""
    return lambda st, a: fn(st, min_level=a.min_level) if a.k is None else fn(st, a.k, min_level=a.min_level)


def _sum_w_ap(st: R.RankStats, a: MetricArgs) -> Tensor:
    return R.weighted_sum_ap_from_ranks(st, check_level_weights("level_weights", a.level_weights, st.num_levels))


_SPECS = (
    MetricSpec("ap", "ap", "mAP", _binary(R.ap_from_ranks),
               "average precision of the fine label over the whole gallery",
               headline=True, progress=True, report=4, multilabel="levels"),
    MetricSpec("map_at_r", "map_at_r", "mAP@R", _binary(R.map_at_r_from_ranks), "mAP@R (Musgrave et al.)",
               headline=True, report=5, pml_names=(("map_at_r", "mean_average_precision_at_r"),), multilabel="levels"),
    MetricSpec("r_precision", "r_precision", "R-precision", _binary(R.r_precision_from_ranks), "R-precision",
               pml_names=(("r_precision", "r_precision"),), multilabel="levels"),
    MetricSpec("precision_at_1", "precision_at_1", "P@1", lambda st, a: R.precision_at_k_from_ranks(st, 1, a.min_level),
               "precision of the first item", top_k=True, report=7, multilabel="levels",
               pml_names=(("precision_at_1", "precision_at_1"),)),
    MetricSpec("recall_at_k", "recall_at_{k}", "R@{k}", _binary(R.recall_at_k_from_ranks),
               "hit rate: 1 if a positive is in the top k", top_k=True, headline=True, progress=True, report=6,
               pml_names=(("recall_at_1", "precision_at_1"),), multilabel="levels"),
    MetricSpec("precision_at_k", "precision_at_{k}", "P@{k}", _binary(R.precision_at_k_from_ranks),
               "positives in the top k / k", top_k=True, pml_names=(("precision_at_1", "precision_at_1"),),
               multilabel="levels"),
    MetricSpec("true_recall_at_k", "true_recall_at_{k}", "true recall@{k}", _binary(R.true_recall_at_k_from_ranks),
               "positives in the top k / min(#positives, k)", multilabel="levels"),
    MetricSpec("map_at_k", "map_at_{k}", "mAP@{k}", _binary(R.map_at_k_from_ranks),
               "precisions at the positives in the top k / min(#positives, k)", multilabel="levels"),
    MetricSpec("h_ap", "h_ap", "H-AP", lambda st, a: R.hap_from_ranks(st, alpha=a.alpha),
               "hierarchical AP (SupRank Eq. 19, pop relevance Eq. 20)",
               hierarchical=True, headline=True, progress=True, report=0, multilabel="graded"),
    MetricSpec("ndcg", "ndcg", "NDCG", lambda st, a: R.ndcg_from_ranks(st), "NDCG (SupRank Eq. 23)",
               hierarchical=True, headline=True, progress=True, report=1, multilabel="graded"),
    MetricSpec("asi", "asi", "ASI", lambda st, a: R.asi_from_ranks(st), "average set intersection (SupRank App. C-A1)",
               hierarchical=True, headline=True, progress=True, report=2),
    MetricSpec("sum_w_ap", "sum_w_ap", "ΣwAP", _sum_w_ap, "weighted sum of the per-level APs", hierarchical=True),
    MetricSpec("ap_level", "ap_level{h}", "AP", _binary(R.ap_from_ranks),
               "AP with positives sharing label column h (0 = finest)",
               per_level=True, report=3, multilabel="levels"),
    MetricSpec("map_at_r_level", "map_at_r_level{h}", "mAP@R", _binary(R.map_at_r_from_ranks),
               "mAP@R with positives sharing label column h",
               per_level=True, multilabel="levels"),
    MetricSpec("recall_at_k_level", "recall_at_{k}_level{h}", "R@{k}", _binary(R.recall_at_k_from_ranks),
               "hit rate in the top k with positives sharing label column h", per_level=True, top_k=True,
               multilabel="levels"),
    MetricSpec("mean_label_ap", "mean_label_ap", "mean label AP", _binary(R.ap_from_ranks),
               "AP of each query label as a binary problem, averaged over the query's labels (one label per item: "
               "the fine AP)", report=8, multilabel="labels", single_label=False),
)  # fmt: skip

#: every metric, by group name (:class:`pml_suprank._registry.Registry`; a taken name is refused)
METRICS = Registry("metric", on_conflict="refuse")
for _spec in _SPECS:
    METRICS.register(_spec.name, _spec)
#: metric groups accepted by ``RetrievalEvaluator(metrics=...)`` and the key (pattern) each one produces
METRIC_GROUPS: Mapping[str, str] = MappingProxyType({s.name: s.key for s in _SPECS})
#: the groups the faiss k-NN backend computes
TOP_K_GROUPS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.top_k)
#: the default groups of single-label evaluation
SINGLE_LABEL_GROUPS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.single_label)
#: the groups the multi-label evaluator computes (its default)
MULTILABEL_GROUPS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.multilabel is not None)


def check_groups(groups: Iterable[str]) -> tuple[str, ...]:
    """``groups`` as a tuple, or a ValueError naming the unknown ones."""
    groups = (groups,) if isinstance(groups, str) else tuple(groups)
    unknown = [g for g in groups if g not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric name(s) {unknown}; valid names: {tuple(METRICS)}")
    return groups


def _plan(L: int, k_values: Iterable[int], groups: Collection[str]) -> list[tuple[str, MetricSpec, int, int | None]]:
    """``(key, spec, min_level, k)`` of every requested key, in result order: the fine binary metrics (cutoff-free
    first, then by increasing ``k``), the same for each hierarchy level ``h``, then the hierarchical metrics."""
    specs = [s for s in METRICS.values() if s.name in groups]
    ks = sorted(set(k_values))
    plan = []
    for h in (None, *range(L)):
        scoped = [s for s in specs if not s.hierarchical and s.per_level == (h is not None)]
        m = L if h is None else L - h
        for k in (None, *ks):
            plan += [(s.format_key(k, h), s, m, k) for s in scoped if s.takes_k == (k is not None)]
    plan += [(s.key, s, L, None) for s in specs if s.hierarchical]
    return plan


def metrics_from_ranks(
    ranks: RetrievalRanks,
    *,
    k_values: Iterable[int] = (1,),
    groups: Iterable[str] = (),
    alpha: float = 1.0,
    level_weights: Tensor | list[float] | None = None,
) -> dict[str, Tensor]:
    """Every requested metric from one :class:`RetrievalRanks`, sharing one :class:`~from_ranks.RankStats`.

    Args:
        ranks: from :func:`~pml_suprank.metrics.ranks.retrieval_ranks` or the evaluator.
        groups: names from :data:`METRIC_GROUPS`.
        k_values, alpha, level_weights: as in :class:`~pml_suprank.metrics.RetrievalEvaluator`.

    Returns:
        ``{key: (Q,) float64}`` with the evaluator's key names (NaN where undefined).
    """
    groups = set(check_groups(groups))
    k_values = tuple(k_values)
    stats = R.RankStats(ranks, k_values=(1, *k_values))
    out: dict[str, Tensor] = {}
    for key, spec, m, k in _plan(ranks.num_levels, k_values, groups):
        if key not in out:  # e.g. "precision_at_1" of both precision_at_1 and precision_at_k
            out[key] = spec.compute(stats, MetricArgs(m, k, alpha, level_weights))
    return out
