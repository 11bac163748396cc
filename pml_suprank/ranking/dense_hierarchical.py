"""Dense kernels of the hierarchical losses (Sup-H-AP / HAPPIER, Sup-NDCG): every (query, item, reference)
difference of a block of queries, with level masks applied arithmetically.

* :func:`dense_hierarchical_ranks` — SupRank's hierarchical ``rank`` and ``H-rank⁺`` (SupRank Eqs. 18 and 21,
  HAPPIER's ``H_s^>`` of Eq. 43 optional) for a ``(b, N)`` block;
* :func:`dense_hierarchical_query_ranks` — the same over all queries in blocks under a memory budget;
* :func:`dense_sup_hap_scores` / :func:`dense_sup_ndcg_scores` — the per-query surrogate H-AP (Eq. 21) and NDCG
  (Eq. 24), equal to :func:`pml_suprank.ranking.sup_hap_scores` / :func:`~pml_suprank.ranking.sup_ndcg_scores`.

No host synchronisation inside the kernels; device and dtype come from the inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..relevance import ideal_dcg
from .dense import DENSE_MEMORY_BUDGET, _blocks, _differences, dense_block_size
from .steps import HRankParams, SupRankStep

__all__ = [
    "HIERARCHICAL_TEMPORARIES",
    "dense_hierarchical_query_ranks",
    "dense_hierarchical_ranks",
    "dense_sup_hap_scores",
    "dense_sup_ndcg_scores",
]

HIERARCHICAL_TEMPORARIES = 10  # (b, N, N) tensors of one hierarchical block (plain autograd keeps several)


def dense_hierarchical_ranks(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor | None,
    valid: Tensor,
    step: SupRankStep,
    hrank: HRankParams | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Dense SupRank ranks and H-rank⁺ of every positive item of a block of queries (SupRank Eqs. 18 and 21).

    ``rank(i) = 1 + Σ_{j≠i, T_j ≥ T_i} H(t_ij) + Σ_{j: T_j < T_i} H⁻(t_ij)`` and
    ``H-rank⁺(i) = Σ_{j: T_j ≥ 1} min(rel_i, rel_j) · H⁺(t_ij)`` (``j = i`` included: the ``rel_i`` term), with
    ``H⁺ = H`` or, with ``hrank``, HAPPIER's ``H_s^>`` (Eq. 43) for ``T_j > T_i``; sums over valid ``j``.
    Same convention as :func:`pml_suprank.ranking.hierarchical_ranks`: ``rank = 1`` and ``H-rank⁺ = 0`` at
    non-positive or invalid items. Plain autograd; masks are arithmetic (no host synchronisation).

    Args:
        scores: ``(b, N)`` scores; ``levels``: ``(b, N)`` int levels ``T`` in ``{0..L}``; ``valid``: ``(b, N)`` bool.
        level_relevance: ``(b, L + 1)`` relevance of each level, or ``None`` (ranks only, for Sup-NDCG).
        step: SupRank's ``H⁻`` (numeric ``offset`` for a sync-free call); hrank: optional ``H_s^>``.

    Returns:
        ``(rank (b, N), rank_plus (b, N) or None)`` in the dtype of ``scores``.
    """
    dtype = scores.dtype
    levels = levels.long()
    v = valid.to(dtype)
    positive = v * (levels > 0).to(dtype)
    t = _differences(scores)
    heaviside = (t >= 0).to(dtype)
    lower = (levels.unsqueeze(1) < levels.unsqueeze(2)).to(dtype)  # [q, i, j]: T_j < T_i
    sig = torch.sigmoid(t / step.tau)
    h_minus = torch.where(
        t <= step.delta, sig + step.start * (t > 0).to(dtype), step.rho * (t - step.delta) + step.resolved_offset
    )
    mixed = heaviside + lower * (h_minus - heaviside)  # H⁻ towards less relevant items, H otherwise
    rank = 1.0 + (mixed @ v.unsqueeze(2)).squeeze(2) - v
    rank = torch.where(positive > 0, rank, torch.ones_like(rank))
    if level_relevance is None:
        return rank, None
    rel = torch.gather(level_relevance.to(dtype), 1, levels)
    weight = torch.minimum(rel.unsqueeze(2), rel.unsqueeze(1)) * positive.unsqueeze(1)
    if hrank is None:
        h_plus = heaviside
    else:
        higher = (levels.unsqueeze(1) > levels.unsqueeze(2)).to(dtype)
        h_plus = heaviside + higher * (hrank.value(t) - heaviside)
    rank_plus = (weight * h_plus).sum(2) * positive
    return rank, rank_plus


def dense_hierarchical_query_ranks(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor | None,
    valid: Tensor,
    step: SupRankStep,
    hrank: HRankParams | None = None,
    *,
    memory_budget: int = DENSE_MEMORY_BUDGET,
) -> tuple[Tensor, Tensor | None]:
    """:func:`dense_hierarchical_ranks` over all ``B`` queries in blocks that fit ``memory_budget``; with several
    blocks each one is checkpointed (recomputed in backward), so one block's temporaries are alive at a time."""
    num_queries, num_refs = scores.shape
    block = dense_block_size(num_queries, num_refs, scores.element_size(), memory_budget, HIERARCHICAL_TEMPORARIES)
    if block >= num_queries:
        return dense_hierarchical_ranks(scores, levels, level_relevance, valid, step, hrank)
    parts = []
    for r in _blocks(num_queries, block):
        rel = None if level_relevance is None else level_relevance[r]
        args = (scores[r], levels[r], rel, valid[r], step, hrank)
        grad = scores.requires_grad and torch.is_grad_enabled()
        parts.append(
            checkpoint(dense_hierarchical_ranks, *args, use_reentrant=False)
            if grad
            else dense_hierarchical_ranks(*args)
        )
    rank = torch.cat([p[0] for p in parts])
    return rank, None if level_relevance is None else torch.cat([p[1] for p in parts])


def dense_sup_hap_scores(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor,
    valid: Tensor,
    step: SupRankStep,
    hrank: HRankParams | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate H-AP (SupRank Eq. 21) by the dense kernel: the values of
    :func:`pml_suprank.ranking.sup_hap_scores`, ``Σ_{i∈Ω⁺} H-rank⁺(i) / rank(i) / Σ_j rel_j``.

    Returns:
        ``(score (B,), has_pos (B,) bool)`` (score 0 where the query has no positive).
    """
    levels = levels.long()
    rank, rank_plus = dense_hierarchical_query_ranks(scores, levels, level_relevance, valid, step, hrank)
    rel = torch.gather(level_relevance.to(scores.dtype), 1, levels) * valid.to(scores.dtype)
    norm = rel.sum(1)
    has_pos = norm > 0
    return (rank_plus / rank).sum(1) / torch.where(has_pos, norm, torch.ones_like(norm)), has_pos


def dense_sup_ndcg_scores(
    scores: Tensor, levels: Tensor, num_levels: int, valid: Tensor, step: SupRankStep
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate NDCG (SupRank Eq. 24) by the dense kernel: the values of
    :func:`pml_suprank.ranking.sup_ndcg_scores`, ``DCG_s / iDCG`` with gains ``2^l − 1``.

    Returns:
        ``(score (B,), has_pos (B,) bool)`` (score 0 where the query has no positive).
    """
    levels = levels.long()
    rank, _ = dense_hierarchical_query_ranks(scores, levels, None, valid, step)
    gains = torch.pow(2.0, torch.arange(num_levels + 1, dtype=scores.dtype, device=scores.device)) - 1.0
    positive = valid & (levels > 0)
    dcg = (gains[levels] * positive.to(scores.dtype) / torch.log2(1.0 + rank)).sum(1)
    counts = torch.zeros(levels.shape[0], num_levels + 1, dtype=torch.long, device=levels.device)
    idcg = ideal_dcg(counts.scatter_add(1, levels, valid.long()), gains)
    has_pos = positive.any(1)
    return dcg / torch.where(has_pos, idcg, torch.ones_like(idcg)), has_pos
