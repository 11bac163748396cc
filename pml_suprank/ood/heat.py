"""HEAT: Hybrid Energy-based model in the feATure space for post-hoc OOD detection.

Lafon, Ramzi, Rambour, Thome, "Hybrid Energy Based Model in the Feature Space for Out-of-Distribution Detection",
ICML 2023; thesis ch. 5 (Eqs. 5.1-5.7, Algorithm 2, Tables 5.1-5.6). Each prior ``k`` (EL on logits, GMM on
avg-pooled and GMM_std on std-pooled features) is refined by a residual EBM ``E_θk`` (:mod:`.ebm`); the hybrid
energies are standardised and composed by ``E_β = (1/β)·log Σ_k exp(β·s̃_k)`` (Eq. 5.7), ``β = 0`` meaning the sum.

Deviations from the reference code (``spec/heat_reference.md``), all deliberate:

* **Standardisation** uses the mean and unbiased std of each hybrid energy over the **whole** training set; the
  reference uses one shuffled batch of 256 (spec §8, ``DESIGN.md`` §2). Identical when the training set is one batch.
* **Untied hidden layers** by default (``tie_hidden_weights=True`` reproduces the reference's shared layer, spec §4).
* **GMM covariance** in float64 with a relative ridge (see :mod:`.priors`); GMM energies are scored in float64 but
  evaluated in the feature dtype inside training (SGLD and the loss), where only ``∇(E/T_G)`` matters.
* **Randomness** comes from ``seed`` through explicit generators (the reference uses the global RNG).
* ImageNet-specific reference options: the 20-layer pyramid MLP (``reduce_width``) is available (and set by the
  ``"imagenet"`` preset, as gradient accumulation); not implemented are the tempered batch-statistics proposal
  (``base_dist_temp``) and the per-sample "simplified Mahalanobis" SGLD energy.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from .._validation import check_choice, check_positive
from .base import Detector, NotFittedError, check_class_labels, check_features
from .baselines import _head_params
from .ebm import ResidualEnergyMLP, train_residual
from .priors import ClassConditionalGaussian, EnergyLogitsPrior

__all__ = ["HEAT", "PriorName", "PRESETS", "compose_energies", "standardize"]

PriorName = Literal["gmm", "gmm_std", "el"]
Preset = Literal["cifar10", "cifar100", "imagenet", "fast"]

# fmt: off
_COMMON = {"hidden_dim": 1024, "n_hidden_layers": 4, "reduce_width": False, "eps_data": 1e-4, "end_factor": 0.1,
           "gamma": 0.1, "accumulation_steps": 1}

#: Per-prior hyper-parameters (spec §10, from the reference configs and scripts). ``fast`` is a CPU preset for
#: 50,000 × 512 features: narrower MLP, few SGLD steps, one epoch, larger learning rate.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cifar10": {
        "gmm": {**_COMMON, "prior_temperature": 1e3, "sgld_steps": 40, "step_size": 1e-4, "noise_std": 5e-3,
                "l2_coef": 10.0, "lr": 1e-5, "epochs": 20, "batch_size": 1024, "milestones": (10,)},
        "gmm_std": {**_COMMON, "prior_temperature": 1e3, "sgld_steps": 1, "step_size": 1e-4, "noise_std": 5e-3,
                    "l2_coef": 10.0, "lr": 1e-5, "epochs": 20, "batch_size": 1024, "milestones": (10,)},
        "el": {**_COMMON, "prior_temperature": 1.0, "sgld_steps": 50, "step_size": 0.1, "noise_std": 0.1,
               "l2_coef": 0.1, "lr": 1e-5, "epochs": 20, "batch_size": 256, "milestones": (10,)},
    },
    "cifar100": {
        "gmm": {**_COMMON, "prior_temperature": 1e3, "sgld_steps": 20, "step_size": 2e-4, "noise_std": 1e-3,
                "l2_coef": 20.0, "lr": 1e-5, "epochs": 20, "batch_size": 1024, "milestones": (10,)},
        "gmm_std": {**_COMMON, "prior_temperature": 1e3, "sgld_steps": 20, "step_size": 2e-4, "noise_std": 1e-3,
                    "l2_coef": 20.0, "lr": 1e-5, "epochs": 20, "batch_size": 1024, "milestones": (10,)},
        "el": {**_COMMON, "prior_temperature": 1.0, "sgld_steps": 200, "step_size": 0.1, "noise_std": 1e-2,
               "l2_coef": 1.0, "lr": 1e-5, "epochs": 8, "batch_size": 1024, "milestones": (10,)},
    },
    "imagenet": {
        "gmm": {**_COMMON, "reduce_width": True, "n_hidden_layers": 6, "prior_temperature": 5e3, "sgld_steps": 10,
                "step_size": 1e-7, "noise_std": 1e-4, "l2_coef": 10.0, "lr": 1e-4, "epochs": 8, "batch_size": 256,
                "milestones": (1,), "accumulation_steps": 20},
        "gmm_std": {**_COMMON, "reduce_width": True, "n_hidden_layers": 6, "prior_temperature": 5e3,
                    "sgld_steps": 0, "step_size": 1e-4, "noise_std": 1e-4, "l2_coef": 40.0, "lr": 1e-4, "epochs": 8,
                    "batch_size": 256, "milestones": (1,), "accumulation_steps": 20},
        "el": {**_COMMON, "reduce_width": True, "prior_temperature": 5e2, "sgld_steps": 40, "step_size": 1e3,
               "noise_std": 1e-3, "l2_coef": 20.0, "lr": 1e-5, "epochs": 8, "batch_size": 256, "milestones": (1000,),
               "gamma": 0.9, "accumulation_steps": 10},
    },
    "fast": {
        "gmm": {**_COMMON, "hidden_dim": 256, "prior_temperature": 1e3, "sgld_steps": 5, "step_size": 1e-4,
                "noise_std": 5e-3, "l2_coef": 10.0, "lr": 1e-4, "epochs": 1, "batch_size": 1024, "milestones": (10,)},
        "gmm_std": {**_COMMON, "hidden_dim": 256, "prior_temperature": 1e3, "sgld_steps": 1, "step_size": 1e-4,
                    "noise_std": 5e-3, "l2_coef": 10.0, "lr": 1e-4, "epochs": 1, "batch_size": 1024,
                    "milestones": (10,)},
        "el": {**_COMMON, "hidden_dim": 256, "prior_temperature": 1.0, "sgld_steps": 5, "step_size": 0.1,
               "noise_std": 0.1, "l2_coef": 0.1, "lr": 1e-4, "epochs": 1, "batch_size": 1024, "milestones": (10,)},
    },
}
# fmt: on
SETTING_KEYS = frozenset(PRESETS["cifar10"]["gmm"])


def standardize(energies: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """``(E − m)/s`` per column; ``energies`` ``(N, K)``, ``mean`` and ``std`` ``(K,)``."""
    return (energies - mean) / std


def compose_energies(energies: Tensor, beta: float) -> Tensor:
    """Energy composition, thesis Eq. 5.7: ``(1/β)·logsumexp_k(β·E_k)``.

    ``β = 0`` gives the **sum** (the reference code's choice, rank-equivalent to the mean; the formula itself
    diverges as ``log K / β``), ``β = +inf`` the max and ``β = −inf`` the min (the limits of the formula).

    Args:
        energies: ``(N, K)`` (usually standardised) energies.
        beta: Real or ``±inf``.

    Returns:
        ``(N,)`` composed energies.
    """
    if not isinstance(energies, Tensor) or energies.dim() != 2:
        raise ValueError(f"energies must be a (N, K) tensor; got {getattr(energies, 'shape', type(energies))}")
    beta = float(beta)
    if math.isnan(beta):
        raise ValueError("beta must be a real number or ±inf; got nan")
    if beta == 0.0:
        return energies.sum(dim=-1)
    if math.isinf(beta):
        return energies.max(dim=-1).values if beta > 0 else energies.min(dim=-1).values
    return torch.logsumexp(beta * energies, dim=-1) / beta


class _Component(nn.Module):
    """One hybrid energy ``E_θ(z)/T_nn + E_prior(z)/T_k`` (reference ``HybridEnergyModel``)."""

    def __init__(self, name: str, prior, mlp: ResidualEnergyMLP, prior_temperature: float) -> None:
        super().__init__()
        self.name, self.prior, self.mlp, self.prior_temperature = name, prior, mlp, prior_temperature

    @property
    def normalize(self) -> bool:
        return bool(self.prior.normalize)

    def prep(self, z: Tensor) -> Tensor:
        return nn.functional.normalize(z, dim=-1, eps=1e-12) if self.normalize else z

    def prior_energy(self, z: Tensor) -> Tensor:
        return self.prior.energy(z) / self.prior_temperature

    def sgld_prior_energy(self, z: Tensor) -> Tensor:
        """Prior term used during training: GMM energies in the feature dtype (not float64), see ``mahalanobis``."""
        if isinstance(self.prior, ClassConditionalGaussian):
            return self.prior.energy(z, compute_dtype=z.dtype) / self.prior_temperature
        return self.prior_energy(z)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(N, D)`` raw features → ``(total, residual, prior)`` energies, each ``(N,)``."""
        z = self.prep(z)
        residual = self.mlp(z.to(self.mlp.input_layer.weight.dtype)).to(z.dtype)
        prior = self.prior_energy(z)
        return residual + prior, residual, prior


class HEAT(Detector):
    """HEAT detector: refined priors + energy composition. ``score`` → ``(N,)`` energies, higher = more OOD.

    Args:
        priors: Which hybrid energies to use, among ``"gmm"`` (avg-pooled features), ``"gmm_std"`` (std-pooled;
            ``std_features`` must then be given to ``fit`` / ``score``) and ``"el"`` (needs the classifier head).
        beta: Composition parameter of Eq. 5.7; 0 (sum, the published tables), −1 (the thesis's best), ±inf.
        preset: Base hyper-parameters per prior: ``"cifar10"``, ``"cifar100"``, ``"imagenet"`` (spec §10) or
            ``"fast"`` (a CPU preset: width 256, ≤ 5 SGLD steps, one epoch).
        settings: Overrides on the preset: a dict whose keys are setting names (applied to every prior) and/or
            prior names mapping to their own dict. Keys: ``prior_temperature, hidden_dim, n_hidden_layers,
            sgld_steps, step_size, noise_std, end_factor, l2_coef, eps_data, lr, epochs, batch_size, milestones,
            gamma, reduce_width, accumulation_steps``. ``epochs=0`` keeps the initial residual.
        weight, bias, head: Classifier head ``(C, D)``, ``(C,)`` (or an ``nn.Linear``) for the EL prior.
        tie_hidden_weights: Share the hidden ``h × h`` layer as the reference code (default False, see module doc).
        zero_init_residual: Zero the MLP's last layer at init, so an untrained HEAT equals its priors.
        reg: Relative covariance ridge of the GMM priors.
        seed: Seed of the generators for initialisation, shuffling and SGLD.

    ``fit(features, labels, std_features=None, callback=None)``: ``features`` ``(N, D)`` avg-pooled, ``std_features``
    ``(N, D')`` std-pooled (for ``gmm_std``), ``labels`` ``(N,)`` (for the GMM priors); ``callback(prior, epoch,
    step, loss)`` is called after every optimiser step. ``score(features, std_features=None)`` → ``(N,)``.
    ``logits`` are accepted and ignored: the EL prior is computed from ``features`` and the head, so that SGLD can
    follow its gradient in feature space. ``score_components`` returns the per-prior energies; ``history`` and
    ``fit_seconds`` hold the training loss per epoch and the fit time per prior.
    """

    _state_names = ()

    def __init__(
        self,
        priors: tuple[str, ...] | list[str] = ("gmm", "gmm_std", "el"),
        beta: float = 0.0,
        preset: Preset = "cifar10",
        settings: dict[str, Any] | None = None,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        head: nn.Module | None = None,
        tie_hidden_weights: bool = False,
        zero_init_residual: bool = False,
        reg: float = 1e-6,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if isinstance(priors, str):
            priors = (priors,)
        priors = tuple(priors)
        if not priors or len(set(priors)) != len(priors):
            raise ValueError(f"priors must be a non-empty sequence of distinct names; got {priors}")
        for p in priors:
            check_choice("priors", p, get_args(PriorName))
        self.priors = priors
        self.beta = float(beta)
        if math.isnan(self.beta):
            raise ValueError("beta must be a real number or ±inf; got nan")
        self.preset = check_choice("preset", preset, get_args(Preset))
        self.settings_overrides = copy.deepcopy(settings or {})
        self.component_settings = self._resolve_settings(self.settings_overrides)
        self.tie_hidden_weights = bool(tie_hidden_weights)
        self.zero_init_residual = bool(zero_init_residual)
        self.reg = check_positive("reg", reg, strict=False)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int; got {type(seed).__name__}")
        self.seed = seed
        self.weight = self.bias = None
        if "el" in priors and (weight is not None or head is not None):
            self.weight, self.bias = _head_params(weight, bias, head)  # else: restored by load_state_dict
        self.components: dict[str, _Component] = {}
        self.history: dict[str, list[float]] = {}  # mean training loss per epoch, per prior
        self.fit_seconds: dict[str, float] = {}  # wall-clock fit time per prior (prior fit + residual training)
        self.standardization_mean: Tensor | None = None
        self.standardization_std: Tensor | None = None

    # --- configuration --------------------------------------------------------------------------------------------
    def _resolve_settings(self, overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
        resolved = {p: dict(PRESETS[self.preset][p]) for p in self.priors}
        for key, value in overrides.items():
            if key in SETTING_KEYS:
                for p in resolved:
                    resolved[p][key] = value
            elif key in get_args(PriorName):
                if not isinstance(value, dict):
                    raise TypeError(f"settings[{key!r}] must be a dict of settings; got {type(value).__name__}")
                bad = sorted(set(value) - SETTING_KEYS)
                if bad:
                    raise ValueError(f"unknown HEAT settings {bad} for prior {key!r}; valid: {sorted(SETTING_KEYS)}")
                if key in resolved:
                    resolved[key].update(value)
            else:
                raise ValueError(
                    f"unknown HEAT setting {key!r}; valid: {sorted(SETTING_KEYS)} or a prior name {get_args(PriorName)}"
                )
        for p, s in resolved.items():
            s["reduce_width"] = bool(s["reduce_width"])
            for key in ("epochs", "sgld_steps"):
                if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < 0:
                    raise ValueError(f"{p}.{key} must be a non-negative integer; got {s[key]!r}")
            for key in ("batch_size", "hidden_dim", "accumulation_steps"):
                if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < 1:
                    raise ValueError(f"{p}.{key} must be a positive integer; got {s[key]!r}")
            for key in ("prior_temperature", "lr"):
                check_positive(f"{p}.{key}", s[key])
            for key in ("step_size", "noise_std", "l2_coef", "eps_data", "end_factor"):
                check_positive(f"{p}.{key}", s[key], strict=False)
            s["milestones"] = tuple(int(m) for m in s["milestones"])
        return resolved

    def config(self) -> dict[str, Any]:
        return {
            "priors": list(self.priors),
            "beta": self.beta,
            "preset": self.preset,
            # the fully resolved per-prior settings, so a saved detector does not depend on future PRESETS
            "settings": {
                p: {k: list(v) if isinstance(v, tuple) else v for k, v in s.items()}
                for p, s in self.component_settings.items()
            },
            "tie_hidden_weights": self.tie_hidden_weights,
            "zero_init_residual": self.zero_init_residual,
            "reg": self.reg,
            "seed": self.seed,
        }

    # --- building blocks ------------------------------------------------------------------------------------------
    def _make_prior(self, name: str):
        if name == "el":
            if self.weight is None:
                raise ValueError("the 'el' prior needs the classifier head: pass weight=/bias= or head= to HEAT")
            return EnergyLogitsPrior(self.weight, self.bias)
        return ClassConditionalGaussian(normalize=True, reg=self.reg)

    def _make_mlp(self, name: str, dim: int, generator: torch.Generator, device) -> ResidualEnergyMLP:
        s = self.component_settings[name]
        mlp = ResidualEnergyMLP(
            dim,
            hidden_dim=s["hidden_dim"],
            n_hidden_layers=s["n_hidden_layers"],
            tie_hidden_weights=self.tie_hidden_weights and not s["reduce_width"],
            reduce_width=s["reduce_width"],
            generator=generator,
        ).to(device)
        if self.zero_init_residual:
            mlp.zero_output_()
        return mlp

    def _inputs(self, features, std_features, n: int | None = None) -> dict[str, Tensor]:
        dims = self._dims() if self.components else {}
        out = {}
        if any(p in ("gmm", "el") for p in self.priors):
            out["avg"] = check_features("features", features, dim=dims.get("avg"), n=n)
            n = out["avg"].shape[0]
        if "gmm_std" in self.priors:
            if std_features is None:
                raise ValueError("the 'gmm_std' prior needs std_features= (std-pooled features, see ood.features)")
            out["std"] = check_features("std_features", std_features, dim=dims.get("std"), n=n)
        return out

    def _dims(self) -> dict[str, int]:
        dims = {}
        for name, comp in self.components.items():
            dims["std" if name == "gmm_std" else "avg"] = comp.mlp.input_layer.in_features
        return dims

    @staticmethod
    def _source(name: str) -> str:
        return "std" if name == "gmm_std" else "avg"

    # --- fit / score ----------------------------------------------------------------------------------------------
    def _fit(self, features=None, logits=None, labels=None, std_features=None, callback=None, **kwargs) -> None:
        inputs = self._inputs(features, std_features)
        n = next(iter(inputs.values())).shape[0]
        if any(p.startswith("gmm") for p in self.priors):
            labels = check_class_labels(labels, n)
        if "el" in self.priors and self.weight is None:
            raise ValueError("the 'el' prior needs the classifier head: pass weight=/bias= or head= to HEAT")
        if "el" in self.priors and inputs["avg"].shape[1] != self.weight.shape[1]:
            raise ValueError(
                f"features have {inputs['avg'].shape[1]} columns but the classifier weight expects "
                f"{self.weight.shape[1]}"
            )
        device = next(iter(inputs.values())).device
        self.components, self.history, self.fit_seconds = {}, {}, {}
        for i, name in enumerate(self.priors):
            start_time = time.perf_counter()
            s = self.component_settings[name]
            z = inputs[self._source(name)].detach()
            generator = torch.Generator(device=device).manual_seed(self.seed * 1000 + i)
            prior = self._make_prior(name)
            if name != "el":
                prior.fit(z, labels)
            mlp = self._make_mlp(name, z.shape[1], generator, device).to(dtype=z.dtype)
            comp = _Component(name, prior, mlp, s["prior_temperature"])
            z_train = comp.prep(z)

            def proposal(m: int, prior=prior, generator=generator, z_train=z_train) -> Tensor:
                return prior.sample(m, generator, device=z_train.device, dtype=z_train.dtype)

            self.history[name] = train_residual(
                mlp,
                comp.sgld_prior_energy,
                proposal,
                z_train,
                epochs=s["epochs"],
                batch_size=s["batch_size"],
                lr=s["lr"],
                l2_coef=s["l2_coef"],
                sgld_steps=s["sgld_steps"],
                step_size=s["step_size"],
                noise_std=s["noise_std"],
                end_factor=s["end_factor"],
                eps_data=s["eps_data"],
                milestones=s["milestones"],
                gamma=s["gamma"],
                normalize=comp.normalize,
                accumulation_steps=s["accumulation_steps"],
                generator=generator,
                callback=None if callback is None else (lambda e, st, loss, name=name: callback(name, e, st, loss)),
            )
            for p in mlp.parameters():
                p.requires_grad_(False)
            self.components[name] = comp
            self.fit_seconds[name] = time.perf_counter() - start_time
        energies = self._hybrid_matrix(inputs)
        self.standardization_mean = energies.mean(dim=0)
        self.standardization_std = energies.std(dim=0, unbiased=True).clamp_min(torch.finfo(energies.dtype).tiny)

    @torch.no_grad()
    def _hybrid_matrix(self, inputs: dict[str, Tensor], chunk_size: int = 8192) -> Tensor:
        cols = []
        for name, comp in self.components.items():
            z = inputs[self._source(name)]
            comp.to(z.device)
            cols.append(torch.cat([comp(part)[0] for part in z.split(chunk_size)]))
        return torch.stack(cols, dim=1)

    def _score(self, features=None, logits=None, std_features=None, **kwargs) -> Tensor:
        inputs = self._inputs(features, std_features)
        energies = self._hybrid_matrix(inputs)
        mean = self.standardization_mean.to(energies.device, energies.dtype)
        std = self.standardization_std.to(energies.device, energies.dtype)
        return compose_energies(standardize(energies, mean, std), self.beta)

    @torch.no_grad()
    def score_components(self, features=None, std_features=None) -> dict[str, dict[str, Tensor]]:
        """Per prior: ``{"total", "residual", "prior"}`` hybrid energies ``(N,)`` (before standardisation)."""
        if not self._fitted:
            raise NotFittedError("HEAT")
        inputs = self._inputs(features, std_features)
        out = {}
        for name, comp in self.components.items():
            comp.to(inputs[self._source(name)].device)
            total, residual, prior = comp(inputs[self._source(name)])
            out[name] = {"total": total, "residual": residual, "prior": prior}
        return out

    # --- state ----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if self.weight is not None:
            out["head.weight"] = self.weight
            if self.bias is not None:
                out["head.bias"] = self.bias
        for name, comp in self.components.items():
            if name != "el":
                out.update({f"{name}.prior.{k}": v for k, v in comp.prior.state_dict().items()})
            out.update({f"{name}.mlp.{k}": v for k, v in comp.mlp.state_dict().items()})
        if self.standardization_mean is not None:
            out["standardization_mean"] = self.standardization_mean
            out["standardization_std"] = self.standardization_std
        return {k: v.detach().contiguous() for k, v in out.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> HEAT:
        state = dict(state)
        if "head.weight" in state:
            self.weight, self.bias = state.pop("head.weight"), state.pop("head.bias", None)
        self.standardization_mean = state.pop("standardization_mean")
        self.standardization_std = state.pop("standardization_std")
        self.components = {}
        for name in self.priors:
            prior = self._make_prior(name)
            if name != "el":
                prefix = f"{name}.prior."
                prior.load_state_dict({k[len(prefix) :]: state.pop(k) for k in list(state) if k.startswith(prefix)})
                dim = prior.dim
            else:
                dim = self.weight.shape[1]
            prefix = f"{name}.mlp."
            mlp_state = {k[len(prefix) :]: state.pop(k) for k in list(state) if k.startswith(prefix)}
            mlp = self._make_mlp(name, dim, torch.Generator().manual_seed(0), "cpu")
            mlp.load_state_dict(mlp_state)
            for p in mlp.parameters():
                p.requires_grad_(False)
            self.components[name] = _Component(name, prior, mlp, self.component_settings[name]["prior_temperature"])
        if state:
            raise ValueError(f"state has keys unknown to HEAT: {sorted(state)}")
        self._fitted = True
        return self

    def to(self, device=None, dtype=None) -> HEAT:
        for comp in self.components.values():
            comp.mlp.to(device=device, dtype=dtype)
        return self
