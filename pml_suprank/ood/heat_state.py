"""Checks of a saved HEAT before anything is built from it: bounded MLP sizes in ``config.json``, and every tensor of
``model.safetensors`` against what the config implies.

A fitted HEAT with priors ``p_1..p_K`` holds (see :meth:`~pml_suprank.ood.heat.HEAT.state_dict`):

* ``head.weight`` ``(C, D)`` (not all zero) and optionally ``head.bias`` ``(C,)`` — required when a prior needs the
  classifier head (``"el"``);
* ``<p>.prior.<name>`` — each prior's tensors, laid out as its :meth:`~pml_suprank.ood.prior.Prior.state_spec`
  (the GMM priors: means ``(C_p, D_p)``, class weights, a Cholesky factor ``(D_p, D_p)``, class ids);
* ``<p>.mlp.<name>`` — the residual MLP, whose every tensor must have the shape of the MLP the config's settings
  (``hidden_dim``, ``n_hidden_layers``, ``reduce_width``, ``tie_hidden_weights``) build on ``D_p`` inputs (checked
  against a shape-only ``meta`` copy, so nothing is allocated before the check);
* ``standardization_mean`` ``(K,)`` and ``standardization_std`` ``(K,)`` (> 0).

Every error is a ``ValueError`` naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from ..hub.schema import TensorSpec, check_schema, kind_of
from ..hub.serialization import check_state
from .ebm import ResidualEnergyMLP

__all__ = ["MAX_HIDDEN_DIM", "MAX_HIDDEN_LAYERS", "check_heat_config", "check_heat_state"]

MAX_HIDDEN_DIM = 65_536
MAX_HIDDEN_LAYERS = 64


def check_heat_config(model_args: Mapping[str, Any], source: Path, skip: Mapping[str, Any]) -> None:
    """Bound the residual MLP sizes of a loaded HEAT ``config.json`` (``settings`` per prior)."""
    if "settings" in skip:
        return
    settings = model_args.get("settings") or {}
    if not isinstance(settings, dict):
        raise ValueError(f"{source}: model_args.settings must be a dict; got {type(settings).__name__}")
    for prior, values in settings.items():
        if not isinstance(values, dict):
            continue  # a global setting: resolve_settings checks it
        for key, maximum in (("hidden_dim", MAX_HIDDEN_DIM), ("n_hidden_layers", MAX_HIDDEN_LAYERS)):
            value = values.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value > maximum):
                raise ValueError(
                    f"{source}: model_args.settings[{prior!r}][{key!r}] must be an int <= {maximum} in a loaded "
                    f"config; got {value!r} (pass trust_config=True for a trusted file)"
                )


def _mlp_spec(heat: Any, name: str, dim: int, symbol: str) -> dict[str, TensorSpec]:
    """The tensors of the residual MLP the config builds on ``dim`` inputs (input width as the size ``symbol``)."""
    s = heat.component_settings[name]
    mlp = ResidualEnergyMLP(
        dim,
        hidden_dim=s["hidden_dim"],
        n_hidden_layers=s["n_hidden_layers"],
        tie_hidden_weights=heat.tie_hidden_weights and not s["reduce_width"],
        reduce_width=s["reduce_width"],
        device="meta",
    )
    spec = {f"{name}.mlp.{k}": TensorSpec(tuple(v.shape), kind=kind_of(v)) for k, v in mlp.state_dict().items()}
    first = f"{name}.mlp.input_layer.weight"
    spec[first] = TensorSpec((spec[first].shape[0], symbol))
    return spec


def check_heat_state(heat: Any, state: Mapping[str, Tensor], source: Path) -> None:
    """Check a loaded HEAT state against ``heat`` (built from the same config); see the module docstring."""
    spec: dict[str, TensorSpec] = {}
    needs_head = any(cls.needs_head for cls in heat.prior_classes.values())
    if needs_head or "head.weight" in state:
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
    check_state({key: v for key, v in state.items() if key.startswith(tuple(opaque))}, source)
    for name, cls in heat.prior_classes.items():
        own = {key: v for key, v in state.items() if key.startswith(f"{name}.mlp.")}
        symbol = f"{name}.D" if f"{name}.D" in sizes else "D" if cls.needs_head else None
        dim = sizes.get(symbol)
        if dim is None:  # an opaque prior: D is known once it is loaded, and HEAT.load_state_dict checks the MLP
            check_state(own, source)
        else:
            check_schema(own, source, _mlp_spec(heat, name, dim, symbol), sizes=sizes)
