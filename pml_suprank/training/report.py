"""Printed metric summaries of the training loop and the recipes (one line per epoch, before/after tables)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_metrics_table"]

_SHORT_KEYS = ("h_ap", "ndcg", "asi", "ap", "recall_at_1")


def _format_metrics(metrics: dict[str, float], short: bool = False) -> str:
    keys = [k for k in _SHORT_KEYS if k in metrics]
    if not short:
        keys += sorted(k for k in metrics if k.startswith("ap_level"))
        keys += [k for k in ("map_at_r", "precision_at_1") if k in metrics]
    return "  ".join(f"{k}={metrics[k]:.4f}" for k in keys)


def format_metrics_table(before: dict[str, float], after: dict[str, float], keys: Sequence[str] | None = None) -> str:
    """A fixed-width before/after table of the main metrics (what the recipes print)."""
    if keys is None:
        keys = [k for k in ("h_ap", "ndcg", "asi") if k in after]
        keys += sorted((k for k in after if k.startswith("ap_level")), key=lambda s: s)
        keys += [k for k in ("ap", "map_at_r", "recall_at_1", "precision_at_1") if k in after]
    lines = [f"{'metric':<16}{'before':>10}{'after':>10}{'change':>10}"]
    for k in keys:
        b, a = before.get(k, float("nan")), after.get(k, float("nan"))
        lines.append(f"{k:<16}{b:>10.4f}{a:>10.4f}{a - b:>+10.4f}")
    return "\n".join(lines)


def _one_column(metrics: dict[str, float]) -> str:
    keys = [k for k in ("h_ap", "ndcg", "asi") if k in metrics]
    keys += sorted(k for k in metrics if k.startswith("ap_level"))
    keys += [k for k in ("ap", "map_at_r", "recall_at_1", "precision_at_1") if k in metrics]
    return "\n".join(f"{k:<16}{metrics[k]:>10.4f}" for k in keys)
