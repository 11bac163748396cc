"""The one chunked window kernel of every rank surrogate, and the layouts that feed it.

Every smooth rank term of SupRank (Ramzi et al., "Optimization of Rank Losses for Image Retrieval", TPAMI 2025,
Eqs. 4, 10 and 21) and of Smooth-AP (Brown et al., ECCV 2020, Eq. 5) that cannot be summed in closed form is a sum,
for each (query ``q``, item ``i``) pair, of a step function of score differences over a window of reference items:
``out[k] = Σ_{j ∈ window(k)} f(s_{q_k j} − s_{q_k i_k})``. :func:`window_sum` evaluates it with ONE custom
:class:`torch.autograd.Function`: it visits the ``(pairs × window)`` blocks of a *layout* in chunks of about
:data:`CHUNK_SIZE` elements, and its backward visits the same blocks again and recomputes them, so nothing of size
``pairs × N`` is saved and the extra memory is one chunk.

A layout says how the pairs and their windows are laid out (where each block's differences ``t`` come from, where
its sums go, where the gradient flows); a term says what is summed (its value and its derivative times the incoming
gradient):

* :class:`PairRowsLayout` — a list of pairs against whole ``(B, N)`` score rows, with a (possibly pair-dependent)
  mask: the general :func:`pml_suprank.ranking.pairwise_step_sum`;
* :class:`QueryBlockLayout` — pairs grouped by query as a ``(B, P_max)`` matrix, whole queries broadcast against
  their ``(B, M)`` row: the flat Smooth-AP / SupAP sigmoid windows (and the hierarchical kernel's, one masked row
  per level);
* :class:`SigmoidTerm` (``σ(scale·t)``, evaluated in place on the block's own temporary) and :class:`StepTerm`
  (any step object with ``value``/``derivative``, see :mod:`pml_suprank.ranking.steps`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import Tensor

from .._precision import float32_backward

__all__ = [
    "CHUNK_SIZE",
    "PairRowsLayout",
    "QueryBlockLayout",
    "SigmoidTerm",
    "StepTerm",
    "WindowLayout",
    "WindowTerm",
    "next_below",
    "window_sum",
]

CHUNK_SIZE = 1 << 21
"""Elements of one ``(pairs × window)`` block: a few tensors of this size live at
once, e.g. 8 MB each in float32. Bounds the extra memory of every kernel; changing it changes speed, not values."""


class WindowTerm(Protocol):
    """What a window sums: ``value`` and ``derivative × grad`` of ``f(t)`` on a block (``t`` may be overwritten)."""

    differentiable: bool

    def value(self, t: Tensor, mask: Tensor | None) -> Tensor: ...

    def weighted_derivative(self, t: Tensor, mask: Tensor | None, grad: Tensor) -> Tensor: ...


class WindowLayout(Protocol):
    """Where the blocks of a window sum come from and where their sums and gradients go.

    ``inputs`` are the differentiable tensors handed to :func:`window_sum`; a block is any object the layout yields;
    ``where`` is layout-specific index data returned with a block's differences and reused to store or scatter.
    """

    def output(self, inputs: tuple[Tensor, ...]) -> Tensor: ...

    def blocks(self, inputs: tuple[Tensor, ...]) -> Iterator[Any]: ...

    def differences(self, inputs: tuple[Tensor, ...], block: Any) -> tuple[Tensor, Tensor | None, Any]: ...

    def store(self, out: Tensor, block: Any, where: Any, sums: Tensor) -> None: ...

    def grad_of(self, grad_out: Tensor, block: Any) -> Tensor: ...

    def zero_grads(self, inputs: tuple[Tensor, ...], needs: tuple[bool, ...]) -> list[Tensor | None]: ...

    def accumulate(self, grads: list[Tensor | None], block: Any, where: Any, w: Tensor) -> None: ...

    def finish(self, grads: list[Tensor | None], inputs: tuple[Tensor, ...]) -> list[Tensor | None]: ...


class SigmoidTerm:
    """``σ(scale·t)``, evaluated in place on the block's temporary ``t`` (``t = −inf`` contributes 0).

    Its derivative w.r.t. ``t`` is ``scale·σ(1 − σ)``; the mask is ignored (the layouts give ``−inf`` instead).
    """

    differentiable = True

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = float(scale)

    def value(self, t: Tensor, mask: Tensor | None) -> Tensor:
        if self.scale != 1.0:
            t = t.mul_(self.scale)
        return t.sigmoid_()

    def weighted_derivative(self, t: Tensor, mask: Tensor | None, grad: Tensor) -> Tensor:
        sig = self.value(t, mask)
        return sig.sub_(sig * sig).mul_(grad * self.scale if self.scale != 1.0 else grad)


class StepTerm:
    """A step object's ``value(t)`` and ``derivative(t)``, zero where ``mask`` is False (bool) or times ``mask``
    (float weights, no gradient into them)."""

    def __init__(self, step: Any) -> None:
        self.step = step
        self.differentiable = bool(step.differentiable)

    def value(self, t: Tensor, mask: Tensor | None) -> Tensor:
        return _masked(self.step.value(t), mask)

    def weighted_derivative(self, t: Tensor, mask: Tensor | None, grad: Tensor) -> Tensor:
        return _masked(self.step.derivative(t), mask) * grad


def _masked(values: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return values
    if mask.dtype == torch.bool:
        return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return values * mask


def next_below(x: float, dtype: torch.dtype) -> float:
    """``torch.nextafter(torch.tensor(x, dtype=dtype), -inf)`` computed on the host (no tensor, no device read):
    the largest ``dtype`` value strictly below ``x`` rounded to ``dtype``.

    The rounding is torch's: half to even, to float32 first for the 16-bit types (as ``torch.tensor`` converts a
    Python float). Zero, subnormal, overflowing and non-finite values are handed to torch itself.
    """
    if dtype == torch.float64:
        return math.nextafter(x, -math.inf)
    info = torch.finfo(dtype)
    bits = 1 - round(math.log2(info.eps))  # significand bits: 24 (float32), 11 (float16), 8 (bfloat16)
    rounded = _round_bits(_round_bits(x, 24), bits) if math.isfinite(x) else x
    if not info.tiny < abs(rounded) < info.max:
        below = torch.nextafter(torch.tensor(x, dtype=dtype), torch.tensor(-math.inf, dtype=dtype))
        return float(below)
    mant, exp = math.frexp(rounded)  # rounded = mant·2^exp, 0.5 <= |mant| < 1
    ulp = 2.0 ** (exp - bits)
    return rounded - (ulp / 2 if mant == 0.5 else ulp)  # below a positive power of two the spacing halves


def _round_bits(x: float, bits: int) -> float:
    """``x`` rounded half to even to ``bits`` significand bits (exponent range unbounded)."""
    mant, exp = math.frexp(x)
    return round(mant * 2**bits) * 2.0 ** (exp - bits)  # exact: Python rounds the float half to even


class _WindowKernel(torch.autograd.Function):
    """``out = Σ_window term(t)`` per pair over the blocks of a layout; backward recomputes the blocks."""

    @staticmethod
    def forward(ctx, layout, term, *inputs):
        out = layout.output(inputs)
        for block in layout.blocks(inputs):
            t, mask, where = layout.differences(inputs, block)
            layout.store(out, block, where, term.value(t, mask).sum(-1))
        ctx.save_for_backward(*inputs)
        ctx.layout, ctx.term = layout, term
        return out

    @staticmethod
    @float32_backward
    def backward(ctx, grad_out):
        inputs = ctx.saved_tensors
        layout, term = ctx.layout, ctx.term
        needs = tuple(ctx.needs_input_grad[2:])
        if not term.differentiable or not any(needs):
            return (None, None, *([None] * len(inputs)))
        grads = layout.zero_grads(inputs, needs)
        for block in layout.blocks(inputs):
            t, mask, where = layout.differences(inputs, block)
            layout.accumulate(grads, block, where, term.weighted_derivative(t, mask, layout.grad_of(grad_out, block)))
        return (None, None, *layout.finish(grads, inputs))


def window_sum(layout: WindowLayout, term: WindowTerm, *inputs: Tensor) -> Tensor:
    """Sum ``term`` over the windows of ``layout`` for every pair, differentiable w.r.t. ``inputs``.

    Args:
        layout: :class:`PairRowsLayout`, :class:`QueryBlockLayout` (or any
            object following :class:`WindowLayout`).
        term: :class:`SigmoidTerm` or :class:`StepTerm` (or any :class:`WindowTerm`).
        inputs: the tensors the layout reads its score differences from (those that may need a gradient).

    Returns:
        The layout's output (e.g. ``(K,)`` per pair), in the dtype of the scores. Extra memory: one block of about
        the layout's chunk size, in forward and in backward.
    """
    return _WindowKernel.apply(layout, term, *inputs)


# ------------------------------------------------------------------------------------------------ pairs × rows
class PairRowsLayout:
    """Pairs ``(q_k, i_k)`` against the whole row ``scores[q_k]`` ``(N,)``; input: ``scores`` ``(B, N)``.

    ``mask`` is a ``(B, N)`` bool/float tensor (row ``q_k`` is used) or a callable ``mask(q, i) -> (k, N)``, called
    again block by block in backward; with ``exclude_item`` the item ``i_k`` itself is dropped (by index). Blocks
    are ranges of at most ``chunk_elements / N`` pairs; output ``(K,)``.
    """

    def __init__(
        self,
        query_idx: Tensor,
        item_idx: Tensor,
        mask: Tensor | Callable[[Tensor, Tensor], Tensor],
        exclude_item: bool,
        chunk_elements: int,
    ) -> None:
        self.query_idx, self.item_idx, self.mask = query_idx, item_idx, mask
        self.exclude_item, self.chunk_elements = exclude_item, chunk_elements

    def output(self, inputs):
        return inputs[0].new_zeros(len(self.query_idx))

    def blocks(self, inputs):
        num_pairs, num_refs = len(self.query_idx), inputs[0].shape[1]
        rows = max(1, min(num_pairs, self.chunk_elements // max(num_refs, 1)))
        for start in range(0, num_pairs, rows):
            yield start, min(start + rows, num_pairs)

    def differences(self, inputs, block):
        (scores,) = inputs
        start, stop = block
        q, i = self.query_idx[start:stop], self.item_idx[start:stop]
        t = scores[q] - scores[q, i].unsqueeze(1)  # (k, N)
        m = self.mask[q] if isinstance(self.mask, Tensor) else self.mask(q, i)
        if m.dtype != torch.bool:
            m = m.to(t.dtype)
        if self.exclude_item:
            m = m.clone()
            m[torch.arange(len(q), device=m.device), i] = False if m.dtype == torch.bool else 0
        return t, m, (q, i)

    def store(self, out, block, where, sums):
        out[block[0] : block[1]] = sums

    def grad_of(self, grad_out, block):
        return grad_out[block[0] : block[1]].unsqueeze(1)

    def zero_grads(self, inputs, needs):
        return [torch.zeros_like(inputs[0]) if needs[0] else None]

    def accumulate(self, grads, block, where, w):
        q, i = where
        grads[0].index_add_(0, q, w)  # ∂/∂s_qj of step(s_qj − s_qi)
        grads[0].index_put_((q, i), -w.sum(1), accumulate=True)  # ∂/∂s_qi

    def finish(self, grads, inputs):
        return grads


# -------------------------------------------------------------------------------------- whole queries broadcast
class QueryBlockLayout:
    """``out[b, p] = Σ_j σ(Z[b, j] − z[b, p])·1[Z[b, j] − z[b, p] <= upper]``; inputs ``Z`` (B, M), ``z`` (B, P).

    ``Z`` may hold ``-inf`` (excluded items) and ``z`` ``+inf`` (padding): both contribute 0 and get no gradient.
    Rows are visited in decreasing order of their number of pairs (``order`` ``(B,)``, a device tensor, with
    ``widths`` their pair counts as host ints, non-increasing: :func:`pml_suprank.ranking.flat.group_pairs`), in
    blocks of whole queries, by broadcasting (no per-pair gather) over only the block's widest row. Every block
    shape is known on the host from ``widths``, so neither forward nor backward waits for the device. The
    differences are handed to the term as ``−inf`` outside the window (use :class:`SigmoidTerm` with scale 1: ``Z``
    and ``z`` are already divided by the temperature). Output ``(B, P)``.
    """

    def __init__(self, order: Tensor, widths: tuple[int, ...], upper: float, chunk_elements: int) -> None:
        if len(widths) != len(order) or any(a < b for a, b in zip(widths, widths[1:])):
            raise ValueError(f"widths must be {len(order)} non-increasing host ints (one per row of order)")
        self.order, self.widths, self.upper, self.chunk_elements = order, tuple(widths), float(upper), chunk_elements

    def output(self, inputs):
        return inputs[1].new_zeros(inputs[1].shape)

    def blocks(self, inputs):
        num_cols = inputs[0].shape[1]
        start, num_rows = 0, len(self.widths)
        while start < num_rows and self.widths[start] > 0:  # rows without pairs contribute nothing
            width = self.widths[start]
            stop = min(num_rows, start + max(1, self.chunk_elements // max(1, width * num_cols)))
            yield self.order[start:stop], width
            start = stop

    def differences(self, inputs, block):
        Z, z = inputs
        rows, width = block
        if not math.isfinite(self.upper):
            return Z[rows].unsqueeze(1) - z[rows, :width].unsqueeze(2), None, None  # (b, width, M)
        # −t = z − Z (exact negation); threshold_ keeps −t > nextdown(−upper), i.e. t <= upper, and sets the rest
        # to +inf (then t = −inf): bit-identical to masking t > upper, ~3× faster than a comparison + masked_fill_
        buf = z[rows, :width].unsqueeze(2) - Z[rows].unsqueeze(1)
        torch.nn.functional.threshold_(buf, next_below(-self.upper, buf.dtype), float("inf"))
        return buf.neg_(), None, None

    def store(self, out, block, where, sums):
        rows, width = block
        out[rows, :width] = sums

    def grad_of(self, grad_out, block):
        rows, width = block
        return grad_out[rows, :width].unsqueeze(2)

    def zero_grads(self, inputs, needs):
        return [torch.zeros_like(x) if need else None for x, need in zip(inputs, needs)]

    def accumulate(self, grads, block, where, w):
        rows, width = block
        if grads[0] is not None:
            grads[0][rows] = w.sum(1)
        if grads[1] is not None:
            grads[1][rows, :width] = -w.sum(2)

    def finish(self, grads, inputs):
        return grads
