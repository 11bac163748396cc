"""Blocks of the exact evaluator: the gallery grouped by label path, chunks of queries ranked, blocks sized in bytes.

After the permutation by label path (:func:`label_blocks`) the items sharing a query's ``m`` coarsest labels are a
nested column slice ``[a_m, b_m)``, so levels follow from columns (no ``(Q, N)`` level matrix). :func:`chunk_ranks`
ranks a ``(C, N)`` score block or :class:`GalleryBlocks` (compiled on the CPU with numba, else the torch kernels of
:mod:`pml_suprank.metrics.ranks`); :func:`block_shape` sizes chunks and blocks for the device.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .ranks import RetrievalRanks, _compiled_available, rank_relevant_items

__all__ = [
    "CPU_CHUNK_BYTES",
    "GalleryBlocks",
    "block_counts",
    "block_shape",
    "chunk_ranks",
    "device_budget",
    "label_blocks",
]


def label_blocks(query_labels: Tensor, ref_labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Permutation of the gallery by label path and the nested slices of each query.

    Returns:
        ``perm`` ``(N,)``, ``starts`` and ``ends`` ``(Q, L)``: after ``ref[perm]`` the items agreeing with query ``q``
        on its ``m`` coarsest labels are the columns ``[starts[q, m-1], ends[q, m-1])``.
    """
    N, L = ref_labels.shape
    paths = torch.cat([ref_labels, query_labels]).flip(1)  # coarsest first
    ids = []
    prev = torch.zeros(paths.shape[0], dtype=torch.long)
    for m in range(L):
        # id of the path of the m + 1 coarsest labels: lexicographic (previous id, label), 1-D uniques only
        _, col = torch.unique(paths[:, m], return_inverse=True)
        _, prev = torch.unique(prev * (int(col.max()) + 1 if col.numel() else 1) + col, return_inverse=True)
        ids.append(prev)
    perm = torch.sort(ids[-1][:N], stable=True).indices
    starts, ends = [], []
    for inv in ids:
        g = inv[:N][perm].contiguous()
        q = inv[N:].contiguous()
        starts.append(torch.searchsorted(g, q, right=False))
        ends.append(torch.searchsorted(g, q, right=True))
    return perm, torch.stack(starts, 1), torch.stack(ends, 1)


class GalleryBlocks:
    """Scores ``(C, D)`` ``queries`` × ``(N, D)`` ``gallery`` (which stays where it is), computed on the queries'
    device in blocks of ``width`` whole columns: the scores of one ``(C, N)`` matmul."""

    def __init__(self, queries: Tensor, gallery: Tensor, width: int) -> None:
        self.queries, self.gallery, self.width = queries, gallery, width
        self.shape = (queries.shape[0], gallery.shape[0])

    def _scores(self, rows: Tensor | slice) -> Tensor:
        return torch.mm(self.queries, self.gallery[rows].to(self.queries.device, non_blocking=True).T)

    def gather(self, dim: int, col: Tensor) -> Tensor:
        """``scores.gather(1, col)`` (``dim`` must be 1) for a ``(C, P)`` ``col``, from the distinct columns only."""
        used = torch.zeros(self.shape[1], dtype=torch.bool, device=col.device)
        used[col] = True
        inv = used.cumsum(0).sub_(1)[col]  # index of each entry among the distinct columns
        cols = used.nonzero().squeeze(1).to(self.gallery.device)
        out = torch.empty(col.shape, dtype=self.queries.dtype, device=col.device)
        for u0 in range(0, cols.numel(), self.width):
            sub = self._scores(cols[u0 : u0 + self.width])
            local = inv - u0
            inside = (local >= 0) & (local < sub.shape[1])
            out = torch.where(inside, sub.gather(1, local.clamp(0, sub.shape[1] - 1)), out)
        return out

    def negatives(self, a1: Tensor, b1: Tensor) -> Iterator[Tensor]:
        """The ``(C, width)`` score blocks with the columns ``[a1[c], b1[c])`` of row ``c`` (its relevant items and
        the query itself) set to ``-inf``; only the band ``[min a1, max b1)`` of the chunk is compared."""
        lo, hi = (int(a1.min()), int(b1.max())) if a1.numel() else (0, 0)
        for r0 in range(0, self.shape[1], self.width):
            block = self._scores(slice(r0, r0 + self.width))
            c0, c1 = max(lo, r0), min(hi, r0 + block.shape[1])
            if c0 < c1:
                cols = torch.arange(c0, c1, device=block.device)
                inside = (cols >= a1[:, None]) & (cols < b1[:, None])
                block[:, c0 - r0 : c1 - r0].masked_fill_(inside, float("-inf"))
            yield block


def chunk_ranks(
    scores: Tensor | GalleryBlocks,
    starts: Tensor,
    ends: Tensor,
    self_col: Tensor | None,
    num_bins: int | None,
    workspace: dict | None = None,
    counting: str = "auto",
    P: int | None = None,
) -> RetrievalRanks:
    """Ranks of one chunk from its ``(C, N)`` score block (overwritten) or :class:`GalleryBlocks` and the ``(C, L)``
    label slices; ``P``: ``max(ends[:, 0] - starts[:, 0])`` if known on the host."""
    C, N = scores.shape
    L = starts.shape[1]
    device = starts.device
    a1, b1 = starts[:, 0], ends[:, 0]
    n_block = b1 - a1
    if P is None:
        P = int(n_block.max()) if C else 0
    if isinstance(scores, Tensor) and _fused_applies(scores, L, counting):  # reads the block, never writes it
        from ._compiled_rank_counts import block_ranks_compiled

        starts, ends = starts.contiguous(), ends.contiguous()
        sc = torch.full((C,), -1, dtype=torch.long) if self_col is None else self_col.contiguous()
        levels, positions = block_ranks_compiled(scores, starts, ends, sc, num_bins, P)
        return RetrievalRanks(levels, positions, block_counts(starts, ends, (sc >= 0).long(), N), L)

    t = torch.arange(P, device=device)
    in_block = t[None, :] < n_block[:, None]
    raw = a1[:, None] + t[None, :]  # past the block (possibly past N) on padding slots
    # level of every slot: 1 inside the block, +1 per finer nested slice containing it; 0 for padding and the query
    lev = in_block.long()
    for m in range(1, L):
        lev += (raw >= starts[:, m : m + 1]) & (raw < ends[:, m : m + 1])
    has_self = torch.zeros(C, dtype=torch.long, device=device)
    if self_col is not None:
        has_self = (self_col >= 0).long()
        lev.masked_fill_(raw == self_col[:, None], 0)
    # padding slots point at the first column of the row's block (or hold the original score of a row whose block is
    # empty), so one scatter keeps only the negatives in the score block (the query itself lies in its own block)
    col = torch.where(in_block, raw, a1.clamp_max(max(N - 1, 0))[:, None])
    rel_scores = scores.gather(1, col)
    if isinstance(scores, GalleryBlocks):
        negatives = scores.negatives(a1, b1)
    else:
        negatives = scores
        if P:
            scores.scatter_(1, col, rel_scores.masked_fill((n_block > 0)[:, None], float("-inf")))
    levels, positions = rank_relevant_items(
        negatives, rel_scores, lev, num_bins=num_bins, workspace=workspace, counting=counting, max_level=L
    )
    return RetrievalRanks(levels, positions, block_counts(starts, ends, has_self, N), L)


def _fused_applies(scores: Tensor, L: int, counting: str) -> bool:
    """Whether the fused compiled row kernels rank this block: CPU float32 scores, fewer than 64 levels (one int64
    key per item) and ``counting`` ``"compiled"``, or ``"auto"`` with numba installed."""
    if scores.device.type != "cpu" or scores.dtype != torch.float32 or L >= 63 or counting not in ("auto", "compiled"):
        return False
    return _compiled_available()


def block_counts(starts: Tensor, ends: Tensor, has_self: Tensor, N: int) -> Tensor:
    """``(C, L + 1)`` items per level from the nested label slices ``(C, L)`` (``has_self``: 1 where the query
    itself lies in the gallery and is removed)."""
    C, L = starts.shape
    ge = ends - starts - has_self[:, None]  # (C, L): items agreeing on the m coarsest labels (self removed)
    ge = torch.cat([ge, torch.zeros_like(ge[:, :1])], 1)
    counts = torch.empty(C, L + 1, dtype=torch.long, device=starts.device)
    counts[:, 1:] = ge[:, :-1] - ge[:, 1:]
    counts[:, 0] = N - has_self - ge[:, 0]
    return counts


#: work memory of one chunk on the CPU (a few hundred queries at SOP scale)
CPU_CHUNK_BYTES = 2**27
#: work bytes per score entry and per relevant slot and level of one query (accelerators: dense search, float64 sums)
_ENTRY_BYTES = {"cpu": 4, "accelerator": 32}
_SLOT_BYTES = {"cpu": 48, "accelerator": 96}
#: bytes per relevant slot with the compiled CPU kernels (key, level and position, at any number of levels)
_COMPILED_SLOT_BYTES = 24


#: queries per chunk aimed at when the gallery is streamed in column blocks
_STREAM_ROWS = 4096


def device_budget(device: torch.device) -> int:
    """Bytes of work memory of one chunk: :data:`CPU_CHUNK_BYTES` on the CPU, a quarter of the free memory clamped to
    [256 MiB, 16 GiB] on CUDA, 1 GiB on other accelerators."""
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return min(max(free // 4, 2**28), 2**34)
    return CPU_CHUNK_BYTES if device.type == "cpu" else 2**30


def _row_bytes(n_slots: int, device: torch.device, levels: int) -> tuple[int, int]:
    """``(bytes per score entry, bytes of the relevant slots)`` of one query."""
    kind = "cpu" if device.type == "cpu" else "accelerator"
    compiled = kind == "cpu" and _compiled_available()
    return _ENTRY_BYTES[kind], n_slots * (_COMPILED_SLOT_BYTES if compiled else _SLOT_BYTES[kind] * max(levels, 1)) + 1


def block_shape(
    n_ref: int,
    n_slots: int,
    device: torch.device,
    levels: int = 2,
    chunk_size: int | None = None,
    gallery_bytes: int = 0,
) -> tuple[int, int]:
    """``(queries per chunk, gallery items per block)`` of the evaluation on ``device``.

    Whole rows while ``chunk_size`` queries (default: :func:`device_budget` over one query's ``n_ref`` score entries
    and ``n_slots`` relevant slots, at least 16) fit in the budget and the gallery (``gallery_bytes``, ``0`` when
    already there) in twice that; otherwise :class:`GalleryBlocks` column blocks sized for ``chunk_size`` (default
    about :data:`_STREAM_ROWS`) queries, bounding peak device memory whatever ``n_ref``.
    """
    budget = device_budget(device)
    entry, slots = _row_bytes(n_slots, device, levels)
    rows = chunk_size or budget // (n_ref * entry + slots)
    if gallery_bytes <= 2 * budget and rows >= (1 if chunk_size else 16) and rows * (n_ref * entry + slots) <= budget:
        return rows, n_ref
    if chunk_size is None:
        cols = min(n_ref, max(16, budget // (_STREAM_ROWS * entry)))
        return max(16, budget // (cols * entry + slots)), cols
    return chunk_size, min(n_ref, max(16, (budget - chunk_size * slots) // (chunk_size * entry)))
