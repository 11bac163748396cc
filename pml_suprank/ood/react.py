"""ReAct: rectified activations (Sun et al., NeurIPS 2021); higher = more OOD."""

from __future__ import annotations

from torch import Tensor

from .._validation import check_positive
from ..hub.schema import TensorSpec
from .base import HeadDetector
from .metrics import quantile_linear

__all__ = ["ReAct"]


class ReAct(HeadDetector):
    """ReAct (Sun et al. 2021): score ``(N,)`` ``−logsumexp(fc(min(z, thr)))``, ``thr`` the ``percentile`` of **all**
    training feature values (OpenOOD fits it on the ID validation split: fit on the ID reference you want).

    Args:
        percentile: In (0, 100]; 90 in OpenOOD, 95 in HEAT's code (``react_p = 0.95``).
    """

    _state_names = ("weight", "bias", "threshold")

    def __init__(self, percentile: float = 90.0, weight=None, bias=None, head=None) -> None:
        super().__init__(weight, bias, head)
        self.percentile = check_positive("percentile", percentile)
        if self.percentile > 100.0:
            raise ValueError(f"percentile must lie in (0, 100]; got {percentile}")

    def _state_spec(self) -> dict[str, TensorSpec]:
        return {**super()._state_spec(), "threshold": TensorSpec(())}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        self.threshold = quantile_linear(self._check_z(features).detach(), self.percentile / 100.0).reshape(())

    def shape(self, z: Tensor) -> Tensor:
        return z.clamp(max=self.threshold.to(z.device, z.dtype))
