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

* :func:`suprank_negative_sum`, :func:`heaviside_positive_count`, :func:`sigmoid_rank_sums` — the fast kernels of the
  flat losses: the Heaviside and linear branches come from sorted per-query thresholds + ``searchsorted`` + suffix
  sums (``O(B·N log P)``), only the sigmoid window is evaluated per (pair, reference) element, in chunks, by a
  custom autograd function (:func:`sigmoid_window_sum`) that recomputes it in backward.
* :func:`pairwise_step_sum` — the general kernel: for a list of (query ``q``, item ``i``) pairs it returns
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
    "count_above",
    "default_offset",
    "group_positions",
    "heaviside",
    "heaviside_positive_count",
    "pairwise_step_sum",
    "sigmoid_rank_sums",
    "sigmoid_window_sum",
    "suprank_negative_sum",
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


# ----------------------------------------------------------------------------------------------------------------
# Fast kernels for flat losses: sorted thresholds (prefix sums) for the Heaviside / linear branches, and a chunked
# sigmoid-window kernel. Extra memory O(B·N + chunk), time O(B·N log P + K·N) with few passes over the K·N elements.
# ----------------------------------------------------------------------------------------------------------------
def group_positions(query_idx: Tensor, num_queries: int) -> tuple[Tensor, Tensor, int]:
    """Pairs grouped by query (non-decreasing ``query_idx``) → ``(counts (B,), position in group (K,), max count)``."""
    if len(query_idx) > 1 and bool((query_idx[1:] < query_idx[:-1]).any()):
        raise ValueError("query_idx must be grouped by query (non-decreasing), e.g. from torch.nonzero(mask)")
    counts = torch.bincount(query_idx, minlength=num_queries)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(len(query_idx), device=query_idx.device) - starts[query_idx]
    return counts, pos, int(counts.max()) if len(counts) else 0


def count_above(
    scores: Tensor,
    query_idx: Tensor,
    thresholds: Tensor,
    *,
    inclusive: bool = False,
    with_sum: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per pair ``k``: how many items of row ``q_k`` score above ``thresholds[k]`` (and the sum of their scores).

    ``count_k = #{j : scores[q_k, j] > thresholds[k]}`` (``>=`` when ``inclusive``) and, with ``with_sum``,
    ``sum_k = Σ_j scores[q_k, j]`` over the same items — differentiable w.r.t. ``scores`` and accumulated in
    float64 (float32 on MPS) so that ``sum_k − count_k·x`` does not cancel catastrophically in float32.
    Excluded items must be ``-inf`` in ``scores`` (they count for no threshold and get no gradient). Pairs must be
    grouped by query (``query_idx`` non-decreasing). Cost: ``O(B·N log P + K log P)`` via sorted thresholds +
    ``searchsorted`` + a histogram with suffix sums; no ``K × N`` tensor.

    Returns:
        ``(count (K,) in the dtype of scores, sum (K,) float64 or None)``.
    """
    num_queries = scores.shape[0]
    _, pos, width = group_positions(query_idx, num_queries)
    padded = thresholds.new_full((num_queries, max(width, 1)), float("inf"))
    padded[query_idx, pos] = thresholds.detach()
    sorted_t, order = torch.sort(padded, dim=1)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order).contiguous())
    pair_rank = rank[query_idx, pos]
    # bucket b_j = number of thresholds below s_j (strictly, or <= when inclusive); -inf items land in bucket 0,
    # which no threshold's suffix sum includes
    bucket = torch.searchsorted(sorted_t, scores.detach().contiguous(), right=inclusive)
    ones = torch.ones((), dtype=scores.dtype, device=scores.device).expand(bucket.shape)
    hist = scores.new_zeros(num_queries, sorted_t.shape[1] + 1).scatter_add_(1, bucket, ones)
    count = hist.flip(1).cumsum(1).flip(1)[query_idx, pair_rank + 1]
    total = None
    if with_sum:
        acc = torch.float32 if scores.device.type == "mps" else torch.float64  # MPS has no float64
        hist_sum = torch.zeros(num_queries, sorted_t.shape[1] + 1, dtype=acc, device=scores.device)
        hist_sum = hist_sum.scatter_add(1, bucket, scores.to(acc))
        total = hist_sum[:, 1:].flip(1).cumsum(1).flip(1)[query_idx, pair_rank]
    return count, total


class _SigmoidWindowSum(torch.autograd.Function):
    """``out[b, p] = Σ_j σ(Z[b, j] − z[b, p])·1[Z[b, j] − z[b, p] <= upper]``, ``Z`` ``(B, M)``, ``z`` ``(B, P)``.

    ``Z`` may hold ``-inf`` (excluded items) and ``z`` ``+inf`` (padding): both contribute 0 and get no gradient.
    Rows are visited in decreasing order of their number of pairs (``widths``), in chunks of whole queries, by
    broadcasting (no per-pair gather) over only the chunk's widest row; recomputed in backward.
    """

    @staticmethod
    def _chunks(z, widths, chunk_elements, num_cols):
        order = torch.argsort(widths, descending=True, stable=True)
        sorted_widths = widths[order].tolist()
        start, num_rows = 0, len(sorted_widths)
        while start < num_rows and sorted_widths[start] > 0:  # rows without pairs contribute nothing
            width = sorted_widths[start]
            stop = min(num_rows, start + max(1, chunk_elements // max(1, width * num_cols)))
            yield order[start:stop], width
            start = stop

    @staticmethod
    def _chunk(Z, z, upper, rows, width):
        if not math.isfinite(upper):
            return (Z[rows].unsqueeze(1) - z[rows, :width].unsqueeze(2)).sigmoid_()  # (b, width, M)
        # −t = z − Z (exact negation); threshold_ keeps −t > nextdown(−upper), i.e. t <= upper, and sets the rest
        # to +inf (σ(−inf) = 0): bit-identical to masking t > upper, ~3× faster than a comparison + masked_fill_
        buf = z[rows, :width].unsqueeze(2) - Z[rows].unsqueeze(1)
        neg_inf = torch.tensor(float("-inf"), dtype=buf.dtype)
        below = float(torch.nextafter(torch.tensor(-upper, dtype=buf.dtype), neg_inf))
        torch.nn.functional.threshold_(buf, below, float("inf"))
        return buf.neg_().sigmoid_()

    @staticmethod
    def forward(ctx, Z, z, widths, upper, chunk_elements):
        out = z.new_zeros(z.shape)
        for rows, width in _SigmoidWindowSum._chunks(z, widths, chunk_elements, Z.shape[1]):
            out[rows, :width] = _SigmoidWindowSum._chunk(Z, z, upper, rows, width).sum(2)
        ctx.save_for_backward(Z, z, widths)
        ctx.upper, ctx.chunk_elements = upper, chunk_elements
        return out

    @staticmethod
    def backward(ctx, grad_out):
        Z, z, widths = ctx.saved_tensors
        grad_Z = torch.zeros_like(Z) if ctx.needs_input_grad[0] else None
        grad_z = torch.zeros_like(z) if ctx.needs_input_grad[1] else None
        for rows, width in _SigmoidWindowSum._chunks(z, widths, ctx.chunk_elements, Z.shape[1]):
            sig = _SigmoidWindowSum._chunk(Z, z, ctx.upper, rows, width)
            d = sig.sub_(sig * sig)  # σ(1 − σ), zero outside the window
            d.mul_(grad_out[rows, :width].unsqueeze(2))
            if grad_Z is not None:
                grad_Z[rows] = d.sum(1)
            if grad_z is not None:
                grad_z[rows, :width] = -d.sum(2)
        return grad_Z, grad_z, None, None, None


def sigmoid_window_sum(
    Z: Tensor,
    query_idx: Tensor,
    z_item: Tensor,
    upper: float = float("inf"),
    *,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> Tensor:
    """``out[k] = Σ_j σ(Z[q_k, j] − z_item[k])`` over the ``j`` with ``Z[q_k, j] − z_item[k] <= upper``.

    ``Z`` is a ``(B, M)`` matrix of scores divided by the temperature, with ``-inf`` at excluded entries (they
    contribute 0 and get no gradient); pairs must be grouped by query. A custom autograd function: the pairs are laid
    out as a ``(B, P_max)`` matrix and whole queries are processed in chunks by broadcasting, recomputed in
    backward, so the extra memory is ``O(B·M + chunk_elements)`` and nothing of size ``K × M`` is saved.
    """
    num_queries = Z.shape[0]
    counts, pos, width = group_positions(query_idx, num_queries)
    z = z_item.new_full((num_queries, max(width, 1)), float("inf")).index_put((query_idx, pos), z_item)
    out = _SigmoidWindowSum.apply(Z, z, counts, float(upper), chunk_elements)
    return out[query_idx, pos]


def suprank_negative_sum(
    scores: Tensor,
    query_idx: Tensor,
    item_idx: Tensor,
    negatives: Tensor,
    step: SupRankStep,
    *,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> Tensor:
    """``Σ_{j : negatives[q_k, j]} H⁻(s_{q_k j} − s_{q_k i_k})`` for every pair ``k`` (SupRank Eq. 4 and 10).

    Split by branch: ``t <= δ`` → ``σ_τ(t)`` evaluated in a chunked window kernel (:func:`sigmoid_window_sum`);
    ``0 < t <= δ`` → ``start`` times a count; ``t > δ`` → ``ρ (Σ s_j − C (s_i + δ)) + offset·C`` from sorted
    thresholds and suffix sums (:func:`count_above`). Same value as ``pairwise_step_sum(..., SupRankStep)`` (up to
    rounding and the ``±50`` sigmoid clamp, < 1e-20 per term) at a fraction of the passes over ``K × N``.
    Pairs must be grouped by query. Returns ``(K,)`` in the dtype of ``scores``.
    """
    s_item = scores[query_idx, item_idx]
    s_neg = scores.masked_fill(~negatives, float("-inf"))
    window = sigmoid_window_sum(
        s_neg / step.tau, query_idx, s_item / step.tau, step.delta / step.tau, chunk_elements=chunk_elements
    )
    if step.start != 0.0:
        # one histogram for both threshold sets: s_i (t > 0) and s_i + δ (t > δ)
        k = len(query_idx)
        both_q = torch.cat([query_idx, query_idx]).sort(stable=True)
        order = both_q.indices
        counts, sums = count_above(s_neg, both_q.values, torch.cat([s_item, s_item + step.delta])[order], with_sum=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(2 * k, device=order.device)
        above_zero, above_delta, sum_above = counts[inverse[:k]], counts[inverse[k:]], sums[inverse[k:]]
        total = window + step.start * (above_zero - above_delta)
    else:
        above_delta, sum_above = count_above(s_neg, query_idx, s_item + step.delta, with_sum=True)
        total = window
    acc = sum_above.dtype
    linear = step.rho * (sum_above - above_delta.to(acc) * (s_item.to(acc) + step.delta))
    return total + (linear + step.resolved_offset * above_delta.to(acc)).to(scores.dtype)


def heaviside_positive_count(scores: Tensor, query_idx: Tensor, item_idx: Tensor, positives: Tensor) -> Tensor:
    """``Σ_{j∈P_q, j≠i} H(s_j − s_i)`` per pair (``H(0) = 1``), without gradient; ``O(B·N log P)``."""
    with torch.no_grad():
        num_queries = scores.shape[0]
        _, pos, width = group_positions(query_idx, num_queries)
        s_item = scores[query_idx, item_idx].detach()
        pos_scores = s_item.new_full((num_queries, max(width, 1)), float("-inf")).index_put((query_idx, pos), s_item)
        count, _ = count_above(pos_scores, query_idx, s_item, inclusive=True)
        return count - 1.0  # the item itself (s_i >= s_i)


def sigmoid_rank_sums(
    scores: Tensor,
    query_idx: Tensor,
    item_idx: Tensor,
    positives: Tensor,
    valid: Tensor,
    tau: float,
    *,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """Smooth-AP sums per pair: ``(Σ_{j∈P_q, j≠i} σ_τ(s_j − s_i), Σ_{j∈V_q, j≠i} σ_τ(s_j − s_i))``.

    The positive sum runs over a ``(B, P_max)`` padded matrix of positive scores, the full sum over ``(B, N)``;
    ``j = i`` contributes exactly ``σ(0) = 1/2`` and is subtracted. Pairs must be grouped by query and ``i`` must be
    a positive.
    """
    num_queries = scores.shape[0]
    _, pos, width = group_positions(query_idx, num_queries)
    s_item = scores[query_idx, item_idx]
    z_item = s_item / tau
    pos_scores = scores.new_full((num_queries, max(width, 1)), float("-inf"))
    pos_scores = pos_scores.index_put((query_idx, pos), z_item)
    pos_sum = sigmoid_window_sum(pos_scores, query_idx, z_item, chunk_elements=chunk_elements) - 0.5
    all_sum = sigmoid_window_sum(
        scores.masked_fill(~valid, float("-inf")) / tau, query_idx, z_item, chunk_elements=chunk_elements
    )
    return pos_sum, all_sum - 0.5
