"""RMDS: relative Mahalanobis distance (Ren et al., "A Simple Fix to Mahalanobis Distance for Improving Near-OOD
Detection", 2021); higher = more OOD."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_positive
from ..hub.schema import TensorSpec
from .base import check_features
from .mahalanobis import GaussianDetector, warn_degenerate_scale
from .priors import ClassConditionalGaussian, finite_scores, power_of_two_exponent

__all__ = ["RMDS"]


class RMDS(GaussianDetector):
    """Relative Mahalanobis distance (Ren et al. 2021, Eq. 4): score ``(N,)`` ``min_k (MD_k(z) − MD_0(z))``.

    ``MD_k`` is the squared distance of :class:`~pml_suprank.ood.Mahalanobis` to class ``k``, ``MD_0`` the one under
    the *background* Gaussian of all training features (raw features, as the paper and OpenOOD v1.5). OpenOOD inverts
    the covariances with a pseudo-inverse; here a relative ridge ``reg · mean(diag Σ)`` precedes a float64 Cholesky.

    Args:
        reg: Relative ridge added to both covariances (``>= 0``).
    """

    _state_names = (*GaussianDetector._state_names, "background_mean", "background_cholesky")

    def __init__(self, reg: float = 1e-6) -> None:
        super().__init__()
        self.reg = check_positive("reg", reg, strict=False)
        self.gaussian = ClassConditionalGaussian(normalize=False, reg=self.reg)
        self.background_mean: Tensor | None = None
        self.background_cholesky: Tensor | None = None

    def config(self) -> dict[str, Any]:
        return {"reg": self.reg}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = check_features("features", features).detach()
        self.gaussian.fit(z, labels)
        k = power_of_two_exponent(z)  # fitted at scale ~1, scaled back exactly (as the class-conditional fit)
        z64 = z.to(torch.float64) * 2.0**-k
        mean = z64.mean(dim=0)
        centred = z64 - mean
        cov = centred.T @ centred / z.shape[0]
        scale = torch.diagonal(cov).mean()
        if not bool(scale > 0):
            raise ValueError("features have zero variance; cannot fit RMDS's background Gaussian")
        eye = torch.eye(z.shape[1], dtype=torch.float64, device=z.device)
        chol, info = torch.linalg.cholesky_ex(cov + (self.reg * scale + torch.finfo(torch.float64).tiny) * eye)
        if int(info) != 0:
            raise ValueError(f"the background covariance is not positive definite with reg={self.reg}; increase reg")
        self.background_mean, self.background_cholesky = mean * 2.0**k, chol * 2.0**k
        warn_degenerate_scale("RMDS", self.gaussian.cholesky, z.dtype)

    def background_distance(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N,)`` squared Mahalanobis distance ``MD_0`` to the background Gaussian (float64)."""
        chol = self.background_cholesky.to(device=z.device, dtype=torch.float64)
        centred = z.to(torch.float64) - self.background_mean.to(device=z.device, dtype=torch.float64)
        y = torch.linalg.solve_triangular(chol, centred.T, upper=False)  # L⁻¹(z − μ_0), (D, N)
        return (y * y).sum(dim=0)

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = check_features("features", features, dim=self.gaussian.dim)
        relative = self.gaussian.mahalanobis(z) - self.background_distance(z).unsqueeze(-1)
        return finite_scores(relative.min(dim=-1).values, z.dtype, "RMDS")

    def _state_spec(self) -> dict[str, TensorSpec]:
        """The class-conditional Gaussian plus ``background_mean`` ``(D,)`` and its Cholesky factor ``(D, D)``."""
        return {
            **super()._state_spec(),
            "background_mean": TensorSpec(("D",)),
            "background_cholesky": TensorSpec(("D", "D"), lower_triangular=True),
        }
