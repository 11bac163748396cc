"""HEAT's built-in priors (Lafon et al., ICML 2023; thesis Sec. 5.2.2): GMM, GMM_std and EL.

* ``"gmm"`` — :class:`GMMPrior`: the class-conditional Gaussian mixture with one shared covariance on L2-normalised
  avg-pooled features ``z`` (the *feature prior*, SSD+);
* ``"gmm_std"`` — :class:`GMMStdPrior`: the same density on L2-normalised std-pooled "style" features ``σ``;
* ``"el"`` — :class:`ELPrior`: the energy of the logits ``−logsumexp(Wz + b)`` on raw ``z`` (the *class prior*),
  whose head comes from HEAT (it is saved once, as HEAT's ``head.weight`` / ``head.bias``).

The densities themselves live in :mod:`.priors` (shared with the Mahalanobis baseline); these classes add what
HEAT needs to know about them (:class:`~pml_suprank.ood.prior.Prior`).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from .prior import Prior
from .priors import ClassConditionalGaussian, EnergyLogitsPrior

__all__ = ["GMMPrior", "GMMStdPrior", "ELPrior"]


class GMMPrior(ClassConditionalGaussian, Prior, name="gmm"):
    """Feature prior ``E(ẑ) = −log Σ_c π_c N(ẑ; μ_c, Σ)`` on ``ẑ = z/‖z‖``, ``z`` the avg-pooled features.

    Energies are scored in float64; during training (SGLD and the loss) they are evaluated in the feature dtype,
    where only the gradient of ``E/T_k`` matters. Its SGLD proposal samples the mixture itself.

    Args:
        reg: Relative ridge added to the shared covariance (times its mean variance).
    """

    needs_labels = True

    def __init__(self, reg: float = 1e-6) -> None:
        super().__init__(normalize=True, reg=reg)

    @classmethod
    def create(cls, *, weight: Tensor | None = None, bias: Tensor | None = None, reg: float = 1e-6) -> GMMPrior:
        return cls(reg=reg)

    def training_energy(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N,)`` ``−log q(ẑ)`` computed in ``z``'s dtype (not float64)."""
        return self.neg_log_likelihood(z, compute_dtype=z.dtype)


class GMMStdPrior(GMMPrior, name="gmm_std"):
    """:class:`GMMPrior` on the std-pooled features ``σ`` (``std_features=`` of ``fit`` / ``score``)."""

    source = "std_features"


class ELPrior(EnergyLogitsPrior, Prior, name="el"):
    """Class prior ``E(z) = −logsumexp(Wz + b)`` on raw features (Liu et al. 2020, Eq. 7 with ``T = 1``).

    It has nothing to fit; its SGLD proposal is ``N(0, I)`` (EL is not a normalised density one can sample).

    Args:
        weight: ``(C, D)`` classifier weight.
        bias: ``(C,)`` classifier bias or ``None``.
    """

    needs_head = True

    @classmethod
    def create(cls, *, weight: Tensor | None = None, bias: Tensor | None = None, reg: float = 1e-6) -> ELPrior:
        if weight is None:
            raise ValueError("the 'el' prior needs the classifier head: pass weight=/bias= or head= to HEAT")
        return cls(weight, bias)

    def check(self, features: Tensor) -> None:
        if features.shape[1] != self.weight.shape[1]:
            raise ValueError(
                f"features have {features.shape[1]} columns but the classifier weight expects {self.weight.shape[1]}"
            )

    def state_dict(self) -> dict[str, Tensor]:
        """Nothing: the head is HEAT's state (``head.weight`` / ``head.bias``)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> ELPrior:
        return Prior.load_state_dict(self, state)
