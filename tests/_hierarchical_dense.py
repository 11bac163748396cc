"""Dense (B × N × N) re-implementations of the hierarchical rank quantities, written directly from the definitions
(SupRank Eqs. 18-24, HAPPIER App. A.3). Used only as test oracles for the sorted-score kernels."""

from __future__ import annotations

import torch
from torch import Tensor

from pml_suprank.ranking.steps import SupRankStep


def h_s_greater(t: Tensor, nu: float = 25.0, mu: float = 0.5, gamma: float = 10.0) -> Tensor:
    """HAPPIER H_s^> with min (the paper's max is a typo): γt for t ≤ 0, min(νt + μ, 1) for t > 0."""
    return torch.where(t <= 0, gamma * t, torch.clamp(nu * t + mu, max=1.0))


def dense_ranks(scores, levels, rel_table, valid=None, step=None, hrank=None, exact=False):
    """(rank, rank_plus) (B, N) for every reference item; rank_plus uses rel = rel_table[levels]."""
    B, N = scores.shape
    step = step or {}
    valid = torch.ones(B, N, dtype=torch.bool) if valid is None else valid
    t = scores[:, None, :] - scores[:, :, None]  # t[b, i, j] = s_j - s_i
    not_i = ~torch.eye(N, dtype=torch.bool)[None]
    vj = valid[:, None, :] & not_i
    lv_i, lv_j = levels[:, :, None], levels[:, None, :]
    heav = (t >= 0).to(scores.dtype)
    h_minus = heav if exact else SupRankStep(**step).value(t)
    zero = torch.zeros((), dtype=scores.dtype)
    rank = (
        1
        + torch.where(vj & (lv_j >= lv_i), heav, zero).sum(-1)
        + torch.where(vj & (lv_j < lv_i), h_minus, zero).sum(-1)
    )
    rel = torch.gather(rel_table.to(scores.dtype), 1, levels) * valid
    w = torch.minimum(rel[:, :, None], rel[:, None, :]) * vj
    h_plus = heav if hrank is None else torch.where(lv_j > lv_i, h_s_greater(t, **hrank), heav)
    rank_plus = rel + (w * h_plus).sum(-1)
    return rank, rank_plus


def dense_hap(scores, levels, rel_table, valid=None, step=None, hrank=None, exact=False):
    """Per-query (surrogate or exact) H-AP (B,) — NaN for queries without relevant items."""
    valid = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid
    rank, rank_plus = dense_ranks(scores, levels, rel_table, valid, step, hrank, exact)
    rel = torch.gather(rel_table.to(scores.dtype), 1, levels) * valid
    pos = valid & (levels > 0)
    return torch.where(pos, rank_plus / rank, torch.zeros_like(rank)).sum(1) / rel.sum(1)


def dense_ndcg(scores, levels, num_levels, valid=None, step=None, exact=False):
    """Per-query (surrogate or exact) NDCG (B,) with gains 2^l − 1 and the ideal DCG of the same reference set."""
    valid = torch.ones_like(levels, dtype=torch.bool) if valid is None else valid
    rank, _ = dense_ranks(scores, levels, torch.zeros(levels.shape[0], num_levels + 1), valid, step, None, exact)
    gains = torch.pow(2.0, levels.to(scores.dtype)) - 1
    pos = valid & (levels > 0)
    dcg = torch.where(pos, gains / torch.log2(1 + rank), torch.zeros_like(rank)).sum(1)
    idcg = []
    for b in range(levels.shape[0]):
        g = torch.sort(gains[b][valid[b]], descending=True).values
        idcg.append((g / torch.log2(torch.arange(2, len(g) + 2, dtype=scores.dtype))).sum())
    return dcg / torch.stack(idcg)


def binary_ap(scores, positive, valid):
    """Exact AP per query with H(0) = 1 (ties counted against the item), over the valid items."""
    B, N = scores.shape
    t = scores[:, None, :] - scores[:, :, None]
    vj = valid[:, None, :] & ~torch.eye(N, dtype=torch.bool)[None]
    heav = (t >= 0) & vj
    rank = 1 + heav.sum(-1).to(scores.dtype)
    rank_plus = 1 + (heav & positive[:, None, :]).sum(-1).to(scores.dtype)
    pos = positive & valid
    return torch.where(pos, rank_plus / rank, torch.zeros((), dtype=scores.dtype)).sum(1) / pos.sum(1)
