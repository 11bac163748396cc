"""DICE: directed sparsification of the classifier head (Sun & Li, ECCV 2022); higher = more OOD."""

from __future__ import annotations

from torch import Tensor

from .._validation import check_probability
from ..hub.schema import TensorSpec
from .base import HeadDetector
from .metrics import quantile_linear

__all__ = ["DICE"]


class DICE(HeadDetector):
    """DICE (Sun & Li 2022): weights of the head whose contribution ``m ⊙ W`` (``m`` the mean training feature) is not
    above its ``p``-quantile are zeroed; score ``(N,)`` ``−logsumexp(z W̃ᵀ + b)``. Matches OpenOOD and pytorch-ood.

    Args:
        p: Sparsity, the **fraction** of weights dropped, in [0, 1) (HEAT: 0.9 on CIFAR-10, 0.7 on ImageNet).
    """

    _state_names = ("weight", "bias", "mask")

    def __init__(self, p: float = 0.9, weight=None, bias=None, head=None) -> None:
        super().__init__(weight, bias, head)
        self.p = check_probability("p", p)
        if self.p >= 1.0:
            raise ValueError(f"p must lie in [0, 1) (fraction of weights dropped); got {p}")

    def _state_spec(self) -> dict[str, TensorSpec]:
        return {**super()._state_spec(), "mask": TensorSpec(("C", "D"), kind="bool")}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = self._check_z(features).detach()
        contrib = z.mean(dim=0, keepdim=True) * self.weight.to(device=z.device, dtype=z.dtype)
        self.mask = contrib > quantile_linear(contrib, self.p)

    def shaped_weight(self) -> Tensor:
        return self.weight * self.mask.to(self.weight.device)
