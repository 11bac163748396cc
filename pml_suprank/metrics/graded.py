"""Exact retrieval metrics for an arbitrary graded (real-valued) pairwise relevance matrix.

The few distinct relevance values of each query (at most ``n_q · L + 1`` for the thesis' Algorithm 1,
:func:`pml_suprank.relevance.multilabel_relevance`) become levels ``1..K`` (:func:`graded_levels`), ranked by
:func:`~pml_suprank.metrics.ranks.retrieval_ranks`; the metrics are exact sums over the positions.

Equal relevance = exactly equal values; **ties are pessimistic** (less relevant first among exactly equal scores);
queries with ``Σ_k rel(k) = 0`` get ``NaN``; float64. Shapes: see :func:`graded_average_precision`.

References:
    Ramzi et al., "Hierarchical Average Precision Training for Pertinent Image Retrieval" (HAPPIER, ECCV 2022):
    H-rank Eq. 2, H-AP Eq. 3. Ramzi et al., "Optimization of Rank Losses for Image Retrieval" (SupRank, TPAMI
    2025): H-AP Eqs. 18-19, NDCG Eq. 23. E. Ramzi, PhD thesis "Robust image retrieval with deep learning",
    Sec. 4.2.2.2, Algorithm 1 (the hierarchical multi-label relevance these metrics are meant for).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .._validation import check_positive_int
from ..relevance import check_multilabel, dedupe_label_sets, ideal_dcg
from .from_ranks import ap_from_ranks
from .ranks import RetrievalRanks, check_mask, check_scores, compact_rows, rank_levels

__all__ = ["GAINS", "graded_average_precision", "graded_levels", "graded_ndcg", "mean_label_average_precision"]

GAINS = ("exponential", "linear")
GRADED_BLOCK = 2**22  # elements of the (C, N) score block processed at once


def _check_inputs(
    scores: Tensor, mask: Tensor | None, block_elements: int, relevance: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """The checked ``scores`` of the engine (``±inf`` mapped to finite, :func:`~.ranks.check_scores`) and
    ``relevance`` (if given) as float64 on their device."""
    scores = check_scores(scores)
    check_mask(mask, scores)
    check_positive_int("block_elements", block_elements)
    if relevance is None:
        return scores, None
    if not isinstance(relevance, Tensor):
        raise TypeError(f"relevance must be a torch.Tensor of shape (Q, N); got {type(relevance).__name__}")
    if relevance.is_complex():
        raise TypeError(f"relevance must be real (float, int or bool); got dtype {relevance.dtype}")
    if relevance.shape != scores.shape:
        raise ValueError(
            f"relevance must have the shape of scores {tuple(scores.shape)}; got shape {tuple(relevance.shape)}"
        )
    rel = relevance.detach().to(device=scores.device, dtype=torch.float64)
    if not bool(torch.isfinite(rel).all()) or bool((rel < 0).any()):
        raise ValueError("relevance must be finite and non-negative")
    return scores, rel


def graded_levels(relevance: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Map each query's distinct positive relevance values to levels ``1..K`` (increasing value; exactly equal values
    share a level), sorting only the relevant entries: ``O(N + P log P)`` per query.

    Args:
        relevance: ``(Q, N)`` non-negative float relevance.
        mask: optional ``(Q, N)`` bool; removed items get level 0.

    Returns:
        ``(levels, values)``: ``(Q, N)`` int64 levels (``0`` = not relevant or removed) and the ``(Q, K + 1)``
        float64 non-decreasing value of each level (``values[:, 0] = 0``; a query's largest value repeated past its
        own count), ``K`` = most distinct values of any query.
    """
    rel = relevance.to(torch.float64)
    Q, N = rel.shape
    rows, cols, slot, valid = compact_rows(rel > 0 if mask is None else (rel > 0) & mask)
    vals = torch.full(valid.shape, float("inf"), dtype=torch.float64, device=rel.device)
    vals[rows, slot] = rel[rows, cols]
    sorted_vals, perm = vals.sort(dim=1)
    new = torch.ones_like(valid)
    new[:, 1:] = sorted_vals[:, 1:] != sorted_vals[:, :-1]
    dense = (new & valid).long().cumsum(1).masked_fill_(~valid, 0)  # level of each sorted slot
    slot_level = torch.zeros_like(dense).scatter_(1, perm, dense)
    levels = torch.zeros(Q, N, dtype=torch.long, device=rel.device)
    levels[rows, cols] = slot_level[rows, slot]
    K = int(dense.max()) if dense.numel() else 0
    values = torch.zeros(Q, K + 1, dtype=torch.float64, device=rel.device)
    values.scatter_(1, dense, sorted_vals.masked_fill(~valid, 0.0))  # equal values per level: any write wins
    return levels, values.cummax(dim=1).values


def graded_ranks(scores: Tensor, rel: Tensor, mask: Tensor | None) -> tuple[RetrievalRanks, Tensor]:
    levels, values = graded_levels(rel, mask)
    ranks = rank_levels(scores, levels, max(values.shape[1] - 1, 1), mask)
    if values.shape[1] == 1:  # no relevant item anywhere: one empty level keeps the shapes consistent
        values = torch.cat([values, values], 1)
    return ranks, values


def hap_block(ranks: RetrievalRanks, values: Tensor) -> Tensor:
    """H-AP ``(C,)`` from the ranked levels and the non-decreasing value table ``(C, K + 1)``.

    ``H-rank(k) = Σ_{l ≤ λ_k} Δ_l · A_l(k)`` (``Δ_l = rel(l) − rel(l − 1)``, ``A_l(k)`` the items of level ``>= l``
    ranked at or before ``k``): one cumulative sum per level, ``O(C·P·K)`` time, ``O(C·P)`` memory.
    """
    lv = ranks.levels
    valid = lv > 0
    delta = values[:, 1:] - values[:, :-1]  # (C, K)
    h_rank = torch.zeros(lv.shape, dtype=torch.float64, device=lv.device)
    for lvl in range(1, values.shape[1]):
        ge = lv >= lvl
        if not bool(ge.any()):
            break
        h_rank.addcmul_(torch.cumsum(ge, 1, dtype=torch.float64).mul_(ge), delta[:, lvl - 1 : lvl])
    position = ranks.positions.to(torch.float64).masked_fill_(~valid, 1.0)
    num = (h_rank / position).sum(1)
    den = values.gather(1, lv).sum(1)  # values[:, 0] = 0 on padding
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), float("nan"))


def ndcg_block(ranks: RetrievalRanks, values: Tensor, gain: str) -> Tensor:
    """NDCG ``(C,)``: ``DCG = Σ_k g(rel(k)) / log2(1 + rank(k))`` over the ideal DCG of the same gallery."""
    gains = torch.pow(2.0, values) - 1.0 if gain == "exponential" else values.clone()
    lv = ranks.levels
    valid = lv > 0
    disc = 1.0 / torch.log2(1.0 + ranks.positions.to(torch.float64).clamp_min(1.0))
    dcg = (gains.gather(1, lv) * disc).masked_fill_(~valid, 0.0).sum(1)
    idcg = ideal_dcg(ranks.counts[:, 1:], gains[:, 1:])  # levels ordered by increasing gain: the ideal order
    n_rel = ranks.counts[:, 1:].sum(1)
    return torch.where(n_rel > 0, dcg / torch.where(idcg > 0, idcg, torch.ones_like(idcg)), float("nan"))


def _per_block(scores: Tensor, mask: Tensor | None, rows: int, block: Callable[..., Tensor]) -> Tensor:
    """``(Q,)`` float64 ``block(score rows, mask rows or None, row slice)`` over blocks of ``rows`` queries."""
    Q = scores.shape[0]
    rows = max(1, rows)
    out = torch.empty(Q, dtype=torch.float64, device=scores.device)
    for i in range(0, Q, rows):
        sl = slice(i, i + rows)
        out[sl] = block(scores[sl].detach(), None if mask is None else mask[sl], sl)
    return out


def graded_average_precision(
    scores: Tensor, relevance: Tensor, mask: Tensor | None = None, *, block_elements: int = GRADED_BLOCK
) -> Tensor:
    """H-AP per query ``(Q,)`` for a graded pairwise relevance matrix (HAPPIER Eqs. 2-3, SupRank Eqs. 18-19).

    ``H-AP(q) = Σ_{k: rel(k) > 0} H-rank(k) / rank(k) / Σ_k rel(k)`` with ``H-rank(k) = rel(k) + Σ_{j ranked before
    k, rel(j) > 0} min(rel(j), rel(k))`` in the pessimistic order (binary relevance: AP; ``table[level]``:
    :func:`~pml_suprank.metrics.functional.hierarchical_average_precision`). ``O(N + P log P + P·K)`` per query.

    Args:
        scores: ``(Q, N)`` floating similarities (NaN not allowed).
        relevance: ``(Q, N)`` non-negative finite relevance (float, int or bool), e.g. from
            :func:`pml_suprank.relevance.multilabel_relevance`.
        mask: optional ``(Q, N)`` bool; ``False`` removes the item from that query's gallery.
        block_elements: memory bound: queries are processed in blocks of about this many score entries.

    Returns:
        ``(Q,)`` float64; ``NaN`` for queries without relevant items.

    Raises:
        TypeError: non-tensor or non-floating ``scores``, complex ``relevance``, a non-bool ``mask``.
        ValueError: shape mismatches, NaN scores, negative or non-finite relevance, bad ``block_elements``.
    """
    scores, rel = _check_inputs(scores, mask, block_elements, relevance)
    rows = block_elements // max(scores.shape[1], 1)
    return _per_block(scores, mask, rows, lambda sc, m, sl: hap_block(*graded_ranks(sc, rel[sl], m)))


def graded_ndcg(
    scores: Tensor,
    relevance: Tensor,
    mask: Tensor | None = None,
    *,
    gain: str = "exponential",
    block_elements: int = GRADED_BLOCK,
) -> Tensor:
    """NDCG per query ``(Q,)`` for a graded pairwise relevance matrix (SupRank Eq. 23).

    ``NDCG(q) = Σ_k g(rel(k)) / log2(1 + rank(k)) / iDCG(q)`` in the pessimistic order, iDCG of the same gallery;
    ``g(r) = 2^r − 1`` (``"exponential"``, Eq. 23; integer levels give :func:`~pml_suprank.metrics.functional.ndcg`)
    or ``g(r) = r`` (``"linear"``).

    Arguments, result (``(Q,)`` float64, ``NaN`` without relevant items) and errors as
    :func:`graded_average_precision`; ``gain`` is one of :data:`GAINS` (else ``ValueError``).
    """
    scores, rel = _check_inputs(scores, mask, block_elements, relevance)
    if gain not in GAINS:
        raise ValueError(f"gain must be one of {GAINS}; got {gain!r}")
    rows = block_elements // max(scores.shape[1], 1)
    return _per_block(scores, mask, rows, lambda sc, m, sl: ndcg_block(*graded_ranks(sc, rel[sl], m), gain))


def mean_label_average_precision(
    scores: Tensor,
    query_labels: Tensor,
    ref_labels: Tensor,
    mask: Tensor | None = None,
    *,
    block_elements: int = GRADED_BLOCK,
) -> Tensor:
    """Per-label AP of multi-label retrieval, averaged over each query's labels ``(Q,)``.

    Each query label ``y`` is a binary problem (positives: items carrying ``y``, pessimistic ties); the value is the
    mean over the labels with a positive (Ramzi, PhD thesis, Sec. 6.2.1). Labels are sets (``-1`` = padding).

    Args:
        scores: ``(Q, R)`` floating similarities.
        query_labels: ``(Q, M_q)`` (or ``(Q,)``) integer labels per query, ``-1`` padding.
        ref_labels: ``(R, M_r)`` (or ``(R,)``) integer labels per gallery item, ``-1`` padding.
        mask: optional ``(Q, R)`` bool; ``False`` removes the item from that query's gallery.
        block_elements: memory bound: about this many elements per block's ``(C, R, M_r)`` comparison.

    Returns:
        ``(Q,)`` float64; ``NaN`` for queries none of whose labels has a positive.

    Raises:
        TypeError / ValueError: as :func:`graded_average_precision` for ``scores`` / ``mask``, and as
        :func:`pml_suprank.relevance.multilabel_relevance` for the labels; ``ValueError`` when the label counts do
        not match ``scores``.
    """
    scores, _ = _check_inputs(scores, mask, block_elements)
    q = dedupe_label_sets(check_multilabel("query_labels", query_labels))
    r = check_multilabel("ref_labels", ref_labels)
    if scores.shape != (q.shape[0], r.shape[0]):
        raise ValueError(
            f"scores must have shape (query_labels.shape[0], ref_labels.shape[0]) = ({q.shape[0]}, {r.shape[0]}); "
            f"got shape {tuple(scores.shape)}"
        )
    q, r = q.to(scores.device), r.to(scores.device)

    def block(sc: Tensor, m: Tensor | None, sl: slice) -> Tensor:
        qs = q[sl]
        total = torch.zeros(qs.shape[0], dtype=torch.float64, device=scores.device)
        count = torch.zeros_like(total)
        for col in range(qs.shape[1]):
            y = qs[:, col]
            positive = (r[None, :, :] == y[:, None, None]).any(2) & (y >= 0)[:, None]
            ap = ap_from_ranks(rank_levels(sc, positive.long(), 1, m))
            ok = ~torch.isnan(ap)
            total += torch.where(ok, ap, 0.0)
            count += ok
        return torch.where(count > 0, total / count.clamp_min(1), float("nan"))

    return _per_block(scores, mask, block_elements // max(r.shape[0] * r.shape[1], 1), block)
