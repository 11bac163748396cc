"""Whether inner-product scores fit the index dtype, decided before searching.

Cauchy-Schwarz bounds every score and every partial sum of the matmul that computes it:
``|<q, g>| <= sum_d |q_d|·|g_d| <= ||q||·||g||``. Search therefore refuses queries whose largest row norm times the
gallery's largest row norm exceeds half the largest finite value of the dtype (the half absorbs rounding): below that
no score can become ``inf``, above it scores near ``3.4e38`` (float32) would come back as ``inf`` and their order
would be lost.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_scores_fit", "max_row_norm"]

_ROWS = 1 << 16


def max_row_norm(x: Tensor) -> float:
    """The largest Euclidean row norm of ``x`` ``(N, D)`` as a Python float (``inf`` past float64's range), without
    overflow in ``x``'s own dtype: each row is divided by its largest absolute entry ``a_i`` before the sum of squares
    (``||x_i|| = a_i·||x_i / a_i||``), in blocks of 65,536 rows (no float64 copy: works on every device)."""
    best = 0.0
    with torch.no_grad():
        for start in range(0, x.shape[0], _ROWS):
            block = x[start : start + _ROWS]
            peak = block.abs().amax(dim=1, keepdim=True)
            safe = torch.where(peak > 0, peak, torch.ones_like(peak))
            norms = torch.linalg.vector_norm(block / safe, dim=1)
            best = max(best, float((peak.squeeze(1).cpu().double() * norms.cpu().double()).max()))
    return best


def check_scores_fit(name: str, query_norm: float, gallery_norm: float, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` naming ``name`` when ``query_norm · gallery_norm`` (largest row norms) exceeds half the
    largest finite value of ``dtype``, i.e. when a score could overflow to ``inf``."""
    limit = torch.finfo(dtype).max / 2
    if query_norm * gallery_norm > limit:
        raise ValueError(
            f"{name} and the gallery are too large for {str(dtype).removeprefix('torch.')} scores: the largest "
            f"{name} row norm ({query_norm:.3g}) times the largest gallery row norm ({gallery_norm:.3g}) exceeds "
            f"{limit:.3g}, so inner products could overflow to inf; scale the embeddings down (e.g. "
            f"torch.nn.functional.normalize(x, dim=1), as RetrievalModel outputs)"
        )
