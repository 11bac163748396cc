"""The classifier head ``(W, b)`` of the detectors that compute ``logits = z Wᵀ + b`` themselves.

``head_params`` turns ``weight=`` / ``bias=`` or an ``nn.Linear`` ``head=`` into detached copies of ``W`` ``(C, D)``
and ``b`` ``(C,)``; :class:`HeadDetector` is the base of the detectors keeping them in their state (ViM, DICE, ReAct,
ASH, SCALE).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..hub.schema import TensorSpec
from .base import Detector, check_features
from .model_api import model_head

__all__ = ["HeadDetector", "head_params"]


def head_params(weight: Tensor | None, bias: Tensor | None, head: nn.Module | None) -> tuple[Tensor, Tensor | None]:
    """Detached copies ``(W (C, D), b (C,) or None)`` of the classifier head, from ``weight`` / ``bias`` or ``head``."""
    if head is not None:
        if weight is not None or bias is not None:
            raise ValueError("pass either head= or weight=/bias=, not both")
        if not isinstance(getattr(head, "weight", None), Tensor):
            raise TypeError(f"head must be a linear layer with a .weight of shape (C, D); got {type(head).__name__}")
        weight, bias = head.weight, getattr(head, "bias", None)
    if weight is None:
        raise ValueError("this detector needs the classifier head: pass weight= (C, D) and bias= (C,), or head=")
    weight = check_features("weight", weight.detach()).clone()
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias must have shape ({weight.shape[0]},) to match weight; got {shape}")
        bias = bias.detach().clone()
    return weight, bias


def linear_logits(z: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``z Wᵀ + b`` ``(N, C)`` in ``z``'s dtype and device."""
    b = None if bias is None else bias.to(device=z.device, dtype=z.dtype)
    return F.linear(z, weight.to(device=z.device, dtype=z.dtype), b)


class HeadDetector(Detector, register=False):
    """Base of the detectors holding the fc ``weight`` / ``bias`` as state (saved with the fitted tensors); built
    without a head, they take it from ``load_state_dict`` or from the model given to ``fit_model``."""

    def __init__(self, weight=None, bias=None, head=None) -> None:
        super().__init__()
        self.weight, self.bias = (None, None) if weight is None and head is None else head_params(weight, bias, head)

    def _adopt(self, model: nn.Module) -> None:
        if self.weight is None:
            self.weight, self.bias = head_params(None, None, model_head(model, type(self).__name__))

    def _logits(self, z: Tensor, weight: Tensor | None = None) -> Tensor:
        return linear_logits(z, self.weight if weight is None else weight, self.bias)

    def _check_z(self, features: Any) -> Tensor:
        if self.weight is None:
            raise ValueError(f"{type(self).__name__} has no classifier weight: pass weight=/bias= or head=")
        return check_features("features", features, dim=self.weight.shape[1])

    def _state_spec(self) -> dict[str, TensorSpec]:
        """The head: ``weight`` ``(C, D)`` (not all zero), optional ``bias`` ``(C,)``; subclasses add their own."""
        return {"weight": TensorSpec(("C", "D"), nonzero=True), "bias": TensorSpec(("C",), optional=True)}

    def _restore(self, state, meta) -> None:
        self.load_state_dict(state)
        self._fitted = bool(meta.get("fitted", True))
