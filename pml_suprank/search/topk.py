"""Exact top-k inner-product search in torch, chunked over queries and gallery, with a deterministic tie rule.

The result for a query ``q`` ``(D,)`` and a gallery ``G`` ``(N, D)`` is the ``k`` rows of largest ``s_j = <q, g_j>``,
by decreasing score and, **among equal scores, increasing gallery index** (a stable sort of ``-s``). Within a
gallery block, when the (k+1)-th score equals the k-th score ``t``, the items with ``s > t`` are kept and the lowest
indices with ``s == t`` complete the set; blocks are merged by a lexicographic sort on ``(-score, index)`` (exact:
every item of the global top-k is in its block's top-k). Cost: one ``(C, B)`` score block per step, ``O(Q·N·D)``
multiply-adds, no full-row sort.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["DEFAULT_BLOCK_ELEMENTS", "exact_topk", "merge_topk", "topk_lowest_index"]

#: score entries per block (``C · B``): 2^24 float32 values = 64 MiB, plus a boolean mask of the same shape
DEFAULT_BLOCK_ELEMENTS = 2**24


def topk_lowest_index(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-``k`` (``1 <= k <= B``) of each row of ``scores`` ``(C, B)``, ties broken by the lower column index:
    ``values (C, k)`` in decreasing order and ``columns (C, k)`` long (equal values in increasing column order)."""
    extra = int(k < scores.shape[1])  # one more item shows whether the k-th score is tied beyond the cut
    top_values, top_columns = torch.topk(scores, k + extra, dim=1, largest=True, sorted=True)
    columns = top_columns[:, :k]  # a view: top_columns is not read again
    # rows whose k-th score is shared by an item outside the cut: topk's choice among the tied items is arbitrary
    rows = (top_values[:, k] == top_values[:, k - 1]).nonzero().squeeze(1) if extra else None
    if rows is not None and len(rows):
        sub, sub_kth = scores[rows], top_values[rows, k - 1 : k]
        free = k - (sub > sub_kth).sum(dim=1, dtype=torch.int32)
        eq = sub == sub_kth
        keep = (sub > sub_kth) | (eq & (eq.cumsum(dim=1, dtype=torch.int32) <= free.unsqueeze(1)))
        columns[rows] = keep.nonzero()[:, 1].reshape(len(rows), k)  # columns in increasing order, exactly k per row
    return merge_topk(scores.gather(1, columns), columns, k)  # the selected set ordered by (-score, column)


def merge_topk(values: Tensor, indices: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` best ``(values (C, k), indices (C, k))`` of candidate lists ``values`` / ``indices`` ``(C, M)``
    (indices distinct within a row) by ``(-value, index)``."""
    indices, order = indices.sort(dim=1)
    values = values.gather(1, order)
    values, order = values.sort(dim=1, descending=True, stable=True)
    return values[:, :k], indices.gather(1, order)[:, :k]


def exact_topk(
    queries: Tensor,
    gallery: Tensor,
    k: int,
    *,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    progress: bool = False,
) -> tuple[Tensor, Tensor]:
    """Exact top-``k`` gallery rows of each query by inner product, ties by lower gallery index: ``queries`` ``(Q, D)``
    (on the device and in the dtype of ``gallery`` ``(N, D)``), ``1 <= k <= N``, ``block_elements`` score entries at a
    time, ``progress``: a tqdm bar. Returns ``scores (Q, k)`` and ``indices (Q, k)`` long, on ``gallery``'s device.
    """
    Q, N = queries.shape[0], gallery.shape[0]
    # up to 1024 queries per block, so that each gallery block is read from memory a few times only (the matmul
    # stays compute-bound), and gallery blocks of block_elements / q_block rows (16,384 by default)
    q_block = max(1, min(Q, 1024))
    g_block = max(k + 1, block_elements // q_block)
    # one score buffer reused by every block (allocating ~64 MiB per block costs as much as the matmul on a CPU)
    buffer = torch.empty(q_block * min(g_block, N), dtype=gallery.dtype, device=gallery.device)
    steps = range(0, Q, q_block)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="search", unit="block", leave=False)
    out_scores, out_indices = [], []
    with torch.no_grad():
        for qs in steps:
            q = queries[qs : qs + q_block]
            best_v, best_i = q.new_empty(q.shape[0], 0), torch.empty(q.shape[0], 0, dtype=torch.long, device=q.device)
            for gs in range(0, N, g_block):
                g = gallery[gs : gs + g_block]
                scores = torch.mm(q, g.T, out=buffer[: q.shape[0] * g.shape[0]].view(q.shape[0], g.shape[0]))
                v, i = topk_lowest_index(scores, min(k, g.shape[0]))
                best_v, best_i = merge_topk(torch.cat([best_v, v], 1), torch.cat([best_i, i + gs], 1), k)
            out_scores.append(best_v)
            out_indices.append(best_i)
    return torch.cat(out_scores), torch.cat(out_indices)
