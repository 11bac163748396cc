"""Energy-score baseline (Liu et al., NeurIPS 2020), HEAT's EL prior as a stand-alone detector.

Scores are outlier scores (higher = more OOD), the negative of OpenOOD v1.5's ``conf``; the definition matches
OpenOOD v1.5 and pytorch-ood 0.4.0 once their hyper-parameters are aligned (checked against both in the tests).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .._validation import check_positive
from .base import Detector
from .head import check_logits
from .priors import energy_logits

__all__ = ["Energy"]


class Energy(Detector):
    """Energy score (Liu et al. 2020, Eq. 7): ``−T·logsumexp(logits/T)``; HEAT's EL prior for ``T = 1``.

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
        return energy_logits(check_logits(logits), self.temperature)
