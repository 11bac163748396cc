"""Shared input helpers of the detectors that read logits or the classifier head ``(W, b)``.

``check_logits`` validates ``(N, C)`` logits; ``head_params`` turns ``weight=`` / ``bias=`` or an ``nn.Linear``
``head=`` into detached copies of ``W`` ``(C, D)`` and ``b`` ``(C,)``; :class:`HeadDetector` is the base of the
detectors that keep the head in their state (ViM, DICE, ReAct) and compute ``logits = z Wᵀ + b`` themselves.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from .base import Detector, check_features

__all__ = ["HeadDetector", "check_logits", "head_params"]


def check_logits(logits: Any) -> Tensor:
    """Check ``logits`` is a finite floating ``(N, C)`` tensor (required, unlike ``features``, by logit scores)."""
    if logits is None:
        raise ValueError("logits are required by this detector (an (N, C) tensor); got None")
    return check_features("logits", logits)


def head_params(weight: Tensor | None, bias: Tensor | None, head: nn.Module | None) -> tuple[Tensor, Tensor | None]:
    """Detached copies ``(W, b)`` of the classifier head, from ``weight`` / ``bias`` or a linear ``head``."""
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


class HeadDetector(Detector, register=False):
    """Base of the detectors holding the fc ``weight`` / ``bias`` as state (saved with the fitted tensors)."""

    def __init__(self, weight=None, bias=None, head=None, *, _allow_missing: bool = False) -> None:
        super().__init__()
        if weight is None and head is None and _allow_missing:
            self.weight, self.bias = None, None  # restored by load_state_dict
        else:
            self.weight, self.bias = head_params(weight, bias, head)

    def _logits(self, z: Tensor, weight: Tensor | None = None) -> Tensor:
        w = (self.weight if weight is None else weight).to(device=z.device, dtype=z.dtype)
        b = None if self.bias is None else self.bias.to(device=z.device, dtype=z.dtype)
        return F.linear(z, w, b)

    def _check_z(self, features: Any) -> Tensor:
        if self.weight is None:
            raise ValueError(f"{type(self).__name__} has no classifier weight: pass weight=/bias= or head=")
        return check_features("features", features, dim=self.weight.shape[1])

    def _restore(self, state, meta) -> None:
        self.load_state_dict(state)
        self._fitted = bool(meta.get("fitted", True))


# the names used before this module existed
_check_logits, _head_params, _HeadDetector = check_logits, head_params, HeadDetector
