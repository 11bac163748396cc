"""MSP, maximum logit and energy: the detectors reading only the logits, without a fit (as OpenOOD v1.5 and
pytorch-ood 0.4.0, checked in the tests; scores are ``−conf``, higher = more OOD)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_positive
from .base import Detector, check_features
from .priors import energy_logits

__all__ = ["MSP", "Energy", "MaxLogit"]


class MSP(Detector):
    """Maximum softmax probability (Hendrycks & Gimpel, ICLR 2017): score ``−max_c softmax(logits)_c`` ``(N,)``.
    Needs ``logits`` ``(N, C)``."""

    requires_fit = False

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return -torch.softmax(check_features("logits", logits), dim=-1).max(dim=-1).values


class MaxLogit(Detector):
    """Maximum logit (Hendrycks et al., ICML 2022): score ``−max_c logits_c`` ``(N,)``. Needs ``logits`` ``(N, C)``."""

    requires_fit = False

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return -check_features("logits", logits).max(dim=-1).values


class Energy(Detector):
    """Energy score (Liu et al., NeurIPS 2020, Eq. 7): ``−T·logsumexp(logits/T)`` ``(N,)``; HEAT's EL prior for
    ``T = 1``. Needs ``logits`` ``(N, C)``.

    Args:
        temperature: ``T > 0`` (1 in the paper, OpenOOD and pytorch-ood).
    """

    requires_fit = False

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = check_positive("temperature", temperature)

    def config(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return energy_logits(check_features("logits", logits), self.temperature)
