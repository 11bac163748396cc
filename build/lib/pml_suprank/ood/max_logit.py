"""Maximum-logit baseline (Hendrycks et al., ICML 2022).

Scores are outlier scores (higher = more OOD), the negative of OpenOOD v1.5's ``conf``; the definition matches
OpenOOD v1.5 and pytorch-ood 0.4.0 once their hyper-parameters are aligned (checked against both in the tests).
"""

from __future__ import annotations

from torch import Tensor

from .base import Detector
from .head import check_logits

__all__ = ["MaxLogit"]


class MaxLogit(Detector):
    """Maximum logit (Hendrycks et al. 2022): score ``−max_c logits_c``. Needs ``logits``."""

    requires_fit = False

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return -check_logits(logits).max(dim=-1).values
