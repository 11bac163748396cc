"""ASH: activation shaping at the penultimate layer (Djurisic et al., "Extremely Simple Activation Shaping for
Out-of-Distribution Detection", ICLR 2023).

Scores are outlier scores (higher = more OOD), the negative of OpenOOD v1.5's ``conf``; the definition matches
OpenOOD v1.5's ``ASHPostprocessor`` (``ash_p`` / ``ash_b`` / ``ash_s`` on the pooled features) at equal percentile.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor

from .._validation import check_choice
from .shaping import ShapedEnergyDetector, ash_binarize, ash_prune, ash_scale

__all__ = ["ASH"]

_VARIANTS = {"p": ash_prune, "b": ash_binarize, "s": ash_scale}


class ASH(ShapedEnergyDetector):
    """ASH (Djurisic et al. 2023, Sec. 3): shape the penultimate features ``z``, then the energy score.

    With ``k = D − round(D·p/100)`` kept entries per sample and ``s1 = Σ_j z_j``:

    * ``"p"`` (prune): keep the top-``k`` entries, zero the rest;
    * ``"b"`` (binarize): the top-``k`` entries set to ``s1 / k``, the rest 0;
    * ``"s"`` (scale): prune, then multiply by ``exp(s1 / s2)`` where ``s2`` is the sum after pruning.

    Score ``−logsumexp(W·ash(z) + b)`` (Liu et al. energy of the shaped logits). Defaults: ASH-S at ``p = 90``
    (the paper's ImageNet ResNet-50 setting; OpenOOD v1.5 ``ash.yml``). ASH assumes non-negative (post-ReLU)
    features; ``exp(s1/s2)`` can overflow when they are not.

    Args:
        variant: ``"p"``, ``"b"`` or ``"s"``.
        percentile: Pruning percentile ``p`` in [0, 100).
        weight, bias, head: The classifier head.
    """

    def __init__(
        self, variant: Literal["p", "b", "s"] = "s", percentile: float = 90.0, weight=None, bias=None, head=None
    ) -> None:
        self.variant = check_choice("variant", variant, tuple(_VARIANTS))
        super().__init__(percentile, weight, bias, head)

    def config(self) -> dict[str, Any]:
        return {"variant": self.variant, "percentile": self.percentile}

    def shape(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N, D)`` shaped features (ASH-P, -B or -S)."""
        return _VARIANTS[self.variant](z, self.percentile)
