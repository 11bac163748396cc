"""Overflow-safe scaling by powers of two of the embeddings before a score matmul (the evaluators, the search index)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__: list[str] = []


def overflow_safe_scales(query: Tensor, gallery: Tensor) -> tuple[float, Tensor]:
    """``(query_scale, gallery)``: powers of two that keep every dot product ``query · gallery`` finite and normal.

    ``|q · g| ≤ D · max|q_i| · max|g_j|`` (and so are the matmul's partial sums): when that bound could overflow, both
    sides are scaled down; when the products (and their ``eps`` times smaller differences) would be subnormal or
    zero, both are scaled up. Powers of two scale every product exactly, so the ranking, hence every metric, is the
    unscaled one at any magnitude (float32 entries ~1e19 would give ``inf``/NaN scores, ~1e-30 all-zero ties).
    ``(1.0, gallery)`` in the usual case (one ``amax`` per side, compared in log2).
    """
    if query.numel() == 0 or gallery.numel() == 0:
        return 1.0, gallery
    q_max = float(query.detach().abs().amax())
    g_max = float(gallery.abs().amax())
    if q_max == 0.0 or g_max == 0.0 or not math.isfinite(q_max) or not math.isfinite(g_max):
        return 1.0, gallery
    info = torch.finfo(gallery.dtype)
    log_q, log_g = math.log2(q_max), math.log2(g_max)
    excess = log_q + log_g + math.log2(gallery.shape[1]) - math.log2(info.max / 16)
    # the products must stay normal with room for their differences: max product >= tiny / eps · 2**16
    deficit = math.log2(info.tiny) - math.log2(info.eps) + 16 - (log_q + log_g)
    if excess <= 0 and deficit <= 0:
        return 1.0, gallery
    if excess > 0:
        # scale the product by 2**-shift; the larger side takes more of it, so that the smaller one does not underflow
        shift = math.ceil(excess)
        q_shift = min(max(round((shift + log_q - log_g) / 2), 0), shift, _max_exponent(info))
        return 2.0**-q_shift, times_power_of_two(gallery, -(shift - q_shift))
    # tiny: bring each side's largest entry to about 1 (exact: multiplying by 2**k only moves the exponent, and a
    # subnormal input is an integer multiple of the smallest subnormal, so it becomes a normal number exactly)
    q_up, g_up = max(-math.floor(log_q), 0), max(-math.floor(log_g), 0)
    cap = _max_exponent(info)  # the query's factor is returned as one number: it must be representable in the dtype
    if q_up > cap:
        # the rest of the query's shift moves to the gallery, as far as the products stay in range
        room = math.floor(math.log2(info.max / 16) - math.log2(gallery.shape[1]) - (log_q + cap) - (log_g + g_up))
        g_up += min(q_up - cap, max(room, 0))
        q_up = cap
    return 2.0**q_up, times_power_of_two(gallery, g_up)


def times_power_of_two(x: Tensor, k: int) -> Tensor:
    """``x · 2**k``, exact in binary floating point while the result stays in range, applied in steps whose factor is
    representable in ``x``'s dtype (``x * 2.0**134`` would multiply a float32 tensor by ``inf``)."""
    step = _max_exponent(torch.finfo(x.dtype))
    while k != 0:
        part = max(min(k, step), -step)
        x = x * 2.0**part
        k -= part
    return x


def _max_exponent(info: torch.finfo) -> int:
    """The largest ``k`` with ``2**k`` comfortably representable in the dtype (float32: 126; float64: 1022)."""
    return math.floor(math.log2(info.max)) - 1
