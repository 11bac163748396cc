"""Dense rank kernels of the flat losses: every (query, item, reference) difference, blocked over queries.

The surrogate on the ``(b, N, N)`` differences ``t[q, i, j] = s_{q j} − s_{q i}`` of a block of ``b`` queries, masks
applied arithmetically (the sorted kernels of :mod:`pml_suprank.ranking.flat` touch only (query, positive) pairs):

* :func:`dense_query_ranks` — ``rank⁺`` and ``rank`` of every item of every query, SupRank's (Ramzi et al., TPAMI
  2025, Eqs. 9-10, ``H⁻`` of Eq. 4) or Smooth-AP's (Brown et al., ECCV 2020, Eqs. 5-6);
* :func:`dense_query_ap` — the per-query AP ``Σ_i P_i rank⁺_i / rank_i / max(|P|, 1)`` (Eq. 5 / Eq. 11), backward in
  closed form;
* :func:`choose_kernel` — the losses' ``kernel=`` option (:data:`KERNELS`) resolved by a per-device cost model.

Blocks of :func:`dense_block_size` queries keep the ``(b, N, N)`` temporaries within :data:`DENSE_MEMORY_BUDGET`;
several blocks are recomputed in backward. No host synchronisation (``torch.compile(fullgraph=True)``-friendly);
values equal the sorted kernels' up to rounding (1e-9 in float64). Non-positive rows get finite ranks
(``rank >= rank⁺ >= 1``) that callers weigh by zero.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._precision import float32_backward
from .._validation import check_positive_int
from .steps import SupRankStep

__all__ = [
    "CPU_DENSE_MAX_WORK",
    "CPU_FLAT_COSTS",
    "CPU_HIERARCHICAL_COSTS",
    "CPU_HIERARCHICAL_DENSE_MAX_WORK",
    "CUDA_FLAT_COSTS",
    "CUDA_HIERARCHICAL_COSTS",
    "DENSE_MEMORY_BUDGET",
    "DENSE_TEMPORARIES",
    "KERNELS",
    "KernelCosts",
    "choose_kernel",
    "dense_block_size",
    "dense_query_ap",
    "dense_query_ranks",
    "kernel_costs",
    "predicted_costs",
]

DENSE_MEMORY_BUDGET = 256 * 2**20  # bytes for one block's (b, N, N) temporaries
DENSE_TEMPORARIES = 4  # (b, N, N) tensors alive at once in a block's forward or backward (t, sig, mask/derivative, w)

KERNELS = ("auto", "dense", "sorted")


class KernelCosts(NamedTuple):
    """Fitted fwd+bwd time (ms) of one loss call (:func:`predicted_costs`)."""

    dense_ms: float
    dense_per_elem: float
    sorted_ms: float
    sorted_per_pair: float
    sorted_per_ref: float


# CUDA: fitted on the H200 grids tests/data/h200_2026-11-2{6,8}_grid.jsonl (flat: SupAP; hierarchical: Sup-H-AP,
# 2 levels); derivation in docs/performance.md.
CUDA_FLAT_COSTS = KernelCosts(1.56, 6.90e-8, 4.31, 2.22e-6, 0.0)
CUDA_HIERARCHICAL_COSTS = KernelCosts(1.71, 1.151e-7, 13.8, 5.04e-6, 3.53e-3)
# CPU: dense iff B·N² <= this (benchmarks/bench_losses.py --crossover; docs/performance.md)
CPU_DENSE_MAX_WORK = 1 << 15
# the CPU rule in the form of the cost model: dense = B·N² against sorted = the threshold (unitless)
CPU_FLAT_COSTS = KernelCosts(0.0, 1.0, float(CPU_DENSE_MAX_WORK), 0.0, 0.0)
# CPU, hierarchical: measured crossovers for 2, 3 and 4 levels; more levels keep the 4-level threshold
CPU_HIERARCHICAL_DENSE_MAX_WORK = {2: 1 << 17, 3: 1 << 19, 4: 1 << 20}
CPU_HIERARCHICAL_COSTS = KernelCosts(0.0, 1.0, float(CPU_HIERARCHICAL_DENSE_MAX_WORK[2]), 0.0, 0.0)


def kernel_costs(device: torch.device | str, levels: int = 1) -> KernelCosts:
    """The :class:`KernelCosts` of ``auto`` on ``device``'s type for a loss with ``levels`` hierarchy levels.

    ``levels = 1``: the flat constants; CPU: the threshold of :data:`CPU_HIERARCHICAL_DENSE_MAX_WORK`; accelerators
    (every non-CPU type): the 2-level constants with the size-dependent terms scaled by ``levels − 1`` (one pass of
    each kernel per level: an extrapolation, not measured).

    Raises:
        ValueError: ``levels`` not a positive int.
    """
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
        raise ValueError(f"levels must be a positive int (1 for a flat loss); got {levels!r}")
    cpu = torch.device(device).type == "cpu"
    if levels == 1:
        return CPU_FLAT_COSTS if cpu else CUDA_FLAT_COSTS
    if cpu:  # measured for 2, 3 and 4 levels
        threshold = CPU_HIERARCHICAL_DENSE_MAX_WORK[min(levels, max(CPU_HIERARCHICAL_DENSE_MAX_WORK))]
        return CPU_HIERARCHICAL_COSTS._replace(sorted_ms=float(threshold))
    costs, scale = CUDA_HIERARCHICAL_COSTS, float(levels - 1)
    return costs._replace(
        dense_per_elem=costs.dense_per_elem * scale,
        sorted_per_pair=costs.sorted_per_pair * scale,
        sorted_per_ref=costs.sorted_per_ref * scale,
    )


def predicted_costs(device: torch.device | str, num_queries: int, num_refs: int, levels: int = 1):
    """``(dense, sorted)`` predicted fwd+bwd cost of one call: ``dense = dense_ms + dense_per_elem · B·N²``,
    ``sorted = sorted_ms + sorted_per_pair · B·N + sorted_per_ref · N`` (ms on CUDA; unitless on the CPU)."""
    costs = kernel_costs(device, levels)
    b, n = float(num_queries), float(num_refs)
    dense = costs.dense_ms + costs.dense_per_elem * b * n * n
    sorted_ = costs.sorted_ms + costs.sorted_per_pair * b * n + costs.sorted_per_ref * n
    return dense, sorted_


def choose_kernel(kernel: str, device: torch.device | str, num_queries: int, num_refs: int, levels: int = 1) -> str:
    """Resolve a loss's ``kernel=`` option to ``"dense"`` or ``"sorted"``.

    ``"dense"``/``"sorted"`` are returned as given; ``"auto"`` returns the kernel of the lower
    :func:`predicted_costs` (ties to dense) for ``B = num_queries`` queries against ``N = num_refs`` items and
    ``levels`` hierarchy levels (1 for a flat loss):

    * accelerators: :data:`CUDA_FLAT_COSTS` / :data:`CUDA_HIERARCHICAL_COSTS`; e.g. in-batch B = 256 → dense,
      B = 256 vs 1,024 → sorted, B = 32 vs 1,024 → dense, anything vs 60,000 → sorted;
    * CPU: dense iff ``B·N² <= 2^15`` (flat), ``2^17 / 2^19 / 2^20`` for 2 / 3 / 4+ levels.

    Raises:
        ValueError: ``kernel`` not in :data:`KERNELS`, ``levels`` not a positive int, an unparsable ``device`` string
            or negative sizes. TypeError: ``device`` not a str / ``torch.device``, sizes not ints.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or a torch.device; got {type(device).__name__} {device!r}")
    try:
        torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"device must be a valid torch device string such as 'cpu' or 'cuda:0'; got {device!r}") from e
    check_positive_int("num_queries", num_queries, minimum=0)
    check_positive_int("num_refs", num_refs, minimum=0)
    if kernel != "auto":
        return kernel
    dense, sorted_ = predicted_costs(device, num_queries, num_refs, levels)
    return "dense" if dense <= sorted_ else "sorted"


def dense_block_size(
    num_queries: int,
    num_refs: int,
    element_size: int,
    memory_budget: int = DENSE_MEMORY_BUDGET,
    temporaries: int = DENSE_TEMPORARIES,
) -> int:
    """Queries per block ``b = clamp(⌊memory_budget / (temporaries · N² · element_size)⌋, 1, num_queries)`` so that
    ``temporaries`` tensors ``(b, N, N)`` of ``element_size`` bytes fit the budget: shapes only, no data.

    Raises:
        ValueError: a non-positive ``memory_budget`` or ``temporaries``.
    """
    if memory_budget <= 0 or temporaries <= 0:
        raise ValueError(
            f"memory_budget and temporaries must be positive; got memory_budget={memory_budget!r}, "
            f"temporaries={temporaries!r}"
        )
    per_query = temporaries * max(num_refs, 1) ** 2 * element_size
    return int(max(1, min(max(num_queries, 1), memory_budget // per_query)))


def score_differences(scores: Tensor) -> Tensor:
    """``t[q, i, j] = s_{qj} − s_{qi}``: ``(b, N) → (b, N_i, N_j)``."""
    return scores.unsqueeze(1) - scores.unsqueeze(2)


# Block kernels in column layout: masks and ranks are (b, N, 1), so every sum over j is one batched
# matrix-vector product (``baddbmm`` adds the constant part in the same op) and nothing is squeezed in between.
def _suprank_block(scores: Tensor, pos_col: Tensor, neg_col: Tensor, step: SupRankStep, keep_derivative: bool):
    """``(rank⁺ (b, N, 1), rank (b, N, 1), H⁻' (b, N, N) or None)`` of SupRank Eq. 9-10 for a query block."""
    t = score_differences(scores)
    # rank⁺ = 1 + Σ_j P_j H(t_ij) − P_i (the j = i term has t = 0, H(0) = 1)
    rank_plus = torch.baddbmm(1.0 - pos_col, (t >= 0).to(t.dtype), pos_col)
    sig = torch.sigmoid(t / step.tau)
    above = t > step.delta
    linear = t * step.rho + (step.resolved_offset - step.rho * step.delta)
    h_minus = torch.where(above, linear, torch.where(t > 0, sig + step.start, sig))  # H⁻ of Eq. 4
    rank = torch.baddbmm(rank_plus, h_minus, neg_col)
    deriv = torch.where(above, step.rho, sig * (1.0 - sig) / step.tau) if keep_derivative else None
    return rank_plus, rank, deriv


def _suprank_block_grad(deriv: Tensor, neg_col: Tensor, grad_rank: Tensor) -> Tensor:
    """``∂/∂s`` ``(b, N)`` of ``Σ g · rank``: ``N_j (gᵀ d)_j − g_j (d N)_j`` with ``d = H⁻'``, ``g = grad_rank``
    ``(b, N, 1)``."""
    into_j = (grad_rank.mT @ deriv) * neg_col.mT  # (b, 1, N)
    from_i = (deriv @ neg_col) * grad_rank  # (b, N, 1)
    return into_j.flatten(1) - from_i.flatten(1)


def _smooth_ap_block(scores: Tensor, masks: Tensor, tau: float, keep_derivative: bool):
    """``(rank⁺ (b, N, 1), rank (b, N, 1), σ_τ' (b, N, N) or None)`` of Smooth-AP Eq. 5-6; ``masks`` is
    ``(b, N, 2)`` = (positives, valid); the ``j = i`` term is ``σ(0) = 1/2`` times its mask."""
    sig = torch.sigmoid(score_differences(scores) / tau)
    ranks = torch.baddbmm(1.0 - 0.5 * masks, sig, masks)
    deriv = sig * (1.0 - sig) / tau if keep_derivative else None
    return ranks[..., :1], ranks[..., 1:], deriv


def _smooth_ap_block_grad(deriv: Tensor, masks: Tensor, grads: Tensor) -> Tensor:
    """``∂/∂s`` ``(b, N)`` of ``Σ g⁺ rank⁺ + g rank``; ``grads`` is ``(b, N, 2)`` = (g⁺, g)."""
    into_j = ((grads.mT @ deriv) * masks.mT).sum(1)  # (b, N)
    from_i = ((deriv @ masks) * grads).sum(2)
    return into_j - from_i


def _block_values(kernel: str, parameter, scores: Tensor, cols: tuple[Tensor, Tensor], keep_derivative: bool):
    """One block's ``(rank⁺, rank, derivative)``; ``cols`` = (positives, negatives or valid) as ``(b, N, 1)``."""
    if kernel == "suprank":
        return _suprank_block(scores, cols[0], cols[1], parameter, keep_derivative)
    return _smooth_ap_block(scores, torch.cat(cols, 2), parameter, keep_derivative)


def _block_grad(kernel: str, deriv: Tensor, cols, grad_plus: Tensor | None, grad_rank: Tensor) -> Tensor:
    if kernel == "suprank":
        return _suprank_block_grad(deriv, cols[1], grad_rank)
    return _smooth_ap_block_grad(deriv, torch.cat(cols, 2), torch.cat([grad_plus, grad_rank], 2))


def query_blocks(num_queries: int, block: int) -> list[slice]:
    return [slice(start, start + block) for start in range(0, num_queries, block)]


def _rows(cols: tuple[Tensor, Tensor], r: slice) -> tuple[Tensor, Tensor]:
    return cols[0][r], cols[1][r]


def _forward_blocks(ctx, kernel: str, block: int, parameter, scores: Tensor, positives: Tensor, others: Tensor):
    """``(rank⁺, rank)`` ``(B, N, 1)`` of all blocks and the masks as columns ``cols`` ``(B, N, 1)``; stores on ``ctx``
    what backward needs (the single block's derivative, or nothing of size ``(b, N, N)`` when there are several)."""
    cols = positives.unsqueeze(2), others.unsqueeze(2)
    single = block >= scores.shape[0]
    if single:
        rank_plus, rank, deriv = _block_values(kernel, parameter, scores, cols, True)
        ctx.deriv = deriv
    else:
        blocks = query_blocks(len(scores), block)
        outs = [_block_values(kernel, parameter, scores[r], _rows(cols, r), False) for r in blocks]
        rank_plus, rank = torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
        ctx.deriv = None
    ctx.kernel, ctx.block, ctx.parameter = kernel, block, parameter
    return rank_plus, rank, cols


def _backward_blocks(ctx, scores: Tensor, cols, grad_plus: Tensor | None, grad_rank: Tensor) -> Tensor:
    """``∂/∂scores`` ``(B, N)`` from the column gradients ``(B, N, 1)`` of rank⁺ (smooth-AP only) and rank."""
    if ctx.deriv is not None:
        return _block_grad(ctx.kernel, ctx.deriv, cols, grad_plus, grad_rank)
    parts = []
    for r in query_blocks(scores.shape[0], ctx.block):
        _, _, deriv = _block_values(ctx.kernel, ctx.parameter, scores[r], _rows(cols, r), True)
        plus = None if grad_plus is None else grad_plus[r]
        parts.append(_block_grad(ctx.kernel, deriv, _rows(cols, r), plus, grad_rank[r]))
    return torch.cat(parts)


class _DenseRanks(torch.autograd.Function):
    """Blocked dense ranks ``(B, N)``: values per query block without a graph; gradients from the explicit
    derivative (kept from forward with one block, recomputed per block in backward with several)."""

    @staticmethod
    def forward(ctx, kernel, block, parameter, scores, positives, others):
        rank_plus, rank, cols = _forward_blocks(ctx, kernel, block, parameter, scores, positives, others)
        ctx.save_for_backward(scores, *cols)
        if kernel == "suprank":
            ctx.mark_non_differentiable(rank_plus)
        return rank_plus.flatten(1), rank.flatten(1)

    @staticmethod
    @float32_backward
    def backward(ctx, grad_plus, grad_rank):
        scores, *cols = ctx.saved_tensors
        grad_rank = torch.zeros_like(scores) if grad_rank is None else grad_rank
        if ctx.kernel == "smooth_ap":
            grad_plus = (torch.zeros_like(scores) if grad_plus is None else grad_plus).unsqueeze(2)
        else:
            grad_plus = None  # rank⁺ has no gradient (Heaviside)
        grad_scores = _backward_blocks(ctx, scores, cols, grad_plus, grad_rank.unsqueeze(2))
        return None, None, None, grad_scores, None, None


class _DenseAP(torch.autograd.Function):
    """Per-query AP ``(B,)`` from the blocked dense ranks; backward in closed form: ``∂AP/∂rank_i =
    −P_i rank⁺_i / rank_i² / n`` and (Smooth-AP) ``∂AP/∂rank⁺_i = P_i / rank_i / n``."""

    @staticmethod
    def forward(ctx, kernel, block, parameter, scores, positives, others):
        ctx.set_materialize_grads(False)
        rank_plus, rank, cols = _forward_blocks(ctx, kernel, block, parameter, scores, positives, others)
        ratio = rank_plus / rank  # (B, N, 1)
        count = positives.sum(1)
        norm = count.clamp_min(1.0)
        ap = (ratio * cols[0]).sum((1, 2)) / norm
        ctx.save_for_backward(scores, *cols, ratio, rank, norm)
        ctx.mark_non_differentiable(count)
        return ap, count

    @staticmethod
    @float32_backward
    def backward(ctx, grad_ap, _grad_count):
        scores, pos_col, other_col, ratio, rank, norm = ctx.saved_tensors
        if grad_ap is None:
            return None, None, None, None, None, None
        cols = pos_col, other_col
        weight = pos_col * (grad_ap / norm).view(-1, 1, 1) / rank  # g · P_i / (n · rank_i), (B, N, 1)
        if ctx.kernel == "suprank":  # ∂/∂rank = −weight · ratio; the map to ∂/∂scores is linear in it
            grad_scores = -_backward_blocks(ctx, scores, cols, None, weight * ratio)
        else:
            grad_scores = _backward_blocks(ctx, scores, cols, weight, -weight * ratio)
        return None, None, None, grad_scores, None, None


def _blocked_apply(function, kernel: str, scores: Tensor, positives: Tensor, others: Tensor, parameter, budget: int):
    """Check a dense call (shapes and dtypes only: nothing is read from the device) and run ``function``."""
    if kernel not in ("suprank", "smooth_ap"):
        raise ValueError(f"kernel must be 'suprank' or 'smooth_ap'; got {kernel!r}")
    if not isinstance(scores, Tensor) or scores.dim() != 2 or not scores.is_floating_point():
        raise ValueError(f"scores must be a (B, N) floating tensor; got {_describe(scores)}")
    for name, mask in (("positives", positives), ("others", others)):
        if not isinstance(mask, Tensor) or mask.shape != scores.shape or mask.dtype != scores.dtype:
            raise ValueError(
                f"{name} must be a float mask of the shape and dtype of scores {tuple(scores.shape)} {scores.dtype}; "
                f"got {_describe(mask)}"
            )
    block = dense_block_size(*scores.shape, scores.element_size(), budget)
    return function.apply(kernel, block, parameter, scores, positives, others)


def _describe(x) -> str:
    return f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__


def dense_query_ranks(
    kernel: str,
    scores: Tensor,
    positives: Tensor,
    others: Tensor,
    parameter: SupRankStep | float,
    *,
    memory_budget: int = DENSE_MEMORY_BUDGET,
) -> tuple[Tensor, Tensor]:
    """``(rank⁺, rank)`` ``(B, N)`` of every query, in blocks of :func:`dense_block_size` queries.

    SupRank: ``rank⁺_i = 1 + Σ_{j≠i} P_j H(s_j − s_i)`` (``H(0) = 1``, no gradient) and ``rank_i = rank⁺_i + Σ_j N_j
    H⁻(s_j − s_i)``; Smooth-AP: ``1 + Σ_{j≠i} P_j σ_τ(s_j − s_i)`` and ``1 + Σ_{j≠i} V_j σ_τ(s_j − s_i)``. Extra
    memory: one block's temporaries, forward and backward.

    Args:
        kernel: ``"suprank"`` (``others`` = negatives mask, ``parameter`` = the :class:`SupRankStep`, with a
            numeric ``offset`` for a sync-free call) or ``"smooth_ap"`` (``others`` = valid mask, ``parameter`` =
            ``τ``).
        scores: ``(B, N)`` scores; ``positives``/``others``: ``(B, N)`` float masks in the dtype of ``scores``
            (no gradient flows into them).
        memory_budget: bytes for one block's temporaries (see :func:`dense_block_size`).

    Returns:
        ``(rank_plus (B, N), rank (B, N))``; for ``"suprank"`` ``rank_plus`` carries no gradient.

    Raises:
        ValueError: unknown ``kernel``, or masks whose shape / dtype differ from those of ``scores``.
    """
    return _blocked_apply(_DenseRanks, kernel, scores, positives, others, parameter, memory_budget)


def dense_query_ap(
    kernel: str,
    scores: Tensor,
    positives: Tensor,
    others: Tensor,
    parameter: SupRankStep | float,
    *,
    memory_budget: int = DENSE_MEMORY_BUDGET,
) -> tuple[Tensor, Tensor]:
    """Per-query surrogate AP ``(B,)`` and positive count ``(B,)``: SupAP (SupRank Eq. 11) or Smooth-AP (Eq. 5),
    ``AP_q = Σ_i P[q, i] · rank⁺[q, i] / rank[q, i] / max(|P_q|, 1)`` (0 for a query without positives).

    Same blocking, memory, arguments and ``ValueError`` as :func:`dense_query_ranks`; backward straight to scores.
    Returns ``(ap (B,), count (B,))``; ``count`` (float) carries no gradient.
    """
    return _blocked_apply(_DenseAP, kernel, scores, positives, others, parameter, memory_budget)
