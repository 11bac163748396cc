"""HEAT: Hybrid Energy-based model in the feATure space for post-hoc OOD detection.

Lafon, Ramzi, Rambour, Thome, ICML 2023 (thesis ch. 5, Eqs. 5.1-5.7, Algorithm 2). Each prior ``k`` (a
:class:`~pml_suprank.ood.priors.Prior`) is refined by a residual EBM ``E_θk`` (:mod:`.ebm`); the hybrid energies are
standardised and composed by ``E_β = (1/β)·log Σ_k exp(β·s̃_k)`` (Eq. 5.7), ``β = 0`` meaning the sum.

Deliberate differences from the authors' released code:

* **Standardisation** uses the mean and unbiased std of each hybrid energy over the **whole** training set (the
  released code: one shuffled batch of 256).
* **Untied hidden layers** by default (:mod:`.ebm`); **GMM covariance** in float64, ridged (:mod:`.priors`).
* **Randomness** comes from ``seed`` through explicit generators (the released code uses the global RNG).
* ImageNet: the pyramid MLP (``reduce_width``) and gradient accumulation are set by the ``"imagenet"`` preset; the
  tempered batch-statistics proposal and the "simplified Mahalanobis" SGLD energy are not implemented.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from .._validation import check_bool, check_choice, check_positive
from .base import Detector, NotFittedError, check_class_labels, check_features, head_params
from .ebm import ResidualEnergyMLP, train_residual
from .heat_state import MAX_SEED, SETTING_KEYS, check_heat_state, check_mlp_sizes, resolve_settings
from .model_api import model_head
from .priors import PRIOR_REGISTRY, Prior, degenerate_variance, unit_rows

__all__ = ["HEAT", "PriorName", "compose_energies", "standardize"]

#: The built-in priors (any registered :class:`Prior` name is accepted too, see ``ood.list_priors()``).
PriorName = Literal["gmm", "gmm_std", "el"]
Preset = Literal["cifar10", "cifar100", "imagenet", "fast"]
_MLP_KEYS = {"prior_temperature", "hidden_dim", "n_hidden_layers", "reduce_width"}  # the others: train_residual's


def _check_beta(beta: float) -> float:
    beta = float(beta)
    if math.isnan(beta):
        raise ValueError("beta must be a real number or ±inf; got nan")
    return beta


def standardize(energies: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """``(E − m)/s`` per column; ``energies`` ``(N, K)``, ``mean`` and ``std`` ``(K,)``."""
    return (energies - mean) / std


def compose_energies(energies: Tensor, beta: float) -> Tensor:
    """Energy composition, thesis Eq. 5.7: ``(N, K)`` energies → ``(N,)`` ``(1/β)·logsumexp_k(β·E_k)``.

    ``β = 0`` gives the **sum** (the reference code's choice), ``β = ±inf`` the max / min.
    """
    if not isinstance(energies, Tensor) or energies.dim() != 2:
        raise ValueError(f"energies must be a (N, K) tensor; got {getattr(energies, 'shape', type(energies))}")
    beta = _check_beta(beta)
    if beta == 0.0:
        return energies.sum(dim=-1)
    if math.isinf(beta):
        return energies.max(dim=-1).values if beta > 0 else energies.min(dim=-1).values
    return torch.logsumexp(beta * energies, dim=-1) / beta


class _Component(nn.Module):
    """One hybrid energy ``E_θ(z)/T_nn + E_prior(z)/T_k`` (thesis Eq. 5.2; the released ``HybridEnergyModel``)."""

    def __init__(self, name: str, prior: Prior, mlp: ResidualEnergyMLP, prior_temperature: float) -> None:
        super().__init__()
        self.name, self.prior, self.mlp, self.prior_temperature = name, prior, mlp, prior_temperature

    def prep(self, z: Tensor) -> Tensor:
        return unit_rows(z) if self.prior.normalize else z

    def sgld_prior_energy(self, z: Tensor) -> Tensor:
        """Prior term used during training (``Prior.training_energy``, e.g. GMM energies in the feature dtype)."""
        return self.prior.training_energy(z) / self.prior_temperature

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(N, D)`` raw features → ``(total, residual, prior)`` energies, each ``(N,)``."""
        z = self.prep(z)
        residual = self.mlp(z.to(self.mlp.input_layer.weight.dtype)).to(z.dtype)
        prior = self.prior.energy(z) / self.prior_temperature
        return residual + prior, residual, prior


def _prior_classes(priors: Any) -> dict[str, type[Prior]]:
    """``priors=`` (names and/or registered :class:`Prior` subclasses) → ``{name: class}`` in the given order."""
    if isinstance(priors, str) or (isinstance(priors, type) and issubclass(priors, Prior)):
        priors = (priors,)
    names = [p.name if isinstance(p, type) and issubclass(p, Prior) else p for p in tuple(priors)]
    for p in names:
        if p not in PRIOR_REGISTRY:
            raise ValueError(f"priors must be registered HEAT prior names {list(PRIOR_REGISTRY)}; got {p!r}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"priors must be a non-empty sequence of distinct names; got {priors}")
    return {name: PRIOR_REGISTRY[name] for name in names}


class HEAT(Detector):
    """HEAT detector: refined priors + energy composition. ``score`` → ``(N,)`` energies, higher = more OOD.

    Args:
        priors: Registered :class:`~pml_suprank.ood.priors.Prior` names (or classes): ``"gmm"`` (avg-pooled
            features), ``"gmm_std"`` (std-pooled: ``std_features=`` needed), ``"el"`` (needs the classifier head).
        beta: Composition parameter of Eq. 5.7; 0 (sum, the published tables), −1 (the thesis's best), ±inf.
        preset: Hyper-parameters per prior: ``"cifar10"``, ``"cifar100"``, ``"imagenet"`` (the authors' released
            settings) or ``"fast"`` (CPU: width 256, ≤ 5 SGLD steps, one epoch); see ``ood.PRESETS``.
        settings: Overrides on the preset: setting names (for every prior) and/or prior names mapping to their own
            dict (``epochs=0`` keeps the initial residual), bounded before anything is allocated by
            :data:`~pml_suprank.ood.heat_state.LOADED_SETTINGS`, the residual MLP to 2**30 parameters.
        weight, bias, head: Classifier head ``(C, D)``, ``(C,)`` (or an ``nn.Linear``) for the EL prior.
        tie_hidden_weights: Share the hidden ``h × h`` layer as the released code.
        zero_init_residual: Zero the MLP's last layer at init, so an untrained HEAT equals its priors.
        reg: Relative covariance ridge of the GMM priors.
        seed: Seed of the generators for initialisation, shuffling and SGLD (``|seed| <= 2**53``).

    ``fit(features, labels, std_features=None, callback=None)``: ``features`` ``(N, D)`` avg-pooled, ``std_features``
    ``(N, D')`` std-pooled, ``labels`` ``(N,)``; ``callback(prior, epoch, step, loss)`` after every optimiser step.
    ``logits`` are ignored (EL is computed from ``features`` and the head). ``score_components`` gives the per-prior
    energies; ``history`` / ``fit_seconds`` the training loss per epoch and the fit time per prior.
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
        self.prior_classes = _prior_classes(priors)
        self.priors = tuple(self.prior_classes)
        self.beta = _check_beta(beta)
        self.preset = check_choice("preset", preset, get_args(Preset))
        defaults = {name: cls.default_settings(self.preset) for name, cls in self.prior_classes.items()}
        self.component_settings = resolve_settings(defaults, settings or {}, PRIOR_REGISTRY.names())
        self.tie_hidden_weights = check_bool("tie_hidden_weights", tie_hidden_weights)
        check_mlp_sizes(self.component_settings, self.tie_hidden_weights)
        self.zero_init_residual = check_bool("zero_init_residual", zero_init_residual)
        self.reg = check_positive("reg", reg, strict=False)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int; got {type(seed).__name__}")
        if abs(seed) > MAX_SEED:
            raise ValueError(f"seed must be an int in [-2**53, 2**53]; got {seed}")
        self.seed = seed
        self.needs_head = any(c.needs_head for c in self.prior_classes.values())
        self.weight = self.bias = None
        if self.needs_head and (weight is not None or head is not None):
            self.weight, self.bias = head_params(weight, bias, head)  # else: restored by load_state_dict
        self.components: dict[str, _Component] = {}
        self.history: dict[str, list[float]] = {}  # mean training loss per epoch, per prior
        self.fit_seconds: dict[str, float] = {}  # wall-clock fit time per prior (prior fit + residual training)
        self.standardization_mean: Tensor | None = None
        self.standardization_std: Tensor | None = None

    def _adopt(self, model: nn.Module) -> None:
        """Only a prior reading the head (``el``) takes the model's: a HEAT of feature priors (``gmm``, ``gmm_std``)
        guards a retrieval model without a classification head."""
        if self.weight is None and self.needs_head:
            self.weight, self.bias = head_params(None, None, model_head(model, "HEAT"))

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

    def _make_prior(self, name: str) -> Prior:
        return self.prior_classes[name].create(weight=self.weight, bias=self.bias, reg=self.reg)

    def _make_mlp(self, name: str, dim: int, generator: torch.Generator | None, device) -> ResidualEnergyMLP:
        """The residual MLP of prior ``name`` on ``dim`` inputs (``device="meta"``: shapes only, for checks)."""
        s = self.component_settings[name]
        mlp = ResidualEnergyMLP(
            dim,
            hidden_dim=s["hidden_dim"],
            n_hidden_layers=s["n_hidden_layers"],
            tie_hidden_weights=self.tie_hidden_weights and not s["reduce_width"],
            reduce_width=s["reduce_width"],
            generator=generator,
            device=device,
        )
        if self.zero_init_residual:
            mlp.zero_output_()
        return mlp

    def _inputs(self, given: dict[str, Any]) -> dict[str, Tensor]:
        """Check the ``(N, D_source)`` tensor of every source the priors read (same ``N``, ``D`` as at fit time),
        ``features`` first (it fixes ``N`` for the others)."""
        dims = {comp.prior.source: comp.mlp.input_layer.in_features for comp in self.components.values()}
        readers = {cls.source: name for name, cls in reversed(self.prior_classes.items())}  # the first reader
        out, n = {}, None
        for source in sorted(readers, key=lambda s: s != "features"):
            if given.get(source) is None and source != "features":
                raise ValueError(
                    f"the {readers[source]!r} prior needs {source}= (an (N, D) tensor, see ood.extract_features)"
                )
            out[source] = check_features(source, given.get(source), dim=dims.get(source), n=n)
            n = out[source].shape[0]
        return out

    def _fit(self, features=None, logits=None, labels=None, std_features=None, callback=None, **kwargs) -> None:
        self.components, self.history, self.fit_seconds = {}, {}, {}
        inputs = self._inputs({"features": features, "logits": logits, "std_features": std_features, **kwargs})
        n = next(iter(inputs.values())).shape[0]
        if any(c.needs_labels for c in self.prior_classes.values()):
            labels = check_class_labels(labels, n)
        priors = {name: self._make_prior(name) for name in self.priors}  # fails early without a needed head
        for prior in priors.values():
            prior.check(inputs[prior.source])  # e.g. EL: feature dimension == head's
        device = next(iter(inputs.values())).device
        for i, (name, prior) in enumerate(priors.items()):
            start_time = time.perf_counter()
            s = self.component_settings[name]
            z = inputs[prior.source].detach()
            generator = torch.Generator(device=device).manual_seed(self.seed * 1000 + i)
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
                **{k: s[k] for k in SETTING_KEYS - _MLP_KEYS},
                normalize=prior.normalize,
                generator=generator,
                callback=None if callback is None else (lambda e, st, loss, name=name: callback(name, e, st, loss)),
            )
            self.components[name] = comp.requires_grad_(False)
            self.fit_seconds[name] = time.perf_counter() - start_time
        energies = self._hybrid_matrix(inputs)
        self.standardization_mean, self.standardization_std = self._standardization(energies)

    def _standardization(self, energies: Tensor) -> tuple[Tensor, Tensor]:
        """``(mean (K,), std (K,))`` of the ``(N, K)`` hybrid energies over the training set; a prior whose energy is
        constant (its std at the rounding level of its mean) cannot be standardised and is refused by name."""
        mean = energies.mean(dim=0)
        std = energies.std(dim=0, unbiased=True)
        floor = degenerate_variance(mean.to(torch.float64).pow(2), energies.dtype)
        bad = [name for name, ok in zip(self.priors, (std.to(torch.float64).pow(2) > floor).tolist()) if not ok]
        if bad or not bool(torch.isfinite(std).all() & torch.isfinite(mean).all()):
            raise ValueError(
                f"the hybrid energy of prior(s) {bad or list(self.priors)} is constant or not finite over the "
                f"{energies.shape[0]} training features (mean {mean.tolist()}, std {std.tolist()}): the "
                "standardisation (E - mean) / std is undefined; degenerate (constant or duplicated) features?"
            )
        return mean, std

    @torch.no_grad()
    def _energies(self, inputs: dict[str, Tensor], chunk_size: int = 8192) -> dict[str, dict[str, Tensor]]:
        """Per prior: ``{"total", "residual", "prior"}`` hybrid energies ``(N,)``, computed in chunks of rows."""
        out = {}
        for name, comp in self.components.items():
            z = inputs[comp.prior.source]
            comp.to(z.device)
            parts = zip(*(comp(part) for part in z.split(chunk_size)))
            out[name] = dict(zip(("total", "residual", "prior"), map(torch.cat, parts)))
        return out

    def _hybrid_matrix(self, inputs: dict[str, Tensor]) -> Tensor:
        return torch.stack([e["total"] for e in self._energies(inputs).values()], dim=1)

    def _score(self, features=None, logits=None, std_features=None, **kwargs) -> Tensor:
        inputs = self._inputs({"features": features, "logits": logits, "std_features": std_features, **kwargs})
        energies = self._hybrid_matrix(inputs)
        mean = self.standardization_mean.to(energies.device, energies.dtype)
        std = self.standardization_std.to(energies.device, energies.dtype)
        scores = compose_energies(standardize(energies, mean, std), self.beta)
        finite = torch.isfinite(energies)
        if not bool(finite.all() & torch.isfinite(scores).all()):
            counts = (~finite).sum(0).tolist()
            parts = [f"{name}: {n} non-finite energies" for name, n in zip(self.priors, counts) if n]
            raise ValueError(
                f"HEAT scores of {int((~torch.isfinite(scores)).sum())} of {scores.shape[0]} inputs are not finite "
                f"({', '.join(parts) or 'finite energies overflow once standardised by std ' + str(std.tolist())}); "
                "inputs far outside the float range of the features, or a corrupt standardization_std?"
            )
        return scores

    @torch.no_grad()
    def score_components(self, features=None, std_features=None, **kwargs) -> dict[str, dict[str, Tensor]]:
        """Per prior: ``{"total", "residual", "prior"}`` hybrid energies ``(N,)`` (before standardisation)."""
        if not self._fitted:
            raise NotFittedError("HEAT")
        return self._energies(self._inputs({"features": features, "std_features": std_features, **kwargs}))

    def state_dict(self) -> dict[str, Tensor]:
        out = {"head.weight": self.weight, "head.bias": self.bias if self.weight is not None else None}
        for name, comp in self.components.items():
            out.update({f"{name}.prior.{k}": v for k, v in comp.prior.state_dict().items()})
            out.update({f"{name}.mlp.{k}": v for k, v in comp.mlp.state_dict().items()})
        out.update(standardization_mean=self.standardization_mean, standardization_std=self.standardization_std)
        return {k: v.detach().contiguous() for k, v in out.items() if v is not None}

    def _hub_check_state(self, state, source, config) -> None:
        check_heat_state(self, state, source)

    def load_state_dict(self, state: dict[str, Tensor]) -> HEAT:
        state = dict(state)
        if "head.weight" in state:
            self.weight, self.bias = state.pop("head.weight"), state.pop("head.bias", None)
        self.standardization_mean = state.pop("standardization_mean")
        self.standardization_std = state.pop("standardization_std")

        def take(prefix: str) -> dict[str, Tensor]:
            return {k[len(prefix) :]: state.pop(k) for k in list(state) if k.startswith(prefix)}

        self.components = {}
        for name in self.priors:
            prior = self._make_prior(name).load_state_dict(take(f"{name}.prior."))
            mlp = self._make_mlp(name, prior.dim, None, "cpu")
            mlp.load_state_dict(take(f"{name}.mlp."))
            mlp.requires_grad_(False)
            self.components[name] = _Component(name, prior, mlp, self.component_settings[name]["prior_temperature"])
        if state:
            raise ValueError(f"state has keys unknown to HEAT: {sorted(state)}")
        self._fitted = True
        return self

    def to(self, device=None, dtype=None) -> HEAT:
        for comp in self.components.values():
            comp.mlp.to(device=device, dtype=dtype)
        return self
