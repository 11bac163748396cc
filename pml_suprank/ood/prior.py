"""HEAT's priors: the :class:`Prior` contract and the built-in ``"gmm"``, ``"gmm_std"`` and ``"el"`` priors.

HEAT (Lafon et al., ICML 2023; thesis ch. 5) refines each prior energy ``E_k`` with a residual EBM,
``E_h,k(z) = E_θk(z) + E_k(z)/T_k`` (Eq. 5.2), trained by contrastive divergence against SGLD samples started from
the prior (Eqs. 5.3-5.5). A prior says which input it reads (``source``), whether it needs labels or the classifier
head, and gives its energy, SGLD starting points, state and preset settings. A new prior is one subclass with a
``name=`` class keyword; ``ood.HEAT(priors=("gmm", "mean_distance"))`` then uses it (define the class before
``Detector.from_pretrained``)::

    class MeanDistancePrior(ood.Prior, name="mean_distance"):
        def fit(self, features, labels=None):
            self.mean = features.mean(0)
            return self
        def energy(self, z):                       # (N, D) -> (N,), higher = more OOD
            return (z - self.mean.to(z)).pow(2).sum(-1)
        def sample(self, n, generator, device=None, dtype=torch.float32):
            return self.mean.to(device, dtype) + torch.randn(n, self.dim, generator=generator).to(device, dtype)
        @property
        def dim(self):
            return self.mean.shape[0]
        def state_dict(self):
            return {"mean": self.mean}
        def load_state_dict(self, state):
            self.mean = state["mean"]
            return self
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from ..hub.schema import TensorSpec
from .head import head_params, linear_logits
from .presets import PRESETS
from .priors import ClassConditionalGaussian, energy_logits, gaussian_state_spec
from .registry import PRIOR_REGISTRY

__all__ = ["Prior", "GMMPrior", "GMMStdPrior", "ELPrior"]


class Prior(ABC):
    """Base class of HEAT's priors: an energy ``E(z)`` ``(N, D) -> (N,)`` (higher = more OOD) one can sample from.

    Subclasses defined with ``name="..."`` are registered (``ood.list_priors()``); :meth:`energy` and :meth:`sample`
    have no default.
    """

    #: Registered name (``"gmm"``, ``"gmm_std"``, ``"el"``, ...); ``None`` for unregistered base classes.
    name: ClassVar[str | None] = None
    #: The ``fit`` / ``score`` keyword whose ``(N, D)`` tensor this prior reads.
    source: ClassVar[str] = "features"
    #: Whether :meth:`fit` needs class labels (HEAT then requires ``labels=``).
    needs_labels: ClassVar[bool] = False
    #: Whether :meth:`create` needs the classifier head (HEAT then requires ``weight=`` / ``head=``).
    needs_head: ClassVar[bool] = False
    #: L2-normalise features before the prior, the residual MLP and SGLD (which then stays on the sphere).
    normalize: bool = False
    #: Built-in prior whose preset hyper-parameters a prior without its own entry in ``PRESETS`` uses.
    settings_like: ClassVar[str] = "gmm"

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
            PRIOR_REGISTRY.register(name, cls)

    @classmethod
    def create(cls, *, weight: Tensor | None = None, bias: Tensor | None = None, reg: float = 1e-6) -> Prior:
        """An unfitted prior from HEAT's head ``(C, D)`` / ``(C,)`` and covariance ridge (default: ``cls()``)."""
        return cls()

    @classmethod
    def default_settings(cls, preset: str) -> Mapping[str, Any]:
        """HEAT hyper-parameters of this prior for ``preset`` (its ``PRESETS`` entry, else ``settings_like``'s)."""
        table = PRESETS[preset]
        return table[cls.name] if cls.name in table else table[cls.settings_like]

    def check(self, features: Tensor) -> None:
        """Validate the ``(N, D)`` source features before any prior is fitted; default: nothing."""
        return None

    def fit(self, features: Tensor, labels: Tensor | None = None) -> Prior:
        """Fit on ``(N, D)`` source features (and ``(N,)`` labels when ``needs_labels``). Default: nothing to fit."""
        return self

    @abstractmethod
    def energy(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N,)`` prior energy used for scoring, differentiable in ``z`` (SGLD follows its gradient)."""

    def training_energy(self, z: Tensor) -> Tensor:
        """The energy used inside training (SGLD and the loss); default :meth:`energy`."""
        return self.energy(z)

    @abstractmethod
    def sample(
        self, n: int, generator: torch.Generator, device: torch.device | str | None = None, dtype=torch.float32
    ) -> Tensor:
        """``(n, D)`` SGLD starting points drawn with ``generator`` (in the normalised space when ``normalize``)."""

    @property
    def dim(self) -> int:
        """Feature dimension ``D`` (read after :meth:`load_state_dict` to rebuild the residual MLP)."""
        raise NotImplementedError(f"{type(self).__name__} does not define dim; HEAT needs it to load a saved model")

    def state_dict(self) -> dict[str, Tensor]:
        """Fitted tensors (saved by HEAT under ``"<name>.prior."``); default: none."""
        return {}

    @classmethod
    def state_spec(cls) -> Mapping[str, Any] | None:
        """Layout of :meth:`state_dict` as ``{name: TensorSpec}`` (``"D"`` = the feature dimension), checked when a
        saved HEAT is loaded; ``None`` (default): only finiteness is checked, :meth:`load_state_dict` does the rest."""
        return None

    def load_state_dict(self, state: Mapping[str, Tensor]) -> Prior:
        """Restore :meth:`state_dict`; the default accepts only an empty state."""
        if state:
            raise ValueError(f"state has keys unknown to the {self.name!r} prior: {sorted(state)}")
        return self


class GMMPrior(ClassConditionalGaussian, Prior, name="gmm"):
    """Feature prior ``E(ẑ) = −log Σ_c π_c N(ẑ; μ_c, Σ)`` on ``ẑ = z/‖z‖``, ``z`` the avg-pooled features (SSD+).

    Scored in float64; during training (SGLD and the loss) evaluated in the feature dtype, where only the gradient
    of ``E/T_k`` matters. Its SGLD proposal samples the mixture.

    Args:
        reg: Relative ridge added to the shared covariance (times its mean variance).
    """

    needs_labels = True

    def __init__(self, reg: float = 1e-6) -> None:
        super().__init__(normalize=True, reg=reg)

    @classmethod
    def create(cls, *, weight: Tensor | None = None, bias: Tensor | None = None, reg: float = 1e-6) -> GMMPrior:
        return cls(reg=reg)

    @classmethod
    def state_spec(cls) -> dict[str, TensorSpec]:
        return gaussian_state_spec()

    def training_energy(self, z: Tensor) -> Tensor:
        return self.neg_log_likelihood(z, compute_dtype=z.dtype)


class GMMStdPrior(GMMPrior, name="gmm_std"):
    """:class:`GMMPrior` on the std-pooled "style" features ``σ`` (``std_features=`` of ``fit`` / ``score``)."""

    source = "std_features"


class ELPrior(Prior, name="el"):
    """Class prior ``E(z) = −logsumexp(Wz + b)`` on raw features (Liu et al. 2020, Eq. 7 with ``T = 1``).

    Nothing to fit; its SGLD proposal is ``N(0, I)`` (EL is not a normalised density one can sample). The head is
    saved once, as HEAT's ``head.weight`` / ``head.bias``.

    Args:
        weight: ``(C, D)`` classifier weight.
        bias: ``(C,)`` classifier bias or ``None``.
    """

    needs_head = True

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.weight, self.bias = head_params(weight, bias, None)

    @classmethod
    def create(cls, *, weight: Tensor | None = None, bias: Tensor | None = None, reg: float = 1e-6) -> ELPrior:
        if weight is None:
            raise ValueError("the 'el' prior needs the classifier head: pass weight=/bias= or head= to HEAT")
        return cls(weight, bias)

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

    def check(self, features: Tensor) -> None:
        if features.shape[1] != self.dim:
            raise ValueError(f"features have {features.shape[1]} columns but the classifier weight expects {self.dim}")

    def energy(self, z: Tensor) -> Tensor:
        return energy_logits(linear_logits(z, self.weight, self.bias))

    def sample(self, n: int, generator: torch.Generator, device=None, dtype=torch.float32) -> Tensor:
        return torch.randn(n, self.dim, generator=generator, device=device, dtype=dtype)

    @classmethod
    def state_spec(cls) -> dict[str, TensorSpec]:
        return {}
