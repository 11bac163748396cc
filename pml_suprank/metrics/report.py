"""Labels, headline keys and printed tables of the evaluator's metrics, all derived from the metric registry
(:data:`~pml_suprank.metrics.registry.METRICS`) for model cards, the training progress line and the recipes."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from .registry import METRICS, MetricSpec

__all__ = [
    "HEADLINE_KEYS",
    "PROGRESS_KEYS",
    "format_metrics",
    "format_metrics_table",
    "headline_keys",
    "metric_label",
    "metric_legend",
    "one_column",
    "same_as",
    "table_keys",
]

_REPORTED = sorted((s for s in METRICS.values() if s.report is not None), key=lambda s: s.report)
#: keys shown first in model cards and listed in their metadata, in order
HEADLINE_KEYS: tuple[str, ...] = tuple(s.report_key for s in _REPORTED if s.headline and not s.per_level)
#: keys of the one-line training progress report, in order
PROGRESS_KEYS: tuple[str, ...] = tuple(s.report_key for s in _REPORTED if s.progress and not s.per_level)

# every key pattern as a regular expression (groups ``k`` and ``h``), exact keys before the ``{k}``/``{h}`` patterns
_PATTERNS = tuple(
    (re.compile("^" + re.escape(s.key).replace(r"\{k\}", r"(?P<k>\d+)").replace(r"\{h\}", r"(?P<h>\d+)") + "$"), s)
    for s in sorted(METRICS.values(), key=lambda s: s.takes_k or s.per_level)
)


def _match(key: str) -> tuple[re.Match | None, MetricSpec | None]:
    for pattern, spec in _PATTERNS:
        if match := pattern.match(key):
            return match, spec
    return None, None


def _spec_of(key: str) -> MetricSpec | None:
    return _match(key)[1]


def metric_label(key: str, level_names: Sequence[str] | None = None) -> str:
    """Display label of an evaluator key, e.g. ``"ap"`` → ``"mAP"``, ``"recall_at_10"`` → ``"R@10"``,
    ``"recall_at_1_level1"`` → ``"R@1 (coarse_label)"`` with ``level_names = ("fine_label", "coarse_label")``;
    unknown keys unchanged (with `` (level h)`` for a ``_level{h}`` suffix).

    Args:
        key: a result key of :meth:`~pml_suprank.metrics.RetrievalEvaluator.evaluate`.
        level_names: names of the label columns (0 = finest); default ``"level {h}"``.
    """
    base, level = key, None
    head, _, tail = key.rpartition("_level")
    if head and tail.isdigit():
        base, level = head, int(tail)
    match, spec = _match(key)
    if spec is None or not spec.per_level:  # a per-level key of a metric without per-level spec: its base label
        match, spec = _match(base)
    name = base if spec is None else spec.label.format(k=match.groupdict().get("k"))
    if level is not None:
        where = level_names[level] if level_names and level < len(level_names) else f"level {level}"
        name = f"{name} ({where})"
    return name


def headline_keys(metrics: Mapping[str, float], paper_results: Mapping[str, float] | None = None) -> list[str]:
    """The headline keys of a model card: :data:`HEADLINE_KEYS` present in ``metrics`` or ``paper_results``, then
    the other keys of ``paper_results`` (published numbers to compare with)."""
    paper = paper_results or {}
    keys = [k for k in HEADLINE_KEYS if k in metrics or k in paper]
    return keys + [k for k in paper if k not in keys]


# keys of the same number by definition (alias -> the key kept in printed tables; see same_as)
_LEVEL0 = re.compile(r"^(?P<base>.+)_level0$")
# at k = 1 a hit is a precision of 1, a true recall of 1 (min(#positives, 1) = 1) and an mAP@1 of 1
_SAME_EXACT = {"precision_at_1": "recall_at_1", "true_recall_at_1": "recall_at_1", "map_at_1": "recall_at_1"}


def same_as(key: str) -> str | None:
    """The key printed instead of ``key`` because it holds the same number by definition, or None: ``"<m>_level0"``
    → ``"<m>"`` (level 0 is the finest column); ``"precision_at_1"``, ``"true_recall_at_1"``, ``"map_at_1"`` →
    ``"recall_at_1"``."""
    if key in _SAME_EXACT:
        return _SAME_EXACT[key]
    match = _LEVEL0.match(key)
    spec = _spec_of(key)
    if match and spec is not None and spec.per_level and _spec_of(match["base"]) is not None:
        return match["base"]
    return None


def _equal(a: float, b: float) -> bool:
    a, b = float(a), float(b)
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _dropped(metrics: Mapping[str, float], key: str) -> bool:
    kept = same_as(key)
    return kept is not None and kept in metrics and _equal(metrics[key], metrics[kept])


def _level(key: str) -> int:
    tail = key.rpartition("_level")[2]
    return int(tail) if tail.isdigit() else -1


def _candidate_keys(metrics: Mapping[str, float]) -> list[str]:
    keys: list[str] = []
    for spec in _REPORTED:
        if spec.per_level:
            level_keys = [k for k in metrics if k.startswith(spec.report_key) and k[len(spec.report_key) :].isdigit()]
            keys += sorted(level_keys, key=_level)
        elif spec.report_key in metrics:
            keys.append(spec.report_key)
    return keys


def table_keys(metrics: Mapping[str, float]) -> list[str]:
    """Keys of ``metrics`` shown in printed tables, in registry report order (per-level keys by level), less those
    whose :func:`same_as` key is present with the same value."""
    return [k for k in _candidate_keys(metrics) if not _dropped(metrics, k)]


def metric_legend(keys: Sequence[str], metrics: Mapping[str, float] | None = None) -> str:
    """One line defining the printed ``keys`` from the registry descriptions (``"h_ap = hierarchical AP ... ·
    ap_level{h} = ..."``; patterned keys once, unknown keys not at all, ``""`` if none). With ``metrics``, the keys
    left out as the same number (:func:`same_as`) are named after the key kept."""
    left_out = [k for k in _candidate_keys(metrics or {}) if _dropped(metrics or {}, k)]
    parts: dict[str, str] = {}
    for key in keys:
        spec = _spec_of(key)
        if spec is None:
            continue
        name = spec.key if (spec.per_level or spec.takes_k) else key
        if name not in parts:
            parts[name] = f"{name} = {spec.description}"
        same = [k for k in left_out if same_as(k) == key]
        if same:
            parts[name] += f" ({key} = {' = '.join(same)}, printed once)"
    return " · ".join(parts.values())


def format_metrics(metrics: Mapping[str, float], short: bool = False) -> str:
    """One line ``"h_ap=0.7128  ndcg=0.9890  ..."``: the progress keys, then (unless ``short``) the table keys."""
    keys = [k for k in PROGRESS_KEYS if k in metrics]
    if not short:
        keys += [k for k in table_keys(metrics) if k not in keys]
    return "  ".join(f"{k}={metrics[k]:.4f}" for k in keys)


def format_metrics_table(
    before: Mapping[str, float],
    after: Mapping[str, float],
    keys: Sequence[str] | None = None,
    legend: bool = True,
) -> str:
    """A fixed-width before/after table (``metric``, ``before``, ``after``, ``change``), then (``legend``) a
    one-line :func:`metric_legend` of its rows; default keys: the table keys of ``after``; a key missing from one
    side prints ``nan``."""
    if keys is None:
        keys = table_keys(after)
    lines = [f"{'metric':<16}{'before':>10}{'after':>10}{'change':>10}"]
    for k in keys:
        b, a = before.get(k, float("nan")), after.get(k, float("nan"))
        lines.append(f"{k:<16}{b:>10.4f}{a:>10.4f}{a - b:>+10.4f}")
    if legend and (text := metric_legend(keys, after)):
        lines.append(text)
    return "\n".join(lines)


def one_column(metrics: Mapping[str, float], legend: bool = True) -> str:
    """The table keys of ``metrics`` as fixed-width ``key value`` lines, then (``legend``) a :func:`metric_legend`."""
    keys = table_keys(metrics)
    lines = [f"{k:<16}{metrics[k]:>10.4f}" for k in keys]
    if legend and (text := metric_legend(keys, metrics)):
        lines.append(text)
    return "\n".join(lines)
