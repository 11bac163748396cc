"""HEAT's settings schema and the checks of a saved HEAT before anything is built from it (``ValueError`` naming the
file and the key). A fitted HEAT with priors ``p_1..p_K`` holds:

* ``head.weight`` ``(C, D)`` and optionally ``head.bias`` ``(C,)``, required when a prior needs the head (``"el"``);
* ``<p>.prior.<name>``: each prior's tensors, laid out as its :meth:`~pml_suprank.ood.priors.Prior.state_spec`;
* ``<p>.mlp.<name>``: the residual MLP, shaped as the one the config builds on ``D_p`` inputs (a ``meta`` copy);
* ``standardization_mean`` ``(K,)`` and ``standardization_std`` ``(K,)`` (> 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._validation import OptionCheck, is_bool, is_finite, is_int, is_number, shorten
from ..hub.schema import TensorSpec, check_schema, kind_of
from ..hub.serialization import check_state
from .ebm import MAX_HIDDEN_DIM, MAX_HIDDEN_LAYERS, MAX_MLP_PARAMETERS, mlp_parameter_count
from .priors import degenerate_variance

__all__ = ["LOADED_SETTINGS", "SETTING_KEYS", "check_heat_state", "check_mlp_sizes", "resolve_settings"]

#: ``|seed|`` bound: HEAT seeds its generators with ``seed·1000 + k``, which must fit a 64-bit int
MAX_SEED = 2**53
_MAX_STEPS = 100_000  # SGLD steps, epochs, accumulation steps, milestones
_MAX_BATCH = 2**24

_STEPS = is_int(0, _MAX_STEPS)
#: The one schema of a HEAT setting, checked on the ``settings=`` of every ``HEAT(...)`` (a loaded ``config.json``
#: included) before anything is allocated: ints bound what sizes work, booleans are strict (``"false"`` is refused),
#: numbers finite.
LOADED_SETTINGS: dict[str, OptionCheck] = {
    "hidden_dim": is_int(1, MAX_HIDDEN_DIM),
    "n_hidden_layers": is_int(0, MAX_HIDDEN_LAYERS),
    **dict.fromkeys(("sgld_steps", "epochs"), _STEPS),
    "accumulation_steps": is_int(1, _MAX_STEPS),
    "batch_size": is_int(1, _MAX_BATCH),
    "reduce_width": is_bool(),
    "milestones": OptionCheck(lambda v: isinstance(v, (list, tuple)) and len(v) <= 1000 and all(map(_STEPS, v)),
                              f"a list of at most 1000 ints in [0, {_MAX_STEPS}]"),
    **dict.fromkeys(("prior_temperature", "lr"), is_number(0, strict=True)),
    **dict.fromkeys(("step_size", "noise_std", "l2_coef", "eps_data", "end_factor"), is_number(0)),
    "gamma": is_finite(),
}  # fmt: skip
#: The settings every prior of a HEAT has (the keys of a ``PRESETS[preset][prior]`` entry).
SETTING_KEYS = frozenset(LOADED_SETTINGS)


def _check_setting(key: str, value: Any, where: str) -> None:
    if not (check := LOADED_SETTINGS[key])(value):
        raise ValueError(f"{where} must be {check.expected}; got {shorten(repr(value), 80)}")


def resolve_settings(
    defaults: Mapping[str, Mapping[str, Any]], overrides: Any, prior_names: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """``{prior: settings}``: ``defaults`` (per prior in use) updated by ``overrides``, setting names (for every prior)
    and/or prior names among ``prior_names`` mapping to their own dict, each value bounded by
    :data:`LOADED_SETTINGS` (``ValueError`` naming ``settings[prior][key]``)."""
    if not isinstance(overrides, dict):
        raise ValueError(f"settings must be a dict; got {type(overrides).__name__}")
    resolved = {p: dict(s) for p, s in defaults.items()}
    for key, value in overrides.items():
        if key in SETTING_KEYS:
            _check_setting(key, value, f"settings[{key!r}]")
            for p in resolved:
                resolved[p][key] = value
        elif key in prior_names:
            if not isinstance(value, dict):
                raise TypeError(f"settings[{key!r}] must be a dict of settings; got {type(value).__name__}")
            bad = sorted(set(value) - SETTING_KEYS)
            if bad:
                raise ValueError(f"unknown HEAT settings {bad} for prior {key!r}; valid: {sorted(SETTING_KEYS)}")
            for name, v in value.items():
                _check_setting(name, v, f"settings[{key!r}][{name!r}]")
            resolved.get(key, {}).update(value)
        else:
            raise ValueError(
                f"unknown HEAT setting {shorten(repr(key), 40)}; valid: {sorted(SETTING_KEYS)} or a prior name "
                f"{tuple(prior_names)}"
            )
    for p, s in resolved.items():
        missing = sorted(SETTING_KEYS - set(s))
        if missing:
            raise ValueError(f"settings of prior {p!r} miss {missing}; give them in settings={{{p!r}: {{...}}}}")
        s["milestones"] = tuple(s["milestones"])
    return resolved


def check_mlp_sizes(component_settings: Mapping[str, Mapping[str, Any]], tie_hidden_weights: bool) -> None:
    """The residual MLP of every prior, without its input layer, holds at most ``MAX_MLP_PARAMETERS`` parameters."""
    for name, values in component_settings.items():
        h, n, reduce = values["hidden_dim"], values["n_hidden_layers"], values["reduce_width"]
        if reduce and h % (2**n):
            continue  # ResidualEnergyMLP refuses it by name when the prior is fitted or loaded
        count = mlp_parameter_count(1, h, n, tie_hidden_weights and not reduce, reduce)
        if count > MAX_MLP_PARAMETERS:
            raise ValueError(
                f"settings[{name!r}]: hidden_dim={h} with n_hidden_layers={n} makes a residual MLP of {count:,} "
                f"parameters before its input layer, more than {MAX_MLP_PARAMETERS:,}: lower hidden_dim or "
                "n_hidden_layers"
            )


def _mlp_spec(heat: Any, name: str, dim: int, symbol: str) -> dict[str, TensorSpec]:
    """The tensors of the residual MLP the config builds on ``dim`` inputs (input width as the size ``symbol``)."""
    mlp = heat._make_mlp(name, dim, None, "meta")
    spec = {f"{name}.mlp.{k}": TensorSpec(tuple(v.shape), kind=kind_of(v)) for k, v in mlp.state_dict().items()}
    first = f"{name}.mlp.input_layer.weight"
    spec[first] = TensorSpec((spec[first].shape[0], symbol))
    return spec


#: the smallest standardization_std a loaded HEAT may hold (below, (E - mean) / std overflows float32)
MIN_STANDARDIZATION_STD = 1e-30


def _check_standardization(state: Mapping[str, Tensor], source: Path) -> None:
    """``standardization_std`` above :data:`MIN_STANDARDIZATION_STD` and the rounding level of the mean."""
    mean = state["standardization_mean"].to(torch.float64)
    std = state["standardization_std"].to(torch.float64)
    floor = torch.maximum(degenerate_variance(mean.pow(2), torch.float32).sqrt(),
                          torch.tensor(MIN_STANDARDIZATION_STD, dtype=torch.float64))  # fmt: skip
    if not bool((std >= floor).all()):
        raise ValueError(
            f"{source}: tensor 'standardization_std' must be >= {MIN_STANDARDIZATION_STD} and above the rounding "
            f"level of 'standardization_mean' (>= {[float(f) for f in floor][:8]}); got {std.tolist()[:8]} (every "
            "score would be inf / NaN or rounding noise): corrupt file?"
        )


def check_heat_state(heat: Any, state: Mapping[str, Tensor], source: Path) -> None:
    """Check a loaded HEAT state against ``heat`` (built from the same config)."""
    spec: dict[str, TensorSpec] = {}
    if heat.needs_head or "head.weight" in state:
        spec["head.weight"] = TensorSpec(("C", "D"), nonzero=True)
        spec["head.bias"] = TensorSpec(("C",), optional=True)
    opaque = []  # priors without a declared layout: only finiteness here, their load_state_dict checks the rest
    for name, cls in heat.prior_classes.items():
        prior_spec = cls.state_spec()
        if prior_spec is None:
            opaque.append(f"{name}.prior.")
        else:
            spec.update({f"{name}.prior.{key}": v.renamed(f"{name}.") for key, v in prior_spec.items()})
    k = len(heat.priors)
    spec["standardization_mean"] = TensorSpec((k,))
    spec["standardization_std"] = TensorSpec((k,), positive=True)
    mlp_prefixes = tuple(f"{name}.mlp." for name in heat.priors)
    fixed = {key: v for key, v in state.items() if not key.startswith(mlp_prefixes + tuple(opaque))}
    sizes = check_schema(fixed, source, spec)
    _check_standardization(state, source)
    check_state({key: v for key, v in state.items() if key.startswith(tuple(opaque))}, source)
    for name, cls in heat.prior_classes.items():
        own = {key: v for key, v in state.items() if key.startswith(f"{name}.mlp.")}
        symbol = f"{name}.D" if f"{name}.D" in sizes else "D" if cls.needs_head else None
        dim = sizes.get(symbol)
        if dim is None:  # an opaque prior: D is known once it is loaded, and HEAT.load_state_dict checks the MLP
            check_state(own, source)
        else:
            check_schema(own, source, _mlp_spec(heat, name, dim, symbol), sizes=sizes)
