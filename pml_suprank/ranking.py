"""Rank surrogates and memory-efficient rank kernels.

Step functions (pure, out-of-place, autograd-friendly):

* :func:`heaviside` — the true step ``H(t) = 1[t >= 0]`` (no gradient), used for ``rank⁺`` in SupRank.
* :func:`tau_sigmoid` — Smooth-AP's ``σ_τ(t) = 1 / (1 + exp(-t/τ))`` with the exponent clamped to ±50 like the
  reference code (Brown et al., Smooth-AP, ECCV 2020, Eq. 5).
* :func:`suprank_step` — SupRank's ``H⁻`` (Ramzi et al., SupRank, TPAMI 2025, Eq. 4): ``σ_τ(t)`` for ``t <= 0``,
  ``start + σ_τ(t)`` for ``0 < t <= δ`` and ``ρ (t − δ) + offset`` for ``t > δ``; with the default
  ``offset = σ_τ(δ) + start`` it is continuous and an upper bound of ``H`` on ``t > 0``.

Each step also exists as a small object (:class:`HeavisideStep`, :class:`SigmoidStep`, :class:`SupRankStep`)
exposing ``value(t)`` and ``derivative(t)``; the kernels use the explicit derivative so that they never keep the
``(pairs × N)`` intermediates alive for backward.

Kernel:

* :func:`pairwise_step_sum` — for a list of (query ``q``, item ``i``) pairs it returns
  ``Σ_j m[q, i, j] · step(S[q, j] − S[q, i])`` over the reference items ``j ≠ i``, where ``S`` is the ``(B, N)`` score
  matrix and ``m`` a (possibly pair-dependent) mask or weight. Time ``O(K · N)`` for ``K`` pairs, extra memory
  ``O(B · N + chunk_size)``: the forward pass and the backward pass both work on chunks of pairs and recompute
  the step values, so no ``K × N`` tensor is saved for backward (a custom :class:`torch.autograd.Function`).
  For flat AP losses ``K = Σ_q P_q`` (the positives of each query), i.e. ``O(Σ_q P_q · N)`` per step.

All functions take the device and dtype from their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ._validation import check_positive

__all__ = [
    "HeavisideStep",
    "SigmoidStep",
    "SupRankStep",
    "default_offset",
    "heaviside",
    "pairwise_step_sum",
    "suprank_step",
    "tau_sigmoid",
]

_CLAMP = 50.0  # the reference clamps -t/τ to [-50, 50] (σ_τ saturates, zero gradient beyond)
DEFAULT_CHUNK_ELEMENTS = 1 << 22  # elements of one (pairs × N) chunk: 4M floats = 16 MB in float32


def heaviside(t: Tensor) -> Tensor:
    """Heaviside step ``H(t) = 1[t >= 0]`` (``H(0) = 1``, as ``torch.heaviside(t, 1)``), without gradient.

    Args:
        t: score differences ``s_j − s_i`` of any shape.

    Returns:
        A tensor of the same shape and dtype with values in {0, 1}, detached from the graph.
    """
    return (t.detach() >= 0).to(t.dtype)


def tau_sigmoid(t: Tensor, tau: float) -> Tensor:
    """Temperature sigmoid ``σ_τ(t) = 1 / (1 + exp(clamp(−t/τ, −50, 50)))`` (Smooth-AP Eq. 5; SupRank Eq. 4).

    Args:
        t: score differences of any shape.
        tau: temperature ``τ > 0``.

    Returns:
        ``σ_τ(t)``, same shape and dtype; its gradient is zero where ``|t/τ| > 50``.
    """
    return 1.0 / (1.0 + torch.exp(torch.clamp(-t / tau, -_CLAMP, _CLAMP)))


def default_offset(tau: float, delta: float, start: float) -> float:
    """SupRank's default ``offset = σ_τ(δ) + start`` (makes ``H⁻`` continuous at ``t = δ``).

    ``σ_τ(δ)`` is evaluated on a float32 tensor as in the reference code (then ``start`` is added in double
    precision), so float64 runs reproduce its numbers to ~1e-16 instead of ~1e-10; e.g. ``τ = 0.01, δ = 0.05,
    start = 0.5`` gives 1.49330717.
    """
    d = torch.tensor([delta], dtype=torch.float32)
    return float(tau_sigmoid(d, tau)[0]) + float(start)


def suprank_step(
    t: Tensor,
    tau: float = 0.01,
    rho: float = 100.0,
    delta: float = 0.05,
    start: float = 0.5,
    offset: float | None = None,
) -> Tensor:
    """SupRank's smooth upper bound ``H⁻`` of the Heaviside step (SupRank paper Eq. 4).

    ``H⁻(t) = σ_τ(t)`` for ``t <= 0``; ``start + σ_τ(t)`` for ``0 < t <= δ``; ``ρ (t − δ) + offset`` for ``t > δ``.

    Args:
        t: score differences ``s_j − s_i`` (negative ``j`` vs positive ``i``), any shape.
        tau: sigmoid temperature ``τ``.
        rho: slope ``ρ`` of the linear branch.
        delta: margin ``δ`` where the linear branch starts.
        start: jump added on ``(0, δ]``.
        offset: value at ``t = δ⁺``; ``None`` gives ``σ_τ(δ) + start`` (continuous upper bound).

    Returns:
        ``H⁻(t)``, same shape and dtype, differentiable by autograd.
    """
    return SupRankStep(tau=tau, rho=rho, delta=delta, start=start, offset=offset).value(t)


class HeavisideStep:
    """``H(t) = 1[t >= 0]``; not differentiable (the gradient is zero)."""

    differentiable = False

    def value(self, t: Tensor) -> Tensor:
        return heaviside(t)

    def derivative(self, t: Tensor) -> Tensor:
        return torch.zeros_like(t)

    def __repr__(self) -> str:
        return "HeavisideStep()"


@dataclass(frozen=True)
class SigmoidStep:
    """Smooth-AP's ``σ_τ`` as a step object (value and explicit derivative)."""

    tau: float = 0.01
    differentiable = True

    def __post_init__(self) -> None:
        check_positive("tau", self.tau)

    def value(self, t: Tensor) -> Tensor:
        return tau_sigmoid(t, self.tau)

    def derivative(self, t: Tensor) -> Tensor:
        z = -t / self.tau
        inside = (z >= -_CLAMP) & (z <= _CLAMP)
        sig = 1.0 / (1.0 + torch.exp(torch.clamp(z, -_CLAMP, _CLAMP)))
        return torch.where(inside, sig * (1.0 - sig) / self.tau, torch.zeros_like(t))


@dataclass(frozen=True)
class SupRankStep:
    """SupRank's ``H⁻`` (paper Eq. 4) as a step object; see :func:`suprank_step` for the arguments.

    ``offset=None`` resolves to :func:`default_offset` (``σ_τ(δ) + start``) in :attr:`resolved_offset`.
    """

    tau: float = 0.01
    rho: float = 100.0
    delta: float = 0.05
    start: float = 0.5
    offset: float | None = None
    differentiable = True

    def __post_init__(self) -> None:
        check_positive("tau", self.tau)
        check_positive("rho", self.rho, strict=False)
        check_positive("delta", self.delta, strict=False)
        if isinstance(self.start, bool) or not isinstance(self.start, (int, float)) or not math.isfinite(self.start):
            raise TypeError(f"start must be a finite real number; got {self.start!r}")
        if self.offset is not None and (
            isinstance(self.offset, bool) or not isinstance(self.offset, (int, float)) or not math.isfinite(self.offset)
        ):
            raise TypeError(f"offset must be None or a finite real number; got {self.offset!r}")

    @property
    def resolved_offset(self) -> float:
        if self.offset is None:
            return default_offset(self.tau, self.delta, self.start)
        return float(self.offset)

    def value(self, t: Tensor) -> Tensor:
        sig = tau_sigmoid(t, self.tau)
        linear = self.rho * (t - self.delta) + self.resolved_offset
        return torch.where(t <= 0, sig, torch.where(t <= self.delta, sig + self.start, linear))

    def derivative(self, t: Tensor) -> Tensor:
        d_sig = SigmoidStep(self.tau).derivative(t)
        return torch.where(t <= self.delta, d_sig, torch.full_like(t, self.rho))


Step = HeavisideStep | SigmoidStep | SupRankStep
PairMask = Tensor | Callable[[Tensor, Tensor], Tensor]


def _chunk_rows(num_pairs: int, num_refs: int, chunk_elements: int) -> int:
    return max(1, min(num_pairs, chunk_elements // max(num_refs, 1)))


def _chunk_terms(scores, query_idx, item_idx, mask, exclude_item, start, stop):
    q = query_idx[start:stop]
    i = item_idx[start:stop]
    rows = scores[q]  # (k, N)
    t = rows - scores[q, i].unsqueeze(1)
    m = mask[q] if isinstance(mask, Tensor) else mask(q, i)
    if m.dtype != torch.bool:
        m = m.to(t.dtype)
    if exclude_item:
        m = m.clone()
        m[torch.arange(len(q), device=m.device), i] = False if m.dtype == torch.bool else 0
    return q, i, t, m


def _masked(values: Tensor, m: Tensor) -> Tensor:
    if m.dtype == torch.bool:
        return torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return values * m


class _PairwiseStepSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, query_idx, item_idx, mask, step, exclude_item, chunk_elements):
        num_pairs, num_refs = len(query_idx), scores.shape[1]
        out = scores.new_zeros(num_pairs)
        rows = _chunk_rows(num_pairs, num_refs, chunk_elements)
        for start in range(0, num_pairs, rows):
            stop = min(start + rows, num_pairs)
            _, _, t, m = _chunk_terms(scores, query_idx, item_idx, mask, exclude_item, start, stop)
            out[start:stop] = _masked(step.value(t), m).sum(1)
        mask_tensor = mask if isinstance(mask, Tensor) else None
        ctx.save_for_backward(scores, query_idx, item_idx, mask_tensor)
        ctx.mask_fn = None if isinstance(mask, Tensor) else mask
        ctx.step, ctx.exclude_item, ctx.chunk_elements = step, exclude_item, chunk_elements
        return out

    @staticmethod
    def backward(ctx, grad_out):
        scores, query_idx, item_idx, mask_tensor = ctx.saved_tensors
        mask = mask_tensor if ctx.mask_fn is None else ctx.mask_fn
        grad_scores = None
        if ctx.needs_input_grad[0] and ctx.step.differentiable:
            grad_scores = torch.zeros_like(scores)
            num_pairs, num_refs = len(query_idx), scores.shape[1]
            rows = _chunk_rows(num_pairs, num_refs, ctx.chunk_elements)
            for start in range(0, num_pairs, rows):
                stop = min(start + rows, num_pairs)
                q, i, t, m = _chunk_terms(scores, query_idx, item_idx, mask, ctx.exclude_item, start, stop)
                d = _masked(ctx.step.derivative(t), m) * grad_out[start:stop].unsqueeze(1)
                grad_scores.index_add_(0, q, d)  # ∂/∂s_qj of step(s_qj − s_qi)
                grad_scores.index_put_((q, i), -d.sum(1), accumulate=True)  # ∂/∂s_qi
        return grad_scores, None, None, None, None, None, None


def pairwise_step_sum(
    scores: Tensor,
    query_idx: Tensor,
    item_idx: Tensor,
    mask: PairMask,
    step: Step,
    *,
    exclude_item: bool = True,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> Tensor:
    """Sum a step function of score differences over the reference set, for a list of (query, item) pairs.

    ``out[k] = Σ_j m_k[j] · step(scores[q_k, j] − scores[q_k, i_k])`` over ``j ≠ i_k`` (when ``exclude_item``).
    This is the building block of every rank surrogate: e.g. SupAP's ``rank(i) − rank⁺(i) = Σ_{j∈N_q} H⁻(s_j − s_i)``
    (SupRank Eq. 9-11) with ``m = negatives of q`` and ``step = SupRankStep()``.

    Args:
        scores: ``(B, N)`` score matrix (query ``b`` vs reference ``j``), floating, may require grad.
        query_idx: ``(K,)`` long, the query row ``q_k`` of each pair.
        item_idx: ``(K,)`` long, the reference column ``i_k`` whose rank is computed.
        mask: either a ``(B, N)`` bool/float tensor (row ``q_k`` is used for pair ``k``; float values are weights,
            no gradient flows into them) or a callable ``mask(q, i) -> (k, N)`` for pair-dependent masks (e.g. the
            level rule of hierarchical losses: ``j`` counts iff ``level[q, j] < level[q, i]``). The callable is
            called again, chunk by chunk, in backward.
        step: a step object (:class:`HeavisideStep`, :class:`SigmoidStep`, :class:`SupRankStep`) or any object with
            ``value(t)``, ``derivative(t)`` and a ``differentiable`` attribute.
        exclude_item: drop ``j = i_k`` (by index) from the sum.
        chunk_elements: number of ``(pair, reference)`` elements processed at once; bounds the extra memory.

    Returns:
        ``(K,)`` tensor in the dtype of ``scores``; differentiable w.r.t. ``scores`` when ``step`` is. Time
        ``O(K · N)``, extra memory ``O(B · N + chunk_elements)`` in forward and backward.
    """
    if not isinstance(scores, Tensor) or scores.dim() != 2 or not scores.is_floating_point():
        raise ValueError(f"scores must be a floating tensor of shape (B, N); got {getattr(scores, 'shape', scores)}")
    for name, idx in (("query_idx", query_idx), ("item_idx", item_idx)):
        if not isinstance(idx, Tensor) or idx.dim() != 1 or idx.dtype != torch.long:
            raise ValueError(f"{name} must be a 1-D long tensor; got {getattr(idx, 'dtype', type(idx).__name__)}")
    if len(query_idx) != len(item_idx):
        raise ValueError(f"query_idx and item_idx must have the same length; got {len(query_idx)} and {len(item_idx)}")
    if isinstance(mask, Tensor) and mask.shape != scores.shape:
        raise ValueError(f"mask must have the shape of scores {tuple(scores.shape)}; got {tuple(mask.shape)}")
    if not isinstance(mask, Tensor) and not callable(mask):
        raise TypeError(f"mask must be a (B, N) tensor or a callable; got {type(mask).__name__}")
    if len(query_idx) == 0:
        return scores.sum() * 0 + scores.new_zeros(0)
    if not step.differentiable:
        with torch.no_grad():
            return _PairwiseStepSum.apply(
                scores.detach(), query_idx, item_idx, mask, step, exclude_item, chunk_elements
            )
    return _PairwiseStepSum.apply(scores, query_idx, item_idx, mask, step, exclude_item, chunk_elements)
