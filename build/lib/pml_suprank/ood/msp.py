"""Maximum softmax probability (MSP) baseline (Hendrycks & Gimpel, ICLR 2017).

Scores are outlier scores (higher = more OOD), the negative of OpenOOD v1.5's ``conf``; the definition matches
OpenOOD v1.5 and pytorch-ood 0.4.0 once their hyper-parameters are aligned (checked against both in the tests).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Detector
from .head import check_logits

__all__ = ["MSP"]


class MSP(Detector):
    """Maximum softmax probability (Hendrycks & Gimpel 2017): score ``−max_c softmax(logits)_c``. Needs ``logits``."""

    requires_fit = False

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return -torch.softmax(check_logits(logits), dim=-1).max(dim=-1).values
