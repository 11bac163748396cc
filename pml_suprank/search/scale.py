"""Whether inner-product scores fit the index dtype, decided before searching, and an exact rescaling of the
queries when they would underflow.

By Cauchy-Schwarz every score and partial sum is at most ``||q||·||g||``: search refuses queries whose largest row
norm times the gallery's exceeds half the dtype's largest finite value. Tiny embeddings (products of ``1e-50`` in
float32) underflow to ``0``; ``<q·2**k, g>`` ranks the same (exact multiplication), so :func:`underflow_exponent`
gives the ``k`` bringing the largest product to about 1 and the scores are multiplied back by ``2**-k``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["check_scores_fit", "max_abs", "underflow_exponent"]


def _max_row_norm(x: Tensor, rows: int = 1 << 16) -> float:
    """The largest row norm of ``x`` ``(N, D)`` as a Python float, without overflow in ``x``'s dtype (each row divided
    by its largest entry ``a_i``: ``||x_i|| = a_i·||x_i / a_i||``), in blocks of ``rows`` (no float64 copy)."""
    best = 0.0
    with torch.no_grad():
        for start in range(0, x.shape[0], rows):
            peak = x[start : start + rows].abs().amax(dim=1, keepdim=True)
            norms = torch.linalg.vector_norm(x[start : start + rows] / torch.where(peak > 0, peak, 1), dim=1)
            best = max(best, float((peak.squeeze(1).cpu().double() * norms.cpu().double()).max()))
    return best


def max_abs(x: Tensor) -> float:
    """The largest ``|x_ij|`` as a Python float (one pass, no copy of ``x``)."""
    with torch.no_grad():
        return float(x.abs().amax()) if x.numel() else 0.0


def check_scores_fit(
    name: str, queries: Tensor, query_max_abs: float, gallery: Tensor, gallery_max_abs: float, dtype: torch.dtype
) -> None:
    """``ValueError`` naming ``name`` when the largest row norm of ``queries`` ``(Q, D)`` times that of ``gallery``
    ``(N, D)`` exceeds half the largest finite value of ``dtype`` (a score could overflow to ``inf``); the row norms
    are computed only when the bound from the largest entries (``||x|| <= sqrt(D)·max|x_j|``) is too loose."""
    limit = torch.finfo(dtype).max / 2
    if query_max_abs * gallery_max_abs * queries.shape[1] <= limit:
        return
    query_norm, gallery_norm = _max_row_norm(queries), _max_row_norm(gallery)
    if query_norm * gallery_norm > limit:
        raise ValueError(
            f"{name} and the gallery are too large for {str(dtype).removeprefix('torch.')} scores: the largest "
            f"{name} row norm ({query_norm:.3g}) times the largest gallery row norm ({gallery_norm:.3g}) exceeds "
            f"{limit:.3g}, so inner products could overflow to inf; scale the embeddings down (e.g. "
            f"torch.nn.functional.normalize(x, dim=1), as RetrievalModel outputs)"
        )


def underflow_exponent(query_abs: float, gallery_abs: float, dtype: torch.dtype) -> int:
    """``k >= 0`` such that scores computed from ``queries·2**k`` keep their order: ``0`` unless the largest product
    ``query_abs · gallery_abs`` is so small that score differences would leave the normal range (float32: below
    ``2**-63``); then the ``k`` bringing it to about 1, capped so that the scaled queries stay below ``2**(E - 8)``
    (``E``: the dtype's largest exponent)."""
    if query_abs == 0.0 or gallery_abs == 0.0:
        return 0
    info = torch.finfo(dtype)
    log_product = math.log2(query_abs) + math.log2(gallery_abs)
    if log_product >= math.log2(info.tiny) - math.log2(info.eps) + 40:
        return 0
    cap = math.floor(math.log2(info.max)) - 8 - math.ceil(math.log2(query_abs))
    return max(0, min(-math.floor(log_product), cap))
