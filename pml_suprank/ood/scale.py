"""SCALE: scaling activations without pruning (Xu et al., "Scaling for Training Time and Post-hoc
Out-of-distribution Detection Enhancement", ICLR 2024).

Scores are outlier scores (higher = more OOD), the negative of OpenOOD v1.5's ``conf``; the definition matches
OpenOOD v1.5's ``ScalePostprocessor`` (``scale`` on the pooled features) at equal percentile.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .shaping import ShapedEnergyDetector, scale_activations

__all__ = ["SCALE"]


class SCALE(ShapedEnergyDetector):
    """SCALE (Xu et al. 2024, Eq. 3): ``z · exp(s1 / s2)``, then the energy score; no entry is pruned.

    ``s1 = Σ_j z_j`` and ``s2`` = the sum of the ``k = D − round(D·p/100)`` largest entries of ``z``. Score
    ``−logsumexp(W·z·exp(s1/s2) + b)``. Default ``p = 85`` (OpenOOD v1.5 ``scale.yml``; the paper's ImageNet
    setting).

    Args:
        percentile: Percentile ``p`` in [0, 100) defining ``s2``.
        weight, bias, head: The classifier head.
    """

    def __init__(self, percentile: float = 85.0, weight=None, bias=None, head=None) -> None:
        super().__init__(percentile, weight, bias, head)

    def config(self) -> dict[str, Any]:
        return {"percentile": self.percentile}

    def shape(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N, D)`` scaled features."""
        return scale_activations(z, self.percentile)
