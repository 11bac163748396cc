"""HEAT's priors (Lafon et al., ICML 2023; thesis ch. 5) as energies (higher = more OOD): the :class:`Prior`
contract, the built-in ``"gmm"``, ``"gmm_std"`` and ``"el"`` priors, their hyper-parameters per preset
(:data:`PRESETS`: prior temperature ``T_k``, Eq. 5.2; SGLD steps / step size / noise, Eq. 5.4; control weight ``λ``,
Eq. 5.5; optimiser and MLP shape), and the class-conditional Gaussian shared with the Mahalanobis baselines.

Each prior energy ``E_k`` is refined by a residual EBM, ``E_h,k(z) = E_θk(z) + E_k(z)/T_k`` (Eq. 5.2). Unlike the
authors' code (1e-12 in float32), the Gaussian's covariance is the MLE of class-centred features in **float64** with a
relative ridge ``reg · mean(diag Σ)``; distances are computed in float64 in the whitened space ``y = L⁻¹z``.

A new prior is one subclass with a ``name=`` class keyword, defined before ``Detector.from_pretrained``;
``ood.HEAT(priors=("gmm", "mean_distance"))`` then uses it::

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

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from .._registry import Registry
from .._validation import check_bool, check_positive
from ..hub.schema import TensorSpec
from .base import check_class_labels, check_features, energy_logits, head_params, linear_logits

__all__ = [
    "PRESETS",
    "PRIOR_REGISTRY",
    "ClassConditionalGaussian",
    "ELPrior",
    "GMMPrior",
    "GMMStdPrior",
    "Prior",
    "energy_logits",
    "get_prior",
    "list_priors",
    "unit_rows",
]

# fmt: off
_COMMON = {"hidden_dim": 1024, "n_hidden_layers": 4, "reduce_width": False, "eps_data": 1e-4, "end_factor": 0.1,
           "gamma": 0.1, "accumulation_steps": 1}
_GMM_C10 = {**_COMMON, "prior_temperature": 1e3, "sgld_steps": 40, "step_size": 1e-4, "noise_std": 5e-3,
            "l2_coef": 10.0, "lr": 1e-5, "epochs": 20, "batch_size": 1024, "milestones": (10,)}
_GMM_C100 = {**_GMM_C10, "sgld_steps": 20, "step_size": 2e-4, "noise_std": 1e-3, "l2_coef": 20.0}
_GMM_IN = {**_COMMON, "reduce_width": True, "n_hidden_layers": 6, "prior_temperature": 5e3, "sgld_steps": 10,
           "step_size": 1e-7, "noise_std": 1e-4, "l2_coef": 10.0, "lr": 1e-4, "epochs": 8, "batch_size": 256,
           "milestones": (1,), "accumulation_steps": 20}
_GMM_FAST = {**_GMM_C10, "hidden_dim": 256, "sgld_steps": 5, "lr": 1e-4, "epochs": 1}

#: Per-prior hyper-parameters of the HEAT authors' released configs and scripts (CIFAR-10, CIFAR-100, ImageNet; they
#: differ from the thesis text, which quotes 20 SGLD steps, lr 5e-6 and λ = 10 everywhere). ``fast`` is a CPU preset
#: for 50,000 × 512 features: narrower MLP, few SGLD steps, one epoch, larger learning rate.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cifar10": {
        "gmm": _GMM_C10,
        "gmm_std": {**_GMM_C10, "sgld_steps": 1},
        "el": {**_COMMON, "prior_temperature": 1.0, "sgld_steps": 50, "step_size": 0.1, "noise_std": 0.1,
               "l2_coef": 0.1, "lr": 1e-5, "epochs": 20, "batch_size": 256, "milestones": (10,)},
    },
    "cifar100": {
        "gmm": _GMM_C100,
        "gmm_std": dict(_GMM_C100),
        "el": {**_COMMON, "prior_temperature": 1.0, "sgld_steps": 200, "step_size": 0.1, "noise_std": 1e-2,
               "l2_coef": 1.0, "lr": 1e-5, "epochs": 8, "batch_size": 1024, "milestones": (10,)},
    },
    "imagenet": {
        "gmm": _GMM_IN,
        "gmm_std": {**_GMM_IN, "sgld_steps": 0, "step_size": 1e-4, "l2_coef": 40.0},
        "el": {**_COMMON, "reduce_width": True, "prior_temperature": 5e2, "sgld_steps": 40, "step_size": 1e3,
               "noise_std": 1e-3, "l2_coef": 20.0, "lr": 1e-5, "epochs": 8, "batch_size": 256, "milestones": (1000,),
               "gamma": 0.9, "accumulation_steps": 10},
    },
    "fast": {
        "gmm": _GMM_FAST,
        "gmm_std": {**_GMM_FAST, "sgld_steps": 1},
        "el": {**_GMM_FAST, "prior_temperature": 1.0, "step_size": 0.1, "noise_std": 0.1, "l2_coef": 0.1},
    },
}
# fmt: on

#: Name -> :class:`Prior` subclass, filled by subclassing with ``name=`` (``"gmm"``, ``"gmm_std"``, ``"el"``, ...).
PRIOR_REGISTRY = Registry("HEAT prior")
list_priors = PRIOR_REGISTRY.names
get_prior = PRIOR_REGISTRY.get_class


def gaussian_state_spec() -> dict[str, TensorSpec]:
    """Layout of a fitted :class:`ClassConditionalGaussian`: ``means`` ``(C, D)``, ``class_weights`` ``(C,)``,
    ``cholesky`` ``(D, D)`` (lower triangular) and integer ``classes`` ``(C,)``, ``C >= 2``."""
    return {
        "means": TensorSpec(("C", "D")),
        "class_weights": TensorSpec(("C",), nonzero=True, min_value=0.0, min_sizes=(("C", 2),)),
        "cholesky": TensorSpec(("D", "D"), lower_triangular=True),
        "classes": TensorSpec(("C",), kind="integer", min_value=0),
    }


def degenerate_variance(second_moment: Tensor | float, dtype: torch.dtype, factor: float = 16.0) -> Tensor | float:
    """``(factor · eps(dtype))² · second_moment``: a variance at or below it is rounding noise of values whose mean
    square is ``second_moment`` (degenerate)."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps
    return (factor * eps) ** 2 * second_moment


def unit_rows(z: Tensor) -> Tensor:
    """``(N, D)`` rows scaled to unit L2 norm at any magnitude (zero rows stay zero): each row is first divided by its
    largest absolute entry (held constant for autograd), as ``F.normalize`` fails below norm ``1e-12``."""
    peak = z.detach().abs().amax(dim=-1, keepdim=True)
    return torch.nn.functional.normalize(z / torch.where(peak > 0, peak, torch.ones_like(peak)), dim=-1, eps=1e-12)


def power_of_two_exponent(z: Tensor) -> int:
    """``k`` with ``max|z| · 2**-k`` in ``[1, 2)`` (0 for an all-zero or non-finite ``z``; within ``±1000``): dividing
    by ``2**k`` is exact."""
    peak = float(z.abs().amax()) if z.numel() else 0.0
    if peak == 0.0 or not math.isfinite(peak):
        return 0
    return max(-1000, min(1000, math.floor(math.log2(peak))))


def finite_scores(scores: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    """``scores`` (float64) in ``dtype``, those beyond its range saturated at ``±finfo(dtype).max`` (NaN: ``+max``,
    the most OOD) with one warning: inputs at a scale far from the fitted features' are answered, ranked most OOD."""
    info = torch.finfo(dtype)
    wide = torch.nan_to_num(scores.to(torch.float64), nan=math.inf)
    over = wide.abs() > info.max
    if bool(over.any()):
        peak = float(wide.abs().max())
        warnings.warn(
            f"{name} scores of {int(over.sum())} of {wide.shape[0]} inputs exceed "
            f"{str(dtype).removeprefix('torch.')} (largest {peak:.3g}) and are saturated at ±{info.max:.3g} (ranked "
            "most OOD): those inputs lie at a scale far from the features the detector was fitted on (same model "
            "and preprocessing?); pass float64 features for exact scores",
            RuntimeWarning,
            stacklevel=3,
        )
    return wide.clamp(-info.max, info.max).to(dtype)


def shared_gaussian(z: Tensor, inverse: Tensor, counts: Tensor, reg: float, dtype: torch.dtype):
    """``(means (C, D), cholesky (D, D))`` of the float64 rows ``z`` ``(N, D)`` in groups ``inverse`` ``(N,)`` of sizes
    ``counts`` ``(C,)``: group means and the factor ``L`` of their shared MLE covariance plus ``reg · mean(diag Σ)``,
    fitted on ``z / 2**k`` (max entry in [1, 2)) and scaled back exactly.

    Raises:
        ValueError: the within-group variance is at most the rounding level of ``dtype`` features (constant
            features), or the covariance is not positive definite.
    """
    k = power_of_two_exponent(z)
    z = z * 2.0**-k
    sums = torch.zeros(counts.numel(), z.shape[1], dtype=z.dtype, device=z.device).index_add(0, inverse, z)
    means = sums / counts.unsqueeze(1).to(z.dtype)
    centred = z - means[inverse]
    cov = centred.T @ centred / z.shape[0]  # MLE, as np.cov(bias=True) in the reference
    scale = torch.diagonal(cov).mean()
    second_moment = (z * z).sum(1).mean() / z.shape[1]
    if not bool(scale > degenerate_variance(second_moment, dtype)):
        raise ValueError(
            "features have zero variance within every class (at most the rounding level of their "
            f"{dtype} values); cannot fit a Gaussian prior: constant or duplicated features?"
        )
    ridge = reg * scale + torch.finfo(z.dtype).tiny
    chol, info = torch.linalg.cholesky_ex(cov + ridge * torch.eye(z.shape[1], dtype=z.dtype, device=z.device))
    if int(info) != 0:
        raise ValueError(f"the shared covariance is not positive definite even with reg={reg}; increase reg")
    return means * 2.0**k, chol * 2.0**k


class ClassConditionalGaussian:
    """Class-conditional Gaussian mixture with one shared covariance (HEAT's GMM prior, SSD+, Mahalanobis).

    ``q(z) = Σ_c π_c N(z; μ_c, Σ)``, ``π_c = n_c / N``; energy ``−log q(ẑ)`` (``ẑ = z/‖z‖`` when ``normalize``);
    ``min_mahalanobis`` is the SSD+ / Mahalanobis score ``min_c (z−μ_c)ᵀΣ⁻¹(z−μ_c)``.

    Args:
        normalize: L2-normalise features before fitting and scoring (HEAT GMM / SSD+: True; Mahalanobis: False).
        reg: Relative ridge added to the covariance diagonal, times its mean variance.
        chunk_size: Rows processed at once when scoring (bounds memory at ``chunk_size × C`` float64).
    """

    def __init__(self, normalize: bool = True, reg: float = 1e-6, chunk_size: int = 8192) -> None:
        self.normalize = check_bool("normalize", normalize)
        self.reg = check_positive("reg", reg, strict=False)
        self.chunk_size = int(check_positive("chunk_size", chunk_size))
        self.means: Tensor | None = None
        self.class_weights: Tensor | None = None
        self.cholesky: Tensor | None = None
        self.classes: Tensor | None = None

    @property
    def dim(self) -> int:
        if self.means is None:
            raise RuntimeError("ClassConditionalGaussian is not fitted")
        return self.means.shape[1]

    def _prep(self, z: Tensor) -> Tensor:
        z = z.to(torch.float64)
        return unit_rows(z) if self.normalize else z

    @torch.no_grad()
    def fit(self, features: Tensor, labels: Tensor) -> ClassConditionalGaussian:
        """Fit class means, weights and the shared covariance on ``(N, D)`` features and ``(N,)`` labels."""
        features = check_features("features", features)
        labels = check_class_labels(labels, features.shape[0])
        z = self._prep(features.detach())
        classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
        self.means, self.cholesky = shared_gaussian(z, inverse, counts, self.reg, features.dtype)
        self.classes, self.class_weights = classes, counts.to(z.dtype) / z.shape[0]
        self._cache = None
        return self

    def _whitening(self, device, dtype=torch.float64) -> tuple[Tensor, Tensor, Tensor]:
        if self.means is None:
            raise RuntimeError("ClassConditionalGaussian is not fitted")
        cache = getattr(self, "_cache", None) or {}
        key = (str(torch.device(device)), dtype)
        if key not in cache:
            chol = self.cholesky.to(device=device, dtype=torch.float64)
            eye = torch.eye(chol.shape[0], dtype=torch.float64, device=device)
            inv_l = torch.linalg.solve_triangular(chol, eye, upper=False)  # L⁻¹, always inverted in float64
            nu = self.means.to(device=device, dtype=torch.float64) @ inv_l.T
            cache[key] = tuple(t.to(dtype) for t in (inv_l, nu, (nu * nu).sum(-1)))
            self._cache = cache
        return cache[key]

    def mahalanobis(self, z: Tensor, compute_dtype: torch.dtype = torch.float64) -> Tensor:
        """``(N, D) -> (N, C)`` squared Mahalanobis distances to each class mean (differentiable), expanded as a
        matrix product in ``compute_dtype`` (float32 cancellation is visible in scores, not in SGLD gradients)."""
        inv_l, nu, nu_sq = self._whitening(z.device, compute_dtype)
        outs = []
        for part in z.split(self.chunk_size):
            y = self._prep(part).to(compute_dtype) @ inv_l.T
            outs.append(((y * y).sum(-1, keepdim=True) - 2.0 * y @ nu.T + nu_sq).clamp_min(0.0))
        return torch.cat(outs)

    def neg_log_likelihood(self, z: Tensor, compute_dtype: torch.dtype = torch.float64) -> Tensor:
        """``(N, D) -> (N,)`` ``−log q(ẑ)`` with the full Gaussian normaliser and class weights."""
        maha = self.mahalanobis(z, compute_dtype)
        log_w = torch.log(self.class_weights.to(device=z.device, dtype=compute_dtype))
        half_log_det = torch.log(torch.diagonal(self.cholesky)).sum().to(device=z.device, dtype=compute_dtype)
        log_q = torch.logsumexp(log_w - 0.5 * maha, dim=-1) - 0.5 * self.dim * math.log(2 * math.pi) - half_log_det
        return (-log_q).to(z.dtype)

    energy = neg_log_likelihood

    def min_mahalanobis(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N,)`` ``min_c`` squared Mahalanobis distance in ``z``'s dtype (:func:`finite_scores`)."""
        return finite_scores(self.mahalanobis(z).min(dim=-1).values, z.dtype, "Mahalanobis")

    def sample(self, n: int, generator: torch.Generator, device=None, dtype=torch.float32) -> Tensor:
        """``(n, D)`` draws ``μ_c + L·ε``, ``c ~ Categorical(π)`` (untempered ``q``, as the reference)."""
        gen_device = generator.device
        idx = torch.multinomial(self.class_weights.to(gen_device), n, replacement=True, generator=generator)
        eps = torch.randn(n, self.dim, generator=generator, device=gen_device, dtype=torch.float64)
        z = self.means.to(gen_device)[idx] + eps @ self.cholesky.to(gen_device).T
        return z.to(device=device, dtype=dtype)

    def state_dict(self) -> dict[str, Tensor]:
        if self.means is None:
            return {}
        return {k: getattr(self, k).contiguous() for k in ("means", "class_weights", "cholesky", "classes")}

    def load_state_dict(self, state: dict[str, Tensor]) -> ClassConditionalGaussian:
        self.means, self.class_weights = state["means"].to(torch.float64), state["class_weights"].to(torch.float64)
        self.cholesky, self.classes = state["cholesky"].to(torch.float64), state["classes"]
        self._cache = None
        return self


class Prior(ABC):
    """Base class of HEAT's priors: an energy ``E(z)`` ``(N, D) -> (N,)`` (higher = more OOD) one can sample from.

    Subclasses defined with ``name="..."`` are registered (``ood.list_priors()``; example in the module docstring).
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

    Scored in float64, in the feature dtype during training. Its SGLD proposal samples the mixture. ``reg``: relative
    ridge of the shared covariance.
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
    """Class prior ``E(z) = −logsumexp(Wz + b)`` on raw features (Liu et al. 2020, Eq. 7 with ``T = 1``) of the
    classifier head ``weight`` ``(C, D)`` / ``bias`` ``(C,)`` (saved once, as HEAT's ``head.weight`` / ``head.bias``).
    Nothing to fit; its SGLD proposal is ``N(0, I)`` (EL is not a normalised density one can sample)."""

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
