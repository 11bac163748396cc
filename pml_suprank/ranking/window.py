"""The one chunked sigmoid window kernel of the rank surrogates.

Every smooth rank term of SupRank (Ramzi et al., TPAMI 2025, Eqs. 4, 10 and 21) and of Smooth-AP (Brown et al., ECCV
2020, Eq. 5) without a closed form is, per (query ``q``, item ``i``) pair, a sigmoid summed over a window of reference
items, ``out[k] = Σ_{j: t <= upper} σ(scale·t)`` with ``t = s_{q_k j} − s_{q_k i_k}``. :func:`window_sum` evaluates
it over blocks of about :data:`CHUNK_SIZE` elements, recomputed in backward: the extra memory is one chunk.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._precision import float32_backward

__all__ = ["CHUNK_SIZE", "next_below", "window_sum"]

CHUNK_SIZE = 1 << 21
"""Elements of one ``(pairs × window)`` block (8 MB per float32 temporary). Changes speed and memory, not values."""


def next_below(x: float, dtype: torch.dtype) -> float:
    """``torch.nextafter(torch.tensor(x, dtype=dtype), -inf)`` computed on the host (no device read), rounding as
    torch's (half to even, through float32 for the 16-bit types)."""
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


def _blocks(widths: tuple[int, ...], order: Tensor, num_cols: int, chunk_elements: int):
    """``(rows, width)`` blocks of whole queries by decreasing pair count; rows without pairs are skipped."""
    start, num_rows = 0, len(widths)
    while start < num_rows and widths[start] > 0:
        width = widths[start]
        stop = min(num_rows, start + max(1, chunk_elements // max(1, width * num_cols)))
        yield order[start:stop], width
        start = stop


def _sigmoid_block(Z: Tensor, z: Tensor, rows: Tensor, width: int, upper: float, scale: float) -> Tensor:
    """``σ(scale·t)`` ``(b, width, M)`` of a block, ``t = Z[b, j] − z[b, p]``, 0 (``t = −inf``) where ``t > upper``."""
    if not math.isfinite(upper):
        t = Z[rows].unsqueeze(1) - z[rows, :width].unsqueeze(2)
    else:
        # −t = z − Z (exact negation); threshold_ keeps −t > nextdown(−upper), i.e. t <= upper, and sets the rest
        # to +inf (then t = −inf): bit-identical to masking t > upper, ~3× faster than a comparison + masked_fill_
        t = z[rows, :width].unsqueeze(2) - Z[rows].unsqueeze(1)
        torch.nn.functional.threshold_(t, next_below(-upper, t.dtype), float("inf"))
        t = t.neg_()
    if scale != 1.0:
        t = t.mul_(scale)
    return t.sigmoid_()


class _WindowKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, order, widths, upper, scale, chunk_elements, Z, z):
        out = z.new_zeros(z.shape)
        blocks = list(_blocks(widths, order, Z.shape[1], chunk_elements))
        for rows, width in blocks:
            out[rows, :width] = _sigmoid_block(Z, z, rows, width, upper, scale).sum(-1)
        ctx.save_for_backward(Z, z)
        ctx.blocks, ctx.upper, ctx.scale = blocks, upper, scale
        return out

    @staticmethod
    @float32_backward
    def backward(ctx, grad_out):
        Z, z = ctx.saved_tensors
        need_Z, need_z = ctx.needs_input_grad[5:]
        grad_Z = torch.zeros_like(Z) if need_Z else None
        grad_z = torch.zeros_like(z) if need_z else None
        for rows, width in ctx.blocks if need_Z or need_z else ():
            sig = _sigmoid_block(Z, z, rows, width, ctx.upper, ctx.scale)
            g = grad_out[rows, :width].unsqueeze(2)
            w = sig.sub_(sig * sig).mul_(g * ctx.scale if ctx.scale != 1.0 else g)  # ∂/∂t times the gradient
            if grad_Z is not None:
                grad_Z[rows] = w.sum(1)
            if grad_z is not None:
                grad_z[rows, :width] = -w.sum(2)
        return None, None, None, None, None, grad_Z, grad_z


def window_sum(
    Z: Tensor, z: Tensor, order: Tensor, widths: tuple[int, ...], upper: float, chunk_elements: int, scale: float = 1.0
) -> Tensor:
    """``out[b, p] = Σ_j σ(scale·t)·1[t <= upper]``, ``t = Z[b, j] − z[b, p]``: ``(B, P)`` from ``Z`` ``(B, M)`` and
    ``z`` ``(B, P)``, differentiable w.r.t. both.

    ``Z`` may hold ``-inf`` (excluded items) and ``z`` ``+inf`` (padding): both contribute 0 and get no gradient.
    Rows are visited by decreasing pair count (``order`` ``(B,)``; ``widths``: its counts as non-increasing host
    ints, from :func:`pml_suprank.ranking.flat.group_pairs`) in blocks of whole queries of about ``chunk_elements``
    elements, broadcast over the block's widest row: every shape is known on the host, nothing waits for the device.
    """
    return _WindowKernel.apply(order, tuple(widths), float(upper), float(scale), chunk_elements, Z, z)
