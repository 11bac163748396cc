"""ODIN: temperature scaling and input perturbation (Liang et al., ICLR 2018); higher = more OOD."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_positive
from .base import Detector
from .model_api import is_retrieval_model

__all__ = ["ODIN"]


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
        self.temperature = check_positive("temperature", temperature)
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
