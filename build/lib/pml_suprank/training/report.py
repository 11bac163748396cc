"""Printed metric summaries of the training loop and the recipes (one line per epoch, before/after tables).

They come from the metric registry (:mod:`pml_suprank.metrics.report`); the names below are kept for code that
imported them from ``pml_suprank.training``.
"""

from __future__ import annotations

from ..metrics.report import PROGRESS_KEYS, format_metrics, format_metrics_table, one_column

__all__ = ["format_metrics_table"]

_SHORT_KEYS = PROGRESS_KEYS
_format_metrics = format_metrics
_one_column = one_column
