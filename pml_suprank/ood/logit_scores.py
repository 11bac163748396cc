"""The softmax / logit scores: MSP, maximum logit, energy and GEN read only the logits ``(N, C)``, without a fit;
ODIN rescores inputs perturbed through the network (as OpenOOD v1.5 and pytorch-ood 0.4.0, checked in the tests;
scores are ``−conf``, higher = more OOD)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_positive, check_positive_int
from .base import Detector, check_features, energy_logits
from .model_api import is_retrieval_model

__all__ = ["GEN", "MSP", "ODIN", "Energy", "LogitDetector", "MaxLogit", "generalized_entropy"]

#: the largest softmax / energy temperature (the papers use 1 and 1000; a larger one makes scores overflow float32)
MAX_TEMPERATURE = 1e6


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
        self.temperature = check_positive("temperature", temperature, maximum=MAX_TEMPERATURE)

    def score_logits(self, logits: Tensor) -> Tensor:
        return energy_logits(logits, self.temperature)


def check_gamma(gamma: float) -> float:
    """GEN's exponent ``γ`` as a float in (0, 1) (``TypeError`` / ``ValueError`` naming it otherwise)."""
    gamma = check_positive("gamma", gamma)
    if gamma >= 1.0:
        raise ValueError(f"gamma must lie in (0, 1); got {gamma}")
    return gamma


def generalized_entropy(logits: Tensor, gamma: float = 0.1, m: int = 100) -> Tensor:
    """GEN paper, Eq. 8: ``(N, C)`` logits → ``(N,)`` ``Σ_{top-m} p^γ (1 − p)^γ`` over the ``min(m, C)`` largest softmax
    probabilities, ``γ`` in (0, 1); higher = more uncertain = more OOD."""
    gamma, m = check_gamma(gamma), check_positive_int("M", m)
    probs = torch.softmax(check_features("logits", logits), dim=-1)
    top = probs.topk(min(m, probs.shape[-1]), dim=-1).values
    return (top.pow(gamma) * (1.0 - top).pow(gamma)).sum(dim=-1)


class GEN(LogitDetector):
    """Generalized ENtropy score, :func:`generalized_entropy` (OpenOOD v1.5 returns ``conf = −score`` with the same
    ``γ`` and ``M``, capped at ``C`` alike).

    Args:
        gamma: ``γ`` in (0, 1) (0.1: paper, OpenOOD ``gen.yml``).
        M: Number of top probabilities (100: paper, OpenOOD; capped at the number of classes).
    """

    def __init__(self, gamma: float = 0.1, M: int = 100) -> None:  # noqa: N803 - the paper's name
        super().__init__()
        self.gamma, self.M = check_gamma(gamma), check_positive_int("M", M)

    def score_logits(self, logits: Tensor) -> Tensor:
        return generalized_entropy(logits, self.gamma, self.M)


class ODIN(Detector):
    """ODIN (Liang et al. 2018): score ``(N,)`` ``−max softmax(f(x̃)/T)``, ``x̃ = x − ε·sign(∇ₓ CE(f(x)/T, argmax
    f(x)))``, the sign divided per channel by ``norm_std`` when given (as OpenOOD; pytorch-ood 0.4.0 and HEAT, which
    it matches, do not). The network is not saved: pass ``model=`` to ``from_pretrained``.

    Args:
        model: Callable mapping a batch of inputs ``(N, ...)`` to logits ``(N, C)``, used by ``score(inputs=x)``.
        temperature: Softmax temperature ``T`` (1000 in the paper).
        eps: Perturbation magnitude ``ε`` (0.0014).
        norm_std: Optional per-channel input std used to rescale the sign gradient.
    """

    requires_fit = False

    def __init__(
        self,
        model: Callable[[Tensor], Tensor] | None = None,
        temperature: float = 1000.0,
        eps: float = 0.0014,
        norm_std: tuple[float, ...] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.temperature = check_positive("temperature", temperature, maximum=MAX_TEMPERATURE)
        self.eps = check_positive("eps", eps, strict=False)
        if norm_std is not None:
            norm_std = tuple(check_positive("norm_std", float(s)) for s in norm_std)
        self.norm_std = norm_std

    def _adopt(self, model) -> None:
        if self.model is None:
            self.model = model.forward_logits if is_retrieval_model(model) else model

    def _score(self, features=None, logits=None, inputs: Tensor | None = None, **kwargs) -> Tensor:
        if self.model is None:
            raise ValueError("ODIN needs model= (a callable from inputs to logits)")
        if not isinstance(inputs, Tensor) or not inputs.is_floating_point():
            raise ValueError(f"ODIN.score needs inputs= a floating tensor of network inputs; got {type(inputs)}")
        with torch.enable_grad():
            x = inputs.detach().clone().requires_grad_(True)
            scaled = self.model(x) / self.temperature
            loss = F.cross_entropy(scaled, scaled.argmax(dim=-1))
            (grad,) = torch.autograd.grad(loss, x)
        step = grad.sign()
        if self.norm_std is not None:
            if inputs.dim() < 2 or inputs.shape[1] != len(self.norm_std):
                raise ValueError(
                    f"norm_std has {len(self.norm_std)} entries but inputs have shape {tuple(inputs.shape)}"
                )
            std = torch.tensor(self.norm_std, device=x.device, dtype=x.dtype).reshape(1, -1, *([1] * (x.dim() - 2)))
            step = step / std
        x_hat = x.detach() - self.eps * step
        return -torch.softmax(self.model(x_hat) / self.temperature, dim=-1).max(dim=-1).values
