"""GEN: generalized entropy of the softmax (Liu, Lochman & Zach, CVPR 2023); higher = more OOD."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_positive, check_positive_int
from .base import check_features
from .logit_scores import LogitDetector

__all__ = ["GEN", "check_gamma", "generalized_entropy"]


def check_gamma(gamma: float) -> float:
    """GEN's exponent ``γ`` as a float in (0, 1) (``TypeError`` / ``ValueError`` naming it otherwise)."""
    gamma = check_positive("gamma", gamma)
    if gamma >= 1.0:
        raise ValueError(f"gamma must lie in (0, 1); got {gamma}")
    return gamma


def generalized_entropy(logits: Tensor, gamma: float = 0.1, m: int = 100) -> Tensor:
    """GEN paper, Eq. 8: ``(N, C)`` logits → ``(N,)`` ``Σ_{top-m} p^γ (1 − p)^γ`` over the ``min(m, C)`` largest softmax
    probabilities, ``γ`` in (0, 1); higher = more uncertain = more OOD."""
    gamma, m = check_gamma(gamma), check_positive_int("M", m)
    probs = torch.softmax(check_features("logits", logits), dim=-1)
    top = probs.topk(min(m, probs.shape[-1]), dim=-1).values
    return (top.pow(gamma) * (1.0 - top).pow(gamma)).sum(dim=-1)


class GEN(LogitDetector):
    """Generalized ENtropy score, :func:`generalized_entropy` (OpenOOD v1.5 returns ``conf = −score`` with the same
    ``γ`` and ``M``, capped at ``C`` alike).

    Args:
        gamma: ``γ`` in (0, 1) (0.1: paper, OpenOOD ``gen.yml``).
        M: Number of top probabilities (100: paper, OpenOOD; capped at the number of classes).
    """

    def __init__(self, gamma: float = 0.1, M: int = 100) -> None:  # noqa: N803 - the paper's name
        super().__init__()
        self.gamma, self.M = check_gamma(gamma), check_positive_int("M", M)

    def score_logits(self, logits: Tensor) -> Tensor:
        return generalized_entropy(logits, self.gamma, self.M)
