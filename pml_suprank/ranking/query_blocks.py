"""Blocks of queries for the per-query rank kernels under a byte budget, and two ways to differentiate them.

A per-query kernel maps rows ``(scores[b], levels[b], valid[b], level_relevance[b])`` to outputs of that row only.
Large problems run in blocks of queries within :func:`block_budget_bytes`: :class:`_JacobianBlocks` for one ``(B,)``
output (forward keeps each block's ``(B, N)`` Jacobian), :class:`_BlockedRows` for ``(B, N)`` outputs (backward
recomputes one block at a time). With one block both are plain autograd.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "BLOCK_BYTES_CPU",
    "BLOCK_BYTES_MAX",
    "BLOCK_FREE_FRACTION",
    "BYTES_PER_ELEMENT",
    "ONE_BLOCK_FACTOR",
    "block_budget_bytes",
    "by_blocks",
    "query_block_rows",
]

BLOCK_BYTES_CPU = 512 << 20
"""Byte budget of one block of queries on the CPU (and on devices without a memory query)."""

BLOCK_FREE_FRACTION = 0.25
"""On CUDA: a block of queries may use this fraction of the free device memory (``torch.cuda.mem_get_info``) ..."""

BLOCK_BYTES_MAX = 8 << 30
"""... up to this many bytes."""

BYTES_PER_ELEMENT = 24
"""Bytes per ``(query, level + 1, item)`` element of a block of the hierarchical kernel with autograd (about 20
measured on the CPU, plus the window chunk's temporaries)."""

ONE_BLOCK_FACTOR = 2
"""A problem of at most ``ONE_BLOCK_FACTOR`` budgets is evaluated as one block (plain autograd)."""


def block_budget_bytes(device: torch.device | str) -> int:
    """Bytes one block of queries may use on ``device``: :data:`BLOCK_BYTES_CPU` on the CPU, on CUDA
    :data:`BLOCK_FREE_FRACTION` of the free memory capped at :data:`BLOCK_BYTES_MAX` (a host-side driver query, no
    device synchronisation)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(max(BLOCK_BYTES_CPU, min(BLOCK_BYTES_MAX, BLOCK_FREE_FRACTION * free)))
    return BLOCK_BYTES_CPU


def query_block_rows(
    num_refs: int,
    num_levels: int,
    block_elements: int | None = None,
    num_queries: int | None = None,
    device: torch.device | str = "cpu",
) -> int:
    """Queries per block: ``rows · (L + 1) · N <= block_elements`` elements, at least 1 (``None``: the device's
    :func:`block_budget_bytes` / :data:`BYTES_PER_ELEMENT`); ``num_queries`` when at most :data:`ONE_BLOCK_FACTOR`
    blocks."""
    if block_elements is None:
        budget = block_budget_bytes(device) // BYTES_PER_ELEMENT
    else:
        budget = int(block_elements)
    per_query = max(1, (int(num_levels) + 1) * int(num_refs))
    if num_queries is not None and int(num_queries) * per_query <= ONE_BLOCK_FACTOR * budget:
        return max(1, int(num_queries))
    return max(1, budget // per_query)


BlockFn = Callable[[Tensor, Tensor | None, Tensor, Tensor, int, int], tuple[Tensor, ...]]
"""``fn(scores, level_relevance, levels, valid, b0, b1)`` of the rows ``b0:b1`` → a tuple of row-indexed outputs."""


def _rows(t: Tensor | None, b0: int, b1: int) -> Tensor | None:
    return None if t is None else t[b0:b1]


def _leaf(t: Tensor | None, b0: int, b1: int, need: bool) -> Tensor | None:
    return None if t is None else t[b0:b1].detach().requires_grad_(need)


class _JacobianBlocks(torch.autograd.Function):
    """``fn`` over blocks of ``rows`` queries for ONE ``(B,)`` output: its per-row Jacobian (``(B, N)``, ``(B, L + 1)``
    for ``level_relevance``) is taken per block in forward and saved. Not twice differentiable."""

    @staticmethod
    def forward(ctx, fn, rows, scores, level_relevance, levels, valid):
        need_s = ctx.needs_input_grad[2]
        need_r = level_relevance is not None and ctx.needs_input_grad[3]
        out = scores.new_empty(scores.shape[0])
        jac_s = torch.zeros_like(scores) if need_s else None
        jac_r = torch.zeros_like(level_relevance) if need_r else None
        for b0 in range(0, scores.shape[0], rows):
            b1 = min(b0 + rows, scores.shape[0])
            with torch.enable_grad():
                s, rel = _leaf(scores, b0, b1, need_s), _leaf(level_relevance, b0, b1, need_r)
                (value,) = fn(s, rel, levels[b0:b1], valid[b0:b1], b0, b1)
                targets = [t for t, need in ((s, need_s), (rel, need_r)) if need]
                if targets and value.requires_grad:
                    got = torch.autograd.grad(value.sum(), targets, allow_unused=True)
                    for acc, g in zip([a for a in (jac_s, jac_r) if a is not None], got):
                        if g is not None:
                            acc[b0:b1] = g
            out[b0:b1] = value.detach()
        ctx.save_for_backward(jac_s, jac_r)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        jac_s, jac_r = ctx.saved_tensors
        grad_s = None if jac_s is None else jac_s * grad_out.to(jac_s.dtype)[:, None]
        grad_r = None if jac_r is None else jac_r * grad_out.to(jac_r.dtype)[:, None]
        return None, None, grad_s, grad_r, None, None


class _BlockedRows(torch.autograd.Function):
    """``fn`` over blocks of ``rows`` queries, outputs ``(B, ...)``: forward without autograd, backward re-evaluates
    and back-propagates one block at a time (the extra memory is one block's graph)."""

    @staticmethod
    def forward(ctx, fn, rows, scores, level_relevance, levels, valid):
        outs = None
        for b0 in range(0, scores.shape[0], rows):
            b1 = min(b0 + rows, scores.shape[0])
            got = fn(scores[b0:b1], _rows(level_relevance, b0, b1), levels[b0:b1], valid[b0:b1], b0, b1)
            if outs is None:  # preallocated: no list of blocks and no concatenation
                outs = [o.new_empty((scores.shape[0], *o.shape[1:])) for o in got]
            for out, o in zip(outs, got):
                out[b0:b1] = o
        ctx.save_for_backward(scores, level_relevance, levels, valid)
        ctx.fn, ctx.rows = fn, rows
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outs):
        scores, level_relevance, levels, valid = ctx.saved_tensors
        fn, rows = ctx.fn, ctx.rows
        need_rel = level_relevance is not None and ctx.needs_input_grad[3]
        grad_s = torch.zeros_like(scores) if ctx.needs_input_grad[2] else None
        grad_r = torch.zeros_like(level_relevance) if need_rel else None
        for b0 in range(0, scores.shape[0], rows):
            b1 = min(b0 + rows, scores.shape[0])
            with torch.enable_grad():
                s, rel = _leaf(scores, b0, b1, grad_s is not None), _leaf(level_relevance, b0, b1, need_rel)
                got_outs = fn(s, rel, levels[b0:b1], valid[b0:b1], b0, b1)
                outs = [(o, g[b0:b1]) for o, g in zip(got_outs, grad_outs) if o.requires_grad]
                targets = [(t, acc) for t, acc in ((s, grad_s), (rel, grad_r)) if acc is not None]
                if not outs or not targets:
                    continue
                got = torch.autograd.grad(
                    [o for o, _ in outs], [t for t, _ in targets], [g for _, g in outs], allow_unused=True
                )
            for (_, acc), g in zip(targets, got):
                if g is not None:
                    acc[b0:b1] = g
        return None, None, grad_s, grad_r, None, None


def by_blocks(
    fn: BlockFn,
    rows: int,
    scores: Tensor,
    level_relevance: Tensor | None,
    levels: Tensor,
    valid: Tensor,
    per_query_scalar: bool = False,
) -> tuple[Tensor, ...]:
    """``fn`` over all ``B`` queries: directly when they fit one block of ``rows``, else by blocks —
    :class:`_JacobianBlocks` when ``fn`` returns one ``(B,)`` output (``per_query_scalar``), :class:`_BlockedRows`
    otherwise; without autograd (no gradient needed) block by block under ``no_grad``."""
    bsz = scores.shape[0]
    if bsz <= rows:
        return fn(scores, level_relevance, levels, valid, 0, bsz)
    needs_grad = torch.is_grad_enabled() and (
        scores.requires_grad or (level_relevance is not None and level_relevance.requires_grad)
    )
    if not needs_grad:
        parts = [
            fn(scores[b0 : b0 + rows], _rows(level_relevance, b0, b0 + rows), levels[b0 : b0 + rows],
               valid[b0 : b0 + rows], b0, min(b0 + rows, bsz))
            for b0 in range(0, bsz, rows)
        ]  # fmt: skip
        return tuple(torch.cat(outs) for outs in zip(*parts))
    if per_query_scalar:
        return (_JacobianBlocks.apply(fn, rows, scores, level_relevance, levels, valid),)
    return _BlockedRows.apply(fn, rows, scores, level_relevance, levels, valid)
