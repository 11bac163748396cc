"""Gaussian distance scores: Mahalanobis (Lee et al., NeurIPS 2018), SSD+ (Sehwag et al., ICLR 2021) and RMDS, the
relative Mahalanobis distance (Ren et al., "A Simple Fix to Mahalanobis Distance for Improving Near-OOD Detection",
2021); higher = more OOD."""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from ..hub.schema import TensorSpec
from .base import Detector, check_features
from .priors import ClassConditionalGaussian, finite_scores, gaussian_state_spec, shared_gaussian

__all__ = ["RMDS", "GaussianDetector", "Mahalanobis"]
_GAUSSIAN = ("means", "class_weights", "cholesky", "classes")


def warn_degenerate_scale(name: str, cholesky: Tensor, dtype: torch.dtype) -> None:
    """Warn when a fitted Gaussian (``cholesky`` ``(D, D)``) is so narrow that an input one unit from its mean scores
    beyond ``dtype`` (fitted and scored features of different scales: saturated scores)."""
    smallest = float(torch.diagonal(cholesky).abs().min())
    limit = torch.finfo(dtype).max if dtype.is_floating_point else torch.finfo(torch.float32).max
    if smallest < 1.0 / math.sqrt(limit):
        unit = float(torch.tensor(smallest, dtype=torch.float64).pow(-2))
        warnings.warn(
            f"{name} was fitted on features whose spread is degenerate at the scale of "
            f"{str(dtype).removeprefix('torch.')} (standard deviations down to {smallest:.3g}): an input at "
            f"distance 1 from the class means would score ~{unit:.3g}, beyond the dtype's range, so its score "
            "saturates. Fit and score features of the same scale (same model and preprocessing), or fit on float64 "
            "features",
            RuntimeWarning,
            stacklevel=4,
        )


class GaussianDetector(Detector, register=False):
    """Base of the detectors fitting a :class:`~pml_suprank.ood.priors.ClassConditionalGaussian` (``self.gaussian``)
    on ``(N, D)`` features and ``(N,)`` labels; ``_state_names`` beyond the Gaussian's are their own float64 tensors
    (declared in ``_state_spec``, fitted by ``_fit_more``)."""

    _state_names = _GAUSSIAN

    def __init__(self, normalize: bool = False, reg: float = 1e-6) -> None:
        super().__init__()
        self.gaussian = ClassConditionalGaussian(normalize=normalize, reg=reg)
        self.normalize, self.reg = self.gaussian.normalize, self.gaussian.reg

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        self.gaussian.fit(features, labels)  # checks features (N, D) and labels
        self._fit_more(features.detach())
        if not self.normalize:  # SSD+ scores unit-norm rows: the fitted scale is that of the sphere
            warn_degenerate_scale(type(self).__name__, self.gaussian.cholesky, features.dtype)

    def _fit_more(self, z: Tensor) -> None:
        """Fit the subclass's own tensors on the checked ``(N, D)`` features; default: none."""

    def _check_z(self, features) -> Tensor:
        return check_features("features", features, dim=self.gaussian.dim)

    def state_dict(self) -> dict[str, Tensor]:
        return {**self.gaussian.state_dict(), **super().state_dict()}

    def _state_spec(self) -> dict[str, TensorSpec]:
        return gaussian_state_spec()

    def load_state_dict(self, state: dict[str, Tensor]) -> GaussianDetector:
        super().load_state_dict({k: v.to(torch.float64) for k, v in state.items() if k not in _GAUSSIAN})
        self.gaussian.load_state_dict({k: state[k] for k in _GAUSSIAN})
        return self

    def to(self, device=None, dtype=None) -> GaussianDetector:
        return self.load_state_dict({k: v.to(device) for k, v in self.state_dict().items()})


class Mahalanobis(GaussianDetector):
    """Mahalanobis distance (Lee et al. 2018): score ``(N,)`` ``min_c (z−μ_c)ᵀΣ⁻¹(z−μ_c)``, class means and the MLE
    covariance of class-centred features (OpenOOD's MDS, HEAT's ``maha``; pytorch-ood's ``0.5·score/N`` ranks the
    same). With ``normalize=True`` it is SSD+ (Sehwag et al. 2021; thesis Table 5.1 "GMM", Table 5.5 "SSD+").

    Args:
        normalize: L2-normalise features (SSD+).
        reg: Relative ridge on the covariance (see :class:`~pml_suprank.ood.priors.ClassConditionalGaussian`).
    """

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return self.gaussian.min_mahalanobis(self._check_z(features))


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
