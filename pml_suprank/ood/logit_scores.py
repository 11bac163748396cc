"""MSP, maximum logit and energy: the detectors reading only the logits ``(N, C)``, without a fit (as OpenOOD
v1.5 and pytorch-ood 0.4.0, checked in the tests; scores are ``−conf``, higher = more OOD)."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_positive
from .base import Detector, check_features, energy_logits

__all__ = ["MSP", "Energy", "MaxLogit", "LogitDetector"]


class LogitDetector(Detector, register=False):
    """Base of the detectors scoring the logits alone: ``score_logits`` ``(N, C) -> (N,)``; nothing to fit."""

    requires_fit = False

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return self.score_logits(check_features("logits", logits))


class MSP(LogitDetector):
    """Maximum softmax probability (Hendrycks & Gimpel, ICLR 2017): ``−max_c softmax(logits)_c`` ``(N,)``."""

    def score_logits(self, logits: Tensor) -> Tensor:
        return -torch.softmax(logits, dim=-1).max(dim=-1).values


class MaxLogit(LogitDetector):
    """Maximum logit (Hendrycks et al., ICML 2022): ``−max_c logits_c`` ``(N,)``."""

    def score_logits(self, logits: Tensor) -> Tensor:
        return -logits.max(dim=-1).values


class Energy(LogitDetector):
    """Energy score (Liu et al., NeurIPS 2020, Eq. 7): ``−T·logsumexp(logits/T)`` ``(N,)``; HEAT's EL prior for
    ``T = 1``.

    Args:
        temperature: ``T > 0`` (1 in the paper, OpenOOD and pytorch-ood).
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = check_positive("temperature", temperature)

    def score_logits(self, logits: Tensor) -> Tensor:
        return energy_logits(logits, self.temperature)
