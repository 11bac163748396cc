"""Labels, headline keys and printed tables of the evaluator's metrics, all derived from the metric registry.

Used by model cards (display labels, headline metrics), the training progress line and the recipes' before/after
tables, so that a metric added to :data:`~pml_suprank.metrics.registry.METRICS` is labelled and reported without
touching these layers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .registry import METRICS

__all__ = [
    "HEADLINE_KEYS",
    "PROGRESS_KEYS",
    "format_metrics",
    "format_metrics_table",
    "headline_keys",
    "metric_label",
    "one_column",
    "table_keys",
]

_REPORTED = sorted((s for s in METRICS.values() if s.report is not None), key=lambda s: s.report)
#: keys shown first in model cards and listed in their metadata, in order
HEADLINE_KEYS: tuple[str, ...] = tuple(s.report_key for s in _REPORTED if s.headline and not s.per_level)
#: keys of the one-line training progress report, in order
PROGRESS_KEYS: tuple[str, ...] = tuple(s.report_key for s in _REPORTED if s.progress and not s.per_level)

# display labels: exact keys, then key prefixes of the top-k patterns ("recall_at_" -> "R@{k}"); per-level specs
# override the label of their base key (e.g. "ap_level{h}" is "AP", where the fine "ap" is "mAP")
_EXACT = {s.key: s.label for s in METRICS.values() if not s.per_level and not s.takes_k}
_PREFIX = tuple((s.key.split("{k}")[0], s.label) for s in METRICS.values() if not s.per_level and s.takes_k)
_LEVEL_EXACT = {s.key.split("_level{h}")[0]: s.label for s in METRICS.values() if s.per_level and not s.takes_k}


def _base_label(base: str, per_level: bool) -> str:
    if per_level and base in _LEVEL_EXACT:
        return _LEVEL_EXACT[base]
    if base in _EXACT:
        return _EXACT[base]
    for prefix, label in _PREFIX:
        if base.startswith(prefix):
            return label.format(k=base[len(prefix) :]) or base
    return base


def metric_label(key: str, level_names: Sequence[str] | None = None) -> str:
    """Display label of an evaluator key, e.g. ``"ap"`` → ``"mAP"``, ``"recall_at_10"`` → ``"R@10"``,
    ``"recall_at_1_level1"`` → ``"R@1 (coarse_label)"`` with ``level_names = ("fine_label", "coarse_label")``.

    Keys the registry does not know are returned as they are (with `` (level h)`` for a ``_level{h}`` suffix).

    Args:
        key: a result key of :meth:`~pml_suprank.metrics.RetrievalEvaluator.evaluate`.
        level_names: names of the label columns (0 = finest); default ``"level {h}"``.
    """
    base, level = key, None
    if "_level" in key:
        head, _, tail = key.rpartition("_level")
        if tail.isdigit():
            base, level = head, int(tail)
    name = _base_label(base, level is not None)
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


def table_keys(metrics: Mapping[str, float]) -> list[str]:
    """Keys of ``metrics`` shown in printed tables, in registry report order (per-level keys sorted by name)."""
    keys: list[str] = []
    for spec in _REPORTED:
        if spec.per_level:
            keys += sorted(k for k in metrics if k.startswith(spec.report_key))
        elif spec.report_key in metrics:
            keys.append(spec.report_key)
    return keys


def format_metrics(metrics: Mapping[str, float], short: bool = False) -> str:
    """One line ``"h_ap=0.7128  ndcg=0.9890  ..."``: the progress keys, then (unless ``short``) the other table
    keys."""
    keys = [k for k in PROGRESS_KEYS if k in metrics]
    if not short:
        keys += [k for k in table_keys(metrics) if k not in keys]
    return "  ".join(f"{k}={metrics[k]:.4f}" for k in keys)


def format_metrics_table(
    before: Mapping[str, float], after: Mapping[str, float], keys: Sequence[str] | None = None
) -> str:
    """A fixed-width before/after table (``metric``, ``before``, ``after``, ``change``); default keys: the table keys
    of ``after``; a key missing from one side prints ``nan``."""
    if keys is None:
        keys = table_keys(after)
    lines = [f"{'metric':<16}{'before':>10}{'after':>10}{'change':>10}"]
    for k in keys:
        b, a = before.get(k, float("nan")), after.get(k, float("nan"))
        lines.append(f"{k:<16}{b:>10.4f}{a:>10.4f}{a - b:>+10.4f}")
    return "\n".join(lines)


def one_column(metrics: Mapping[str, float]) -> str:
    """The table keys of ``metrics`` as fixed-width ``key value`` lines."""
    return "\n".join(f"{k:<16}{metrics[k]:>10.4f}" for k in table_keys(metrics))
