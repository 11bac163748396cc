"""Shaping of the penultimate features or the classifier head, then the energy of the shaped logits: ReAct (Sun et
al., NeurIPS 2021), DICE (Sun & Li, ECCV 2022), ASH (Djurisic et al., ICLR 2023) and SCALE (Xu et al., ICLR 2024);
higher = more OOD, as OpenOOD v1.5's postprocessors (``−conf``).

The ASH / SCALE functions are pure and act per row of ``(N, D)`` features; ``percentile`` sets how many entries are
*pruned*: the ``k = D − round(D · percentile / 100)`` largest are kept (``round`` halves to even; ties broken by
``topk``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from .._validation import check_choice, check_positive, check_probability
from ..hub.schema import TensorSpec
from .base import HeadDetector, check_features
from .metrics import quantile_linear

__all__ = [
    "ASH",
    "DICE",
    "SCALE",
    "ReAct",
    "ShapedEnergyDetector",
    "ash_binarize",
    "ash_prune",
    "ash_scale",
    "scale_activations",
]


def check_percentile(percentile: Any) -> float:
    """``percentile`` as a float in [0, 100) (``TypeError`` / ``ValueError`` naming it otherwise)."""
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float)):
        raise TypeError(f"percentile must be a real number in [0, 100); got {type(percentile).__name__}")
    if not 0.0 <= float(percentile) < 100.0:
        raise ValueError(f"percentile must lie in [0, 100); got {percentile}")
    return float(percentile)


def kept_count(dim: int, percentile: float) -> int:
    """Number ``k = D − round(D·p/100)`` of entries kept by ASH / SCALE at percentile ``p`` (``ValueError`` if 0)."""
    k = dim - int(round(dim * check_percentile(percentile) / 100.0))
    if k < 1:
        raise ValueError(f"percentile={percentile} prunes all {dim} feature entries; use a smaller percentile")
    return k


def _top_mask(z: Tensor, k: int) -> Tensor:
    idx = z.topk(k, dim=-1).indices
    return torch.zeros_like(z, dtype=torch.bool).scatter(-1, idx, True)


def _sharpening(total: Tensor, kept: Tensor) -> Tensor:
    """``exp(s1 / s2)`` per row (``(N, 1)``); rows whose kept sum is 0 get factor 1 instead of NaN."""
    safe = torch.where(kept != 0, kept, torch.ones_like(kept))
    return torch.where(kept != 0, torch.exp(total / safe), torch.ones_like(kept))


def ash_prune(z: Tensor, percentile: float) -> Tensor:
    """ASH-P (Djurisic et al. 2023, Sec. 3): keep the ``k`` largest entries of each row, zero the others. ``(N, D)``."""
    z = check_features("z", z)
    return torch.where(_top_mask(z, kept_count(z.shape[-1], percentile)), z, torch.zeros_like(z))


def ash_binarize(z: Tensor, percentile: float) -> Tensor:
    """ASH-B: the ``k`` largest entries of each row set to ``s1 / k`` (``s1`` = the row's sum), the others 0."""
    z = check_features("z", z)
    k = kept_count(z.shape[-1], percentile)
    fill = (z.sum(dim=-1, keepdim=True) / k).expand_as(z)
    return torch.where(_top_mask(z, k), fill, torch.zeros_like(z))


def ash_scale(z: Tensor, percentile: float) -> Tensor:
    """ASH-S: ASH-P, then each row times ``exp(s1 / s2)`` (``s1``, ``s2`` = row sums before / after pruning)."""
    pruned = ash_prune(z, percentile)
    return pruned * _sharpening(z.sum(dim=-1, keepdim=True), pruned.sum(dim=-1, keepdim=True))


def scale_activations(z: Tensor, percentile: float) -> Tensor:
    """SCALE (Xu et al. 2024, Eq. 3): the **unpruned** row times ``exp(s1 / s2)``, ``s2`` = sum of its top-``k``."""
    z = check_features("z", z)
    k = kept_count(z.shape[-1], percentile)
    kept = z.topk(k, dim=-1).values.sum(dim=-1, keepdim=True)
    return z * _sharpening(z.sum(dim=-1, keepdim=True), kept)


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


class ShapedEnergyDetector(HeadDetector, register=False):
    """Base of ASH and SCALE: the energy of the head on :meth:`shape`-d features (see :class:`HeadDetector`) at a
    pruning ``percentile``; nothing to fit, the classifier head is the state."""

    requires_fit = False

    def __init__(self, percentile: float, weight=None, bias=None, head=None) -> None:
        super().__init__(weight, bias, head)
        self.percentile = check_percentile(percentile)
        if self.weight is not None:
            kept_count(self.weight.shape[1], self.percentile)


_VARIANTS = {"p": ash_prune, "b": ash_binarize, "s": ash_scale}


class ASH(ShapedEnergyDetector):
    """ASH (Djurisic et al. 2023, Sec. 3): score ``−logsumexp(W·ash(z) + b)`` with ``ash`` :func:`ash_prune` (``"p"``),
    :func:`ash_binarize` (``"b"``) or :func:`ash_scale` (``"s"``; default at ``p = 90``, the paper's ImageNet setting
    and OpenOOD's ``ash.yml``). For non-negative (post-ReLU) features: ``exp(s1/s2)`` can overflow otherwise.

    Args:
        variant: ``"p"``, ``"b"`` or ``"s"``.
        percentile: Pruning percentile ``p`` in [0, 100).
        weight, bias, head: The classifier head.
    """

    def __init__(
        self, variant: Literal["p", "b", "s"] = "s", percentile: float = 90.0, weight=None, bias=None, head=None
    ) -> None:
        self.variant = check_choice("variant", variant, tuple(_VARIANTS))
        super().__init__(percentile, weight, bias, head)

    def shape(self, z: Tensor) -> Tensor:
        return _VARIANTS[self.variant](z, self.percentile)


class SCALE(ShapedEnergyDetector):
    """SCALE (Xu et al. 2024, Eq. 3): score ``−logsumexp(W·z·exp(s1/s2) + b)`` (:func:`scale_activations`). Default
    ``p = 85`` (OpenOOD v1.5 ``scale.yml``; the paper's ImageNet setting).

    Args:
        percentile: Percentile ``p`` in [0, 100) defining ``s2``.
        weight, bias, head: The classifier head.
    """

    def __init__(self, percentile: float = 85.0, weight=None, bias=None, head=None) -> None:
        super().__init__(percentile, weight, bias, head)

    def shape(self, z: Tensor) -> Tensor:
        return scale_activations(z, self.percentile)
