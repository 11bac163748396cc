"""Overflow-safe scaling of the embeddings before the evaluators' score matmul."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__: list[str] = []


def _overflow_safe_scales(query: Tensor, gallery: Tensor) -> tuple[float, Tensor]:
    """``(query_scale, gallery)``: powers of two that keep every dot product ``query · gallery`` finite.

    ``|q · g| ≤ D · max|q_i| · max|g_j|``, and so are the partial sums of the matmul, so when that bound could exceed
    the dtype's range both sides are scaled by powers of two. A power of two scales every product and partial sum
    exactly (barring the underflow of terms negligible at that magnitude), so the ranking, hence every metric, is
    the one of the unscaled scores; without this, float32 embeddings with entries ~1e19 give ``inf``/NaN scores.
    ``(1.0, gallery)`` unchanged in the usual case (one ``amax`` per side; compared in log2 to never overflow).
    """
    if query.numel() == 0 or gallery.numel() == 0:
        return 1.0, gallery
    q_max = float(query.detach().abs().amax())
    g_max = float(gallery.abs().amax())
    if q_max == 0.0 or g_max == 0.0:
        return 1.0, gallery
    log_q, log_g = math.log2(q_max), math.log2(g_max)
    excess = log_q + log_g + math.log2(gallery.shape[1]) - math.log2(torch.finfo(gallery.dtype).max / 16)
    if excess <= 0:
        return 1.0, gallery
    # scale the product by 2**-shift; the larger side takes more of it, so that the smaller one does not underflow
    shift = math.ceil(excess)
    q_shift = min(max(round((shift + log_q - log_g) / 2), 0), shift)
    return 2.0**-q_shift, gallery * 2.0 ** -(shift - q_shift)
