"""Dense kernels of the hierarchical losses (Sup-H-AP / HAPPIER, Sup-NDCG): every (query, item, reference)
difference of a block of queries, level masks applied arithmetically, no host synchronisation.

* :func:`dense_hierarchical_ranks` — ``rank`` and ``H-rank⁺`` (SupRank Eqs. 18 and 21, HAPPIER's ``H_s^>`` of Eq. 43
  optional) of a ``(b, N)`` block; :func:`dense_hierarchical_query_ranks` — the same over all queries in blocks;
* :func:`dense_sup_hap_scores` / :func:`dense_sup_ndcg_scores` — per-query H-AP (Eq. 21) and NDCG (Eq. 24), the
  values of :mod:`pml_suprank.ranking.hierarchical`'s kernels, by one fused autograd function with explicit
  derivatives (:data:`FUSED_TEMPORARIES` ``(b, N, N)`` buffers).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .._precision import float32_backward
from .dense import DENSE_MEMORY_BUDGET, dense_block_size, query_blocks, score_differences
from .steps import HRankParams, SupRankStep

__all__ = [
    "FUSED_TEMPORARIES",
    "HIERARCHICAL_TEMPORARIES",
    "dense_hierarchical_query_ranks",
    "dense_hierarchical_ranks",
    "dense_sup_hap_scores",
    "dense_sup_ndcg_scores",
]

HIERARCHICAL_TEMPORARIES = 10  # (b, N, N) tensors of one hierarchical block (plain autograd keeps several)
# (b, N, N) float buffers alive at once in the fused kernel (a bool mask = 1/4 buffer), without / with H_s^>
FUSED_TEMPORARIES = {False: 4, True: 7}


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
    ``H-rank⁺(i) = Σ_{j: T_j ≥ 1} min(rel_i, rel_j) · H⁺(t_ij)`` (``j = i`` included), ``H⁺ = H`` or, with ``hrank``,
    ``H_s^>`` for ``T_j > T_i``; sums over valid ``j``. Arguments and returns as
    :func:`pml_suprank.ranking.hierarchical.hierarchical_ranks` for a ``(b, N)`` block. Plain autograd.
    """
    dtype = scores.dtype
    levels = levels.long()
    v = valid.to(dtype)
    positive = v * (levels > 0).to(dtype)
    t = score_differences(scores)
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
    grad = scores.requires_grad and torch.is_grad_enabled()
    run = partial(checkpoint, dense_hierarchical_ranks, use_reentrant=False) if grad else dense_hierarchical_ranks
    parts = []
    for r in query_blocks(num_queries, block):
        rel = None if level_relevance is None else level_relevance[r]
        parts.append(run(scores[r], levels[r], rel, valid[r], step, hrank))
    rank = torch.cat([p[0] for p in parts])
    return rank, None if level_relevance is None else torch.cat([p[1] for p in parts])


def _fused_block(s, levels, v, weight, step: SupRankStep, hrank: HRankParams | None, with_plus: bool):
    """Values of one query block of the fused kernel: ``(rank, rank_plus or None, H⁻' mask, H_s^>' term or None)``.

    ``rank`` (SupRank Eq. 18), ``rank_plus = Σ_j min(w_i, w_j) · H⁺(t_ij)`` (Eq. 21 with ``w`` the relevance of the
    valid items, 0 elsewhere) and the ``(b, N, N)`` derivative terms of backward: ``d[q, i, j] = [T_j < T_i] ·
    H⁻'(t_ij)`` and, with ``hrank``, ``e[q, i, j] = min(w_i, w_j) · [T_j > T_i] · H_s^>'(t_ij)``.
    """
    t = s.unsqueeze(1) - s.unsqueeze(2)  # t[q, i, j] = s_qj − s_qi
    upper = levels.unsqueeze(1) >= levels.unsqueeze(2)  # T_j ≥ T_i: Heaviside; else H⁻
    linear = t > step.delta
    sig = torch.sigmoid_(t / step.tau)
    deriv = torch.rsub(sig, 1.0).mul_(sig).mul_(1.0 / step.tau).masked_fill_(linear, step.rho).masked_fill_(upper, 0.0)
    sig.add_(t > 0, alpha=step.start)  # H⁻ on t ≤ δ
    heaviside = t >= 0
    extra = None
    rank_plus = None
    if with_plus:
        wi, wj = weight.unsqueeze(2), weight.unsqueeze(1)
        if hrank is None:
            rank_plus = torch.minimum(wi, wj).mul_(heaviside).sum(2)
        else:
            rank_plus, extra = _hrank_plus(t, levels, torch.minimum(wi, wj), heaviside, hrank)
    lin = t.mul_(step.rho).add_(step.resolved_offset - step.rho * step.delta).mul_(linear)
    mixed = sig.masked_fill_(linear, 0.0).add_(lin).masked_fill_(upper, 0.0).add_(heaviside.logical_and_(upper))
    rank = torch.baddbmm(torch.rsub(v, 1.0).unsqueeze(2), mixed, v.unsqueeze(2)).squeeze(2)
    return rank, rank_plus, deriv, extra


def _hrank_plus(t, levels, minimum, heaviside, hrank: HRankParams) -> tuple[Tensor, Tensor]:
    """``Σ_j min(w_i, w_j) · H⁺(t_ij)`` with HAPPIER's ``H_s^>`` (Eq. 43) towards ``T_j > T_i`` and its derivative
    term ``min(w_i, w_j) · [T_j > T_i] · H_s^>'(t_ij)`` (``γ`` for ``t ≤ 0``, ``ν`` where ``ν t + μ ≤ 1``, else 0)."""
    higher = levels.unsqueeze(1) > levels.unsqueeze(2)
    ramp = t * hrank.nu + hrank.mu
    nonpos = t <= 0
    value = torch.where(nonpos, t * hrank.gamma, ramp.clamp(max=1.0))
    slope = torch.where(nonpos, hrank.gamma, (ramp <= 1.0).to(t.dtype) * hrank.nu)
    h_plus = torch.where(higher, value, heaviside.to(t.dtype))
    return (minimum * h_plus).sum(2), slope.mul_(higher).mul_(minimum)


def _block_score(kind, s, levels, v, weight, norm, step, hrank, keep: bool):
    """Per-query score of a block and what backward needs: ``(score (b,), coef (b, N), coef_plus, d, e)``.

    ``∂score/∂rank = factor · coef / norm`` and ``∂score/∂rank_plus = coef_plus / norm`` (``coef_plus`` is ``None``
    without ``H_s^>``) with ``factor`` the constant :data:`_FACTOR` of the kind (the sign and the ``1 / ln 2`` of
    ``log2`` are applied once per query in backward).
    """
    rank, rank_plus, deriv, extra = _fused_block(s, levels, v, weight, step, hrank, kind == "hap")
    if kind == "hap":
        ratio = rank_plus / rank
        score = ratio.sum(1) / norm  # out of place: see _HierarchicalScores
        coef = ratio.div_(rank)  # rank⁺ / rank²
        coef_plus = None if hrank is None else rank.reciprocal()
    else:
        shifted = rank.add_(1.0)
        log_rank = torch.log2(shifted)
        ratio = weight / log_rank
        score = ratio.sum(1) / norm  # out of place: see _HierarchicalScores
        coef = ratio.div_(log_rank).div_(shifted)  # w / (log2(1 + rank)² · (1 + rank))
        coef_plus = None
    if not keep:
        deriv = extra = None
    return score, coef, coef_plus, deriv, extra


_FACTOR = {"hap": -1.0, "ndcg": -1.0 / math.log(2.0)}


def _grad_from(deriv, extra, v, coef, coef_plus) -> Tensor:
    """``∂/∂s_k = v_k (gᵀd)_k − g_k (d v)_k`` (+ the same with ``e`` and ``g⁺``, whose rows already hold ``w_j``)."""
    into = torch.bmm(coef.unsqueeze(1), deriv).squeeze(1)
    out = torch.bmm(deriv, v.unsqueeze(2)).squeeze(2)
    grad = into.mul_(v).sub_(out.mul_(coef))
    if extra is not None:
        grad += torch.bmm(coef_plus.unsqueeze(1), extra).squeeze(1) - extra.sum(2) * coef_plus
    return grad


class _HierarchicalScores(torch.autograd.Function):
    """Fused dense Sup-H-AP / Sup-NDCG per-query scores with an explicit backward: one block keeps its derivative
    terms from forward; several save ``(B, N)`` tensors only and recompute each block in backward.

    The returned score is never produced in place: dynamo of torch 2.11 drops the gradient of a custom Function's
    output that an in-place op produced (the compiled embedding gradient would be zero).
    """

    @staticmethod
    def forward(ctx, kind, block, step, hrank, scores, levels, valid, weight, norm):
        num_queries = scores.shape[0]
        single = block >= num_queries
        v = valid.to(scores.dtype)
        if single:
            score, coef, coef_plus, deriv, extra = _block_score(
                kind, scores, levels, v, weight, norm, step, hrank, keep=True
            )
        else:
            outs = [
                _block_score(kind, scores[r], levels[r], v[r], weight[r], norm[r], step, hrank, keep=False)
                for r in query_blocks(num_queries, block)
            ]
            score, coef = torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
            coef_plus = None if hrank is None else torch.cat([o[2] for o in outs])
            deriv = extra = None
        ctx.save_for_backward(scores, levels, v, weight, norm, coef, coef_plus, deriv, extra)
        ctx.kind, ctx.block, ctx.step, ctx.hrank, ctx.single = kind, block, step, hrank, single
        return score

    @staticmethod
    @float32_backward
    def backward(ctx, grad_score):
        scores, levels, v, weight, norm, coef, coef_plus, deriv, extra = ctx.saved_tensors
        g = (grad_score / norm).unsqueeze(1)
        coef_plus = None if coef_plus is None else coef_plus * g
        coef = coef * g.mul(_FACTOR[ctx.kind])
        if ctx.single:
            return None, None, None, None, _grad_from(deriv, extra, v, coef, coef_plus), None, None, None, None
        parts = []
        for r in query_blocks(scores.shape[0], ctx.block):
            *_, d, e = _block_score(
                ctx.kind, scores[r], levels[r], v[r], weight[r], norm[r], ctx.step, ctx.hrank, keep=True
            )
            parts.append(_grad_from(d, e, v[r], coef[r], None if coef_plus is None else coef_plus[r]))
        return None, None, None, None, torch.cat(parts), None, None, None, None


def _fused_scores(kind, scores, levels, weight, total, valid, step, hrank, memory_budget) -> tuple[Tensor, Tensor]:
    """``(score (B,), has_pos (B,) bool)`` of the fused kernel, ``total`` ``(B,)`` the normaliser (0: no positive)."""
    num_queries, num_refs = scores.shape
    temporaries = FUSED_TEMPORARIES[hrank is not None]
    block = dense_block_size(num_queries, num_refs, scores.element_size(), memory_budget, temporaries)
    has_pos = total > 0
    norm = torch.where(has_pos, total, 1.0)
    return _HierarchicalScores.apply(kind, block, step, hrank, scores, levels, valid, weight, norm), has_pos


def dense_sup_hap_scores(
    scores: Tensor,
    levels: Tensor,
    level_relevance: Tensor,
    valid: Tensor,
    step: SupRankStep,
    hrank: HRankParams | None = None,
    *,
    memory_budget: int = DENSE_MEMORY_BUDGET,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate H-AP (SupRank Eq. 21): the values of :func:`pml_suprank.ranking.hierarchical.sup_hap_scores`
    by the fused dense kernel.

    ``scores``, ``levels``, ``valid``: ``(B, N)``; ``level_relevance``: ``(B, L + 1)`` (``rel(0) = 0``); ``step``
    with a numeric ``offset``; ``memory_budget``: bytes of one block's :data:`FUSED_TEMPORARIES` buffers. Returns
    ``(score (B,), has_pos (B,) bool)``, score 0 where the query has no positive.
    """
    levels = levels if levels.dtype == torch.long else levels.long()
    if level_relevance.dtype != scores.dtype:
        level_relevance = level_relevance.to(scores.dtype)
    weight = torch.gather(level_relevance, 1, levels).mul_(valid)
    return _fused_scores("hap", scores, levels, weight, weight.sum(1), valid, step, hrank, memory_budget)


def dense_sup_ndcg_scores(
    scores: Tensor,
    levels: Tensor,
    num_levels: int,
    valid: Tensor,
    step: SupRankStep,
    *,
    memory_budget: int = DENSE_MEMORY_BUDGET,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate NDCG (SupRank Eqs. 23-24): the values of
    :func:`pml_suprank.ranking.hierarchical.sup_ndcg_scores` by the fused dense kernel. Returns
    ``(score (B,), has_pos (B,) bool)``.
    """
    del num_levels  # the gains 2^T − 1 need no table
    levels = levels if levels.dtype == torch.long else levels.long()
    weight = torch.exp2(levels.to(scores.dtype)).sub_(1.0).mul_(valid)  # gain of each valid item, 0 at level 0
    positions = torch.arange(2, scores.shape[1] + 2, dtype=scores.dtype, device=scores.device)
    idcg = weight.sort(1, descending=True).values.div_(torch.log2(positions)).sum(1)
    return _fused_scores("ndcg", scores, levels, weight, idcg, valid, step, None, memory_budget)
