"""Virtual-logit matching, ViM (Wang et al., CVPR 2022); higher = more OOD."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_positive_int
from ..hub.schema import TensorSpec, check_schema
from .base import HeadDetector
from .priors import degenerate_variance

__all__ = ["ViM"]


class ViM(HeadDetector):
    """Virtual-logit matching (Wang et al. 2022, Eqs. 5-8), as OpenOOD v1.5 and pytorch-ood 0.4.0.

    ``u = −W⁺b``; ``NS`` = eigenvectors of the uncentred covariance of ``z − u`` beyond its ``dim`` largest
    eigenvalues; ``α = mean_train max-logit / mean_train ‖(z−u)NS‖``. Score ``α‖(z−u)NS‖ − logsumexp(Wz + b)``
    ``(N,)``. (HEAT's ``VIMScorer`` uses a centred covariance and ``fc(z − u)``; the official definition is used.)

    Args:
        dim: Dimension of the principal subspace (``D − dim`` residual directions); 256 for CIFAR-10 in HEAT.
    """

    _state_names = ("weight", "bias", "u", "null_space", "alpha")

    def __init__(self, dim: int = 256, weight=None, bias=None, head=None) -> None:
        super().__init__(weight, bias, head)
        check_positive_int("dim", dim)
        if self.weight is not None and dim >= self.weight.shape[1]:
            raise ValueError(f"dim must be smaller than the feature dimension {self.weight.shape[1]}; got {dim}")
        self.dim = dim

    def _hub_check_state(self, state, source, config) -> None:
        """The head, then ``u`` ``(D,)``, ``null_space`` ``(D, D − dim)`` (not all zero) and a scalar ``alpha``."""
        head = super()._state_spec()
        sizes = check_schema(state, source, head, allow_unexpected=True)
        if sizes["D"] <= self.dim:
            raise ValueError(
                f"{source}: tensor 'weight' has {sizes['D']} columns; config.json's dim={self.dim} must be smaller"
            )
        spec = {
            **head,
            "u": TensorSpec(("D",)),
            "null_space": TensorSpec(("D", sizes["D"] - self.dim), nonzero=True),
            "alpha": TensorSpec(()),
        }
        check_schema(state, source, spec, sizes=sizes)

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = self._check_z(features).detach()
        w = self.weight.to(device=z.device, dtype=torch.float64)
        if self.bias is None:
            u = torch.zeros(w.shape[1], dtype=torch.float64, device=z.device)
        else:
            u = -torch.linalg.pinv(w) @ self.bias.to(device=z.device, dtype=torch.float64)
        centred = z.to(torch.float64) - u
        cov = centred.T @ centred / z.shape[0]
        eigvals, eigvecs = torch.linalg.eigh(cov)  # ascending
        order = torch.argsort(eigvals, descending=True)
        null_space = eigvecs[:, order[self.dim :]]
        vlogit = torch.linalg.vector_norm(centred @ null_space, dim=-1)
        second_moment = (centred * centred).sum(1).mean()
        if not bool(vlogit.pow(2).mean() > degenerate_variance(second_moment, z.dtype)):
            raise ValueError(
                f"features have zero variance outside their principal subspace of dim={self.dim} (at most the "
                f"rounding level of their {z.dtype} values): ViM's alpha (Eq. 8) is undefined; constant features, or "
                "use a smaller dim"
            )
        max_logit = self._logits(z.to(torch.float64), w).max(dim=-1).values
        self.u, self.null_space = u, null_space
        self.alpha = (max_logit.mean() / vlogit.mean()).reshape(())

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = self._check_z(features)
        z64 = z.to(torch.float64)
        vlogit = torch.linalg.vector_norm((z64 - self.u.to(z.device)) @ self.null_space.to(z.device), dim=-1)
        energy = torch.logsumexp(self._logits(z64, self.weight.to(z.device, torch.float64)), dim=-1)
        return (self.alpha.to(z.device) * vlogit - energy).to(z.dtype)
