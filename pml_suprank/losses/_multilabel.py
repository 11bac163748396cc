"""Multi-label relevance of the Sup-H-AP loss (Ramzi, PhD thesis, Algorithm 1) mapped to per-query levels.

A query's sorted distinct positive relevances are its levels ``1..K`` (:func:`pml_suprank.metrics.graded.graded_levels`)
with a ``(B, K + 1)`` relevance table, so the hierarchical rank kernels compute Sup-H-AP exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..relevance import Hierarchy, check_multilabel, ideal_dcg, level_counts, multilabel_relevance

__all__ = ["graded_dcg_scores", "multilabel_levels", "per_label_rows"]


def _check_first_column(name: str, labels: Tensor) -> Tensor:
    labels = check_multilabel(name, labels)
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
        ``(levels (B, N) int64, level_relevance (B, K + 1) float64, K)``: the rank of ``rel(q, j)`` among the
        query's distinct positive relevances (0 = not relevant or invalid) and the relevance of each level.

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


def graded_dcg_scores(rank: Tensor, levels: Tensor, level_gains: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Per-query ``DCG / iDCG`` (SupRank Eqs. 23-24) with per-query level gains (multi-label Sup-NDCG):
    ``DCG(q) = Σ_{i: T_i > 0} g_q(T_i) / log2(1 + rank(i))``, ``iDCG`` by :func:`pml_suprank.relevance.ideal_dcg`
    (``level_gains`` non-decreasing per row).

    Args:
        rank: ``(B, N)`` ranks of the items (only the valid positive entries are read).
        levels: ``(B, N)`` int64 levels ``0..K`` (0 = not relevant).
        level_gains: ``(B, K + 1)`` gain of each level of each query (``level_gains[:, 0] = 0``).
        valid: ``(B, N)`` bool mask of the counted reference items.

    Returns:
        ``(score (B,), has_pos (B,) bool)``: score 0 where the query has no relevant item.
    """
    levels = levels.long()
    gains = level_gains.to(rank.dtype)
    positive = valid & (levels > 0)
    dcg = torch.where(positive, gains.gather(1, levels) / torch.log2(1.0 + rank), torch.zeros_like(rank)).sum(1)
    idcg = ideal_dcg(level_counts(levels, gains.shape[1] - 1, valid), gains)
    has_pos = positive.any(1)
    score = torch.where(has_pos, dcg / torch.where(has_pos, idcg, torch.ones_like(idcg)), torch.zeros_like(dcg))
    return score, has_pos


def per_label_rows(labels: Tensor, ref_labels: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Expand each (query, distinct label) pair into a binary pseudo-query (per-label AP, thesis Sec. 6.2.1).

    Args:
        labels: ``(B, M)`` (or ``(B,)``) query label sets, ``-1`` = padding (a repeated label counts once).
        ref_labels: ``(N, M')`` (or ``(N,)``) reference label sets, same conventions.
        valid: ``(B, N)`` bool mask of the counted reference items.

    Returns:
        ``(owner (R,) long, positives (R, N) bool)``: the query row of each pseudo-query and the valid items carrying
        its label; ``R = Σ_q n_q`` (distinct labels).
    """
    labels = _check_first_column("labels", labels)
    ref_labels = check_multilabel("ref_labels", ref_labels)
    first = torch.ones_like(labels, dtype=torch.bool)
    if labels.shape[1] > 1:  # keep the first occurrence of each label of a row
        earlier = labels.unsqueeze(2) == labels.unsqueeze(1)  # (B, M, M): [q, a, b] label a == label b
        first = ~torch.tril(earlier, diagonal=-1).any(2)
    keep = (labels >= 0) & first
    owner, col = torch.nonzero(keep, as_tuple=True)
    row_labels = labels[owner, col]
    carries = (ref_labels.unsqueeze(0) == row_labels.view(-1, 1, 1)).any(2)  # (R, N)
    return owner, carries & valid[owner]
