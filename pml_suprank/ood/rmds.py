"""RMDS: relative Mahalanobis distance (Ren et al., "A Simple Fix to Mahalanobis Distance for Improving Near-OOD
Detection", 2021); higher = more OOD."""

from __future__ import annotations

import torch
from torch import Tensor

from ..hub.schema import TensorSpec
from .mahalanobis import GaussianDetector
from .priors import finite_scores, shared_gaussian

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
        super().__init__(normalize=False, reg=reg)

    def _fit_more(self, z: Tensor) -> None:
        one_group = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
        counts = torch.tensor([z.shape[0]], device=z.device)
        means, self.background_cholesky = shared_gaussian(z.to(torch.float64), one_group, counts, self.reg, z.dtype)
        self.background_mean = means[0]

    def background_distance(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N,)`` squared Mahalanobis distance ``MD_0`` to the background Gaussian (float64)."""
        chol = self.background_cholesky.to(device=z.device, dtype=torch.float64)
        centred = z.to(torch.float64) - self.background_mean.to(device=z.device, dtype=torch.float64)
        y = torch.linalg.solve_triangular(chol, centred.T, upper=False)  # L⁻¹(z − μ_0), (D, N)
        return (y * y).sum(dim=0)

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = self._check_z(features)
        relative = self.gaussian.mahalanobis(z) - self.background_distance(z).unsqueeze(-1)
        return finite_scores(relative.min(dim=-1).values, z.dtype, "RMDS")

    def _state_spec(self) -> dict[str, TensorSpec]:
        """The class-conditional Gaussian plus ``background_mean`` ``(D,)`` and its Cholesky factor ``(D, D)``."""
        return {
            **super()._state_spec(),
            "background_mean": TensorSpec(("D",)),
            "background_cholesky": TensorSpec(("D", "D"), lower_triangular=True),
        }
