"""Exact multi-label retrieval evaluation: ``RetrievalEvaluator.evaluate(..., multilabel=True)``.

Labels are ``(N, M)`` fine-label sets padded with ``-1`` (at least one label each), the hierarchy the
``(num_fine, L)`` table (``None``: flat, ``L = 1``); memory ``O(chunk · N)``. Each group is computed as its registry
entry says (:attr:`~pml_suprank.metrics.registry.MetricSpec.multilabel`):

* ``"graded"`` (``h_ap``, ``ndcg``): :mod:`pml_suprank.metrics.graded` H-AP and NDCG of the thesis' Algorithm 1
  relevance ``rel = Σ_i l*_i / (n_q · L)`` in ``[0, 1]`` (:func:`pml_suprank.relevance.multilabel_relevance`).
* ``"levels"`` (``ap``, ``recall_at_{k}``, ``ap_level{h}``, ...): the single-label binary metrics on the best
  agreement level ``λ(q, k) = L − min_{i,j} LCA(y_q^i, y_k^j)`` (``λ = L``: a shared fine label; ``λ >= L − h``: a
  shared level-``h`` ancestor).
* ``"labels"`` (``mean_label_ap``): :func:`~pml_suprank.metrics.graded.mean_label_average_precision`.

**One label per item**: the ``"levels"`` metrics equal the single-label evaluator's; ``rel = l / L`` is *not* the pop
relevance of SupRank Eq. 20, so ``h_ap`` equals ``functional.hierarchical_average_precision(scores, levels,
relevance=l / L)`` and ``ndcg`` uses gains ``2^(l / L) − 1``; both equal the single-label values when ``L = 1``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..relevance import Hierarchy, check_multilabel, label_ancestors, level_counts, multilabel_relevance
from .graded import graded_ranks, hap_block, mean_label_average_precision, ndcg_block
from .ranks import rank_levels
from .registry import METRICS, MULTILABEL_GROUPS, check_groups, metrics_from_ranks

__all__ = ["best_agreement_levels", "check_multilabel_labels", "multilabel_groups"]


def check_multilabel_labels(name: str, labels: Any, n: int, n_name: str, hierarchy: Hierarchy | None) -> Tensor:
    """``labels`` as an ``(n, M)`` long tensor of label sets (``-1`` padding), checked against ``hierarchy``.

    Raises:
        TypeError: non-tensor or non-integer labels.
        ValueError: naming ``name``: a label below ``-1``, a row without a label, a wrong number of rows, a fine
            label missing from the hierarchy.
    """
    labels = check_multilabel(name, labels)
    if labels.shape[0] != n:
        raise ValueError(
            f"{name} must have shape (N,) or (N, M) with N == {n_name}.shape[0] == {n}; got shape {tuple(labels.shape)}"
        )
    if hierarchy is not None:
        label_ancestors(labels, hierarchy.table.to(labels.device), name)
    return labels


def multilabel_groups(groups: tuple[str, ...] | None) -> tuple[str, ...]:
    """The groups to compute on multi-label data: :data:`~pml_suprank.metrics.registry.MULTILABEL_GROUPS` for
    ``None``, else ``groups``, or a ValueError naming ``metrics`` and the groups undefined for multi-label data."""
    if groups is None:
        return MULTILABEL_GROUPS
    groups = check_groups(groups)
    bad = [g for g in groups if METRICS[g].multilabel is None]
    if bad:
        raise ValueError(f"metrics {bad} are not defined for multilabel=True; multi-label metrics: {MULTILABEL_GROUPS}")
    return groups


def best_agreement_levels(query_labels: Tensor, ref_labels: Tensor, hierarchy: Hierarchy | None) -> Tensor:
    """``(Q, R)`` int64 best agreement level ``λ = L − min_{i,j} LCA(y_q^i, y_k^j)`` (``L``: a shared fine label,
    ``0``: no shared ancestor), from :func:`~pml_suprank.relevance.multilabel_relevance` of each query label."""
    L = 1 if hierarchy is None else hierarchy.num_levels
    q = query_labels
    fill = q.max(1, keepdim=True).values  # a real label of the row: padding slots repeat it (a set ignores repeats)
    q = torch.where(q >= 0, q, fill)
    best = None
    for col in range(q.shape[1]):
        rel = multilabel_relevance(q[:, col], ref_labels, hierarchy, dtype=torch.float64)
        best = rel if best is None else torch.maximum(best, rel)
    return torch.round(best * L).long()


def _chunk_metrics(
    evaluator: Any,
    scores: Tensor,
    ql: Tensor,
    rl: Tensor,
    self_cols: Tensor | None,
    groups: tuple[str, ...],
) -> dict[str, Tensor]:
    """Per-query metrics ``{key: (C,) float64}`` of one chunk (``scores`` ``(C, N)``, labels on its device)."""
    C, N = scores.shape
    hierarchy = evaluator.hierarchy
    L = 1 if hierarchy is None else hierarchy.num_levels
    mask = None
    if self_cols is not None:
        mask = torch.ones(C, N, dtype=torch.bool, device=scores.device)
        mask[torch.arange(C, device=scores.device), self_cols] = False
    out: dict[str, Tensor] = {}
    level_groups = tuple(g for g in groups if METRICS[g].multilabel == "levels")
    lam = best_agreement_levels(ql, rl, hierarchy)
    if level_groups:
        ranks = rank_levels(scores, lam, L, mask, num_bins=evaluator.num_bins, counting=evaluator.counting)
        out.update(metrics_from_ranks(ranks, k_values=evaluator.k_values, groups=level_groups))
        counts = ranks.counts
    else:
        counts = level_counts(lam, L, mask)
    graded = [g for g in groups if METRICS[g].multilabel == "graded"]
    if graded:
        rel = multilabel_relevance(ql, rl, hierarchy, dtype=torch.float64)
        g_ranks, values = graded_ranks(scores, rel, mask)
        if "h_ap" in graded:
            out["h_ap"] = hap_block(g_ranks, values)
        if "ndcg" in graded:
            out["ndcg"] = ndcg_block(g_ranks, values, "exponential")
    if "mean_label_ap" in groups:
        out["mean_label_ap"] = mean_label_average_precision(scores, ql, rl, mask)
    return out | query_counts(counts)


def query_counts(counts: Tensor) -> dict[str, Tensor]:
    """The ``_``-prefixed ``(C,)`` float64 counts that ``RetrievalEvaluator._summarise`` reduces, from the
    ``(C, L + 1)`` items per level: ``_n_pos_level{h}``, the items at level ``>= L - h`` (``h = L - 1``: relevant)."""
    L = counts.shape[1] - 1
    return {f"_n_pos_level{h}": counts[:, L - h :].sum(1).double() for h in range(L)}


def evaluate_multilabel(
    evaluator: Any, query: Tensor, ql: Tensor, reference: Tensor, rl: Tensor, ref_includes_query: bool
) -> tuple[dict[str, Tensor], int, int]:
    """Per-query metrics ``{key: (Q,) float64}`` (plus ``_``-prefixed counts), ``Q`` and ``L`` of a multi-label
    evaluation of checked inputs with the settings of a :class:`~pml_suprank.metrics.RetrievalEvaluator`."""
    groups = multilabel_groups(evaluator._multilabel_metrics)
    device, dtype = evaluator._device_dtype(query)
    ql, rl = ql.to(device), rl.to(device)
    N = reference.shape[0]
    chunk = evaluator.chunk_size if evaluator.chunk_size is not None else max(16, 2**23 // max(N, 1))

    def per_chunk(i: int, s: int, e: int, scores: Tensor) -> dict[str, Tensor]:
        self_cols = torch.arange(s, e, device=device) if ref_includes_query else None
        return _chunk_metrics(evaluator, scores, ql[s:e], rl, self_cols, groups)

    per_query = evaluator._scan(query, reference.detach().to(device=device, dtype=dtype), device, chunk, per_chunk)
    return per_query, query.shape[0], 1 if evaluator.hierarchy is None else evaluator.hierarchy.num_levels
