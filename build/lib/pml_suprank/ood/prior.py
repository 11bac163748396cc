"""The ``Prior`` contract of HEAT: one class per prior energy, registered by name when it is defined.

HEAT (Lafon et al., "Hybrid Energy Based Model in the Feature Space for Out-of-Distribution Detection", ICML 2023)
refines each prior energy ``E_k`` with a residual EBM, ``E_h,k(z) = E_θk(z) + E_k(z)/T_k`` (Eq. 5.2 of the thesis),
trains ``E_θk`` by contrastive divergence against SGLD samples started from the prior (Eqs. 5.3-5.5), and composes
the standardised hybrid energies (Eq. 5.7). Everything HEAT needs to know about a prior is a :class:`Prior`:

* which input it reads (``source``: the keyword of ``fit`` / ``score``, e.g. ``"features"`` or ``"std_features"``),
  whether it needs class labels (``needs_labels``) or the classifier head (``needs_head``), and whether features are
  L2-normalised before the prior and the residual (``normalize``);
* how to build it (:meth:`Prior.create`), fit it, check inputs before any training (:meth:`Prior.check`);
* its energy for scoring (:meth:`Prior.energy`) and during training (:meth:`Prior.training_energy`), and the SGLD
  starting points (:meth:`Prior.sample`);
* its fitted state (:meth:`Prior.state_dict` / :meth:`Prior.load_state_dict`, saved under ``"<name>.prior."``) and
  its default hyper-parameters per HEAT preset (:meth:`Prior.default_settings`).

A new prior is one subclass with a ``name=`` class keyword; ``ood.HEAT(priors=("gmm", "mean_distance"))`` then uses
it (a saved HEAT stores the prior names: define the class before ``Detector.from_pretrained``)::

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

from .presets import PRESETS
from .registry import PRIOR_REGISTRY

__all__ = ["Prior"]


class Prior(ABC):
    """Base class of HEAT's priors: an energy ``E(z)`` ``(N, D) -> (N,)`` (higher = more OOD) one can sample from.

    Subclasses defined with ``name="..."`` are registered (``ood.list_priors()``); an intermediate class without a
    name is not. Class attributes describe the prior's inputs; methods without a default implementation are
    :meth:`energy` and :meth:`sample`.
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

    # --- construction ---------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, *, weight: Tensor | None = None, bias: Tensor | None = None, reg: float = 1e-6) -> Prior:
        """Build an unfitted prior from HEAT's arguments: the head ``(C, D)`` / ``(C,)`` and the covariance ridge.

        The default ignores them and calls ``cls()``; priors with constructor arguments override this.
        """
        return cls()

    @classmethod
    def default_settings(cls, preset: str) -> Mapping[str, Any]:
        """HEAT hyper-parameters of this prior for ``preset`` (its ``PRESETS`` entry, else ``settings_like``'s)."""
        table = PRESETS[preset]
        return table[cls.name] if cls.name in table else table[cls.settings_like]

    # --- fit ------------------------------------------------------------------------------------------------------
    def check(self, features: Tensor) -> None:
        """Validate the (checked) ``(N, D)`` source features before any prior is fitted; default: nothing."""
        return None

    def fit(self, features: Tensor, labels: Tensor | None = None) -> Prior:
        """Fit on ``(N, D)`` source features (and ``(N,)`` labels when ``needs_labels``). Default: nothing to fit."""
        return self

    # --- energies -------------------------------------------------------------------------------------------------
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

    # --- state ----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """Fitted tensors (saved by HEAT under ``"<name>.prior."``); default: none."""
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> Prior:
        """Restore :meth:`state_dict`; the default accepts only an empty state."""
        if state:
            raise ValueError(f"state has keys unknown to the {self.name!r} prior: {sorted(state)}")
        return self
