"""Multi-label relevance of the Sup-H-AP loss (Ramzi, PhD thesis, Algorithm 1) mapped to per-query levels.

The hierarchical rank kernels (:func:`pml_suprank.ranking.sup_hap_scores`,
:func:`pml_suprank.ranking.dense_sup_hap_scores`) only need, per query, an integer level of every item that orders
the items by relevance and a ``(B, K + 1)`` table of the relevance of each level. Any pairwise relevance gives
both: the distinct positive relevance values of a query, sorted, are its levels ``1..K``
(:func:`pml_suprank.metrics.graded.graded_levels`). ``T_j < T_i`` then means "strictly less relevant" and
``min(rel_i, rel_j)`` is read from the table, so the kernels compute Sup-H-AP with that relevance exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..relevance import Hierarchy, _check_multilabel, multilabel_relevance

__all__ = ["multilabel_levels"]


def _check_first_column(name: str, labels: Tensor) -> Tensor:
    labels = _check_multilabel(name, labels)
    if labels.numel() and bool((labels[:, 0] < 0).any()):
        row = int((labels[:, 0] < 0).nonzero()[0, 0])
        raise ValueError(
            f"{name} row {row} has -1 in column 0; multi-label rows must start with a label (put the -1 padding "
            "after the labels): column 0 is the item's label for the proxy term of HAPPIERLoss"
        )
    return labels


def multilabel_levels(
    labels: Tensor, ref_labels: Tensor, hierarchy: Hierarchy | None, valid: Tensor
) -> tuple[Tensor, Tensor, int]:
    """Per-query levels and level relevance of the multi-label relevance (thesis Algorithm 1).

    Args:
        labels: ``(B, M)`` (or ``(B,)``) fine labels of the queries, ``-1`` = padding, column 0 a label.
        ref_labels: ``(N, M')`` (or ``(N,)``) fine labels of the reference items, same conventions.
        hierarchy: fine → ancestors table, or ``None`` for flat labels (``L = 1``).
        valid: ``(B, N)`` bool mask of the counted reference items (invalid items get level 0).

    Returns:
        ``(levels (B, N) int64, level_relevance (B, K + 1) float64, K)``: ``levels[q, j]`` is the rank of
        ``rel(q, j)`` among the query's distinct positive relevances (0 = not relevant or invalid) and
        ``level_relevance[q, l]`` the relevance of level ``l``.

    Raises:
        TypeError / ValueError: bad labels (see :func:`pml_suprank.relevance.multilabel_relevance`), or a row
            whose column 0 is padding.
    """
    from ..metrics.graded import graded_levels  # here: importing pml_suprank.losses must not load the evaluator

    labels = _check_first_column("labels", labels)
    ref_labels = _check_first_column("ref_labels", ref_labels)
    rel = multilabel_relevance(labels, ref_labels, hierarchy, dtype=torch.float64)
    levels, values = graded_levels(rel, valid)
    return levels, values, values.shape[1] - 1
