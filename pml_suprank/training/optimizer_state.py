"""The optimizer state of a checkpoint (``optimizer.bin``), checked before Accelerate loads it: ``state_dict()``
structure, each group's options and each parameter's moments by value, and the fit to the optimizer being resumed.
Each check returns the problem (``None``: none), which :func:`~pml_suprank.training.checkpoint.validate_checkpoint`
raises naming the checkpoint."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import OptionCheck, is_bool, is_int, is_number, optional, shorten

__all__ = ["OPTIMIZER_FILE", "optimizer_file_problem", "optimizer_fit_problem", "optimizer_state_indices"]

OPTIMIZER_FILE = "optimizer.bin"
_INDEX = is_int(0)

#: group options that choose how the optimizer works (not a value to tune): the saved ones must be this run's
_GROUP_MODES = ("amsgrad", "maximize", "capturable", "differentiable", "nesterov", "decoupled_weight_decay", "foreach",
                "fused")  # fmt: skip
#: the hyper-parameters of a saved optimizer group, checked by value (``load_state_dict`` would use them as saved)
_BETA, _FLAG = is_number(0, high=1, open_high=True), is_bool()
_GROUP_CHECKS: dict[str, OptionCheck] = {
    **dict.fromkeys(("lr", "initial_lr", "weight_decay"), is_number(0)),
    "eps": is_number(0, strict=True),
    **dict.fromkeys(("momentum", "dampening"), is_number(0, high=1)),
    "betas": OptionCheck(lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(_BETA, v)),
                         "two numbers in [0, 1)"),
    **dict.fromkeys(_GROUP_MODES, _FLAG),
    **dict.fromkeys(("foreach", "fused"), optional(_FLAG)),  # None: torch picks
}  # fmt: skip


def _state_value_problem(name: str, value: Any, step: int) -> str | None:
    """What is wrong with one saved per-parameter optimizer value (``None``: nothing): a non-finite number or tensor
    (the optimizer would poison every weight it updates), a negative second moment, a step count outside ``[0,
    step]`` (the checkpoint's ``global_step``)."""
    if value is None or isinstance(value, Tensor) and not value.is_complex() and not value.is_floating_point():
        return None
    if isinstance(value, bool) or not isinstance(value, (Tensor, int, float)) or getattr(value, "is_complex", bool)():
        return f"must be a real tensor, a number or null; got {type(value).__name__}"
    values = torch.as_tensor(value).detach().to(torch.float64)
    if not bool(torch.isfinite(values).all()):
        return "holds NaN or infinite values (the optimizer would poison every weight it updates)"
    if name in ("exp_avg_sq", "max_exp_avg_sq") and not bool((values >= 0).all()):
        return f"is a second moment and must be >= 0; got min {float(values.min())}"
    if name == "step" and not bool(((values >= 0) & (values <= step)).all()):
        return f"counts optimizer steps and must be in [0, {step}] (global_step); got {values.flatten()[:4].tolist()}"
    return None


def optimizer_file_problem(state: Any, with_state: list[int] | None, step: int) -> str | None:
    """``optimizer.bin`` is an optimizer ``state_dict`` with per-parameter state for exactly ``with_state`` (or, not
    recorded, for some parameter after a step): otherwise the moments would silently restart at zero."""
    bad = f"is corrupt: {OPTIMIZER_FILE} "
    if not isinstance(state, dict) or set(state) != {"state", "param_groups"}:
        return bad + "must be an optimizer state_dict with keys 'state' and 'param_groups'"
    groups = state["param_groups"]
    ids = (
        [i for g in groups for i in g["params"]]
        if isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
        else None
    )
    if ids is None or not all(_INDEX(i) for i in ids) or len(set(ids)) != len(ids):
        return bad + "'param_groups' must be dicts listing distinct parameter indices (ints >= 0)"
    for g, group in enumerate(groups):
        for key, value in group.items():
            if (check := _GROUP_CHECKS.get(key)) is not None and not check(value):
                return bad + f"'param_groups[{g}][{key!r}]' must be {check.expected}; got {shorten(repr(value), 80)}"
    per_param = state["state"]
    if (
        not isinstance(per_param, dict)
        or not set(per_param) <= set(ids)
        or not all(isinstance(e, dict) and e and all(isinstance(k, str) for k in e) for e in per_param.values())
    ):
        return bad + "'state' must map parameter indices listed in 'param_groups' to their state"
    for i, entry in per_param.items():
        for name, value in entry.items():
            if problem := _state_value_problem(name, value, step):
                return bad + f"'state[{i}][{name!r}]' {problem}"
    if with_state is not None and set(per_param) != set(with_state):
        lost, extra = sorted(set(with_state) - set(per_param)), sorted(set(per_param) - set(with_state))
        return (
            bad + f"holds state for {len(per_param)} parameters but trainer_state.json 'optimizer_state' "
            f"lists {len(with_state)} (missing {lost[:8]}, unexpected {extra[:8]}): the optimizer would "
            "restart their moments at zero"
        )
    if with_state is None and step > 0 and not per_param:
        return bad + f"holds no per-parameter state at step {step}: the optimizer would restart its moments at zero"
    return None


def optimizer_state_indices(optimizer: Any) -> list[int]:
    """The indices (as in ``optimizer.state_dict()``) of the parameters with optimizer state (e.g. Adam's moments)."""
    params = (p for g in optimizer.param_groups for p in g["params"])
    return [i for i, p in enumerate(params) if optimizer.state.get(p)]


def optimizer_fit_problem(saved: dict[str, Any], optimizer: Any) -> str | None:
    """The groups of ``saved`` have the sizes of ``optimizer``'s, each parameter's state the keys and dtypes its class
    keeps (:func:`_state_layout`) and the parameter's shape."""
    sizes, mine = [len(g["params"]) for g in saved["param_groups"]], [len(g["params"]) for g in optimizer.param_groups]
    if sizes != mine:
        return f"{OPTIMIZER_FILE} has parameter groups of sizes {sizes}; this optimizer {mine}"
    for g, (saved_group, group) in enumerate(zip(saved["param_groups"], optimizer.param_groups, strict=True)):
        keys, mine = set(saved_group) - {"params"}, set(group) - {"params"}
        if keys - mine:  # an option this optimizer lacks; one it has and the file lacks (an older torch): its default
            return (
                f"{OPTIMIZER_FILE} 'param_groups[{g}]' has the options {sorted(keys - mine)} that this optimizer "
                f"({type(optimizer).__name__}) does not have (its options: {sorted(mine)})"
            )
        for key in (k for k in _GROUP_MODES if k in keys and saved_group[k] != group[k]):
            return (
                f"{OPTIMIZER_FILE} 'param_groups[{g}][{key!r}]' is {saved_group[key]!r}; this run's optimizer has "
                f"{group[key]!r} (loading it would change how every step updates the weights)"
            )
    layouts = [_state_layout(optimizer, g) for g in optimizer.param_groups]
    where = {
        i: (layout, p)
        for sg, g, layout in zip(saved["param_groups"], optimizer.param_groups, layouts, strict=True)
        for i, p in zip(sg["params"], g["params"], strict=True)
    }
    for i, entry in saved["state"].items():
        layout, param = where[i]
        if layout is not None and set(entry) != set(layout):
            return (
                f"{OPTIMIZER_FILE} 'state[{i}]' has keys {sorted(entry)}; this optimizer "
                f"({type(optimizer).__name__}) keeps {sorted(layout)} for every parameter it updates"
            )
        for name, value in entry.items():
            dtype = (layout or {}).get(name)
            if dtype is not None and not (isinstance(value, Tensor) and value.dtype == dtype):
                got = f"Tensor of dtype {value.dtype}" if isinstance(value, Tensor) else type(value).__name__
                return f"{OPTIMIZER_FILE} 'state[{i}][{name!r}]' must be a tensor of dtype {dtype}; got {got}"
            if isinstance(value, Tensor) and value.dim() > 0 and value.shape != param.shape:
                return (
                    f"{OPTIMIZER_FILE} 'state[{i}][{name!r}]' has shape {tuple(value.shape)}; the "
                    f"parameter has {tuple(param.shape)}"
                )
    return None


def _state_layout(optimizer: Any, group: dict[str, Any]) -> dict[str, torch.dtype | None] | None:
    """``{state key: tensor dtype or None}`` after one step of a fresh optimizer of ``optimizer``'s class on a
    2-element parameter of ``group``; ``None`` when that fails (then not checked)."""
    try:
        ref = group["params"][0]
        probe = torch.zeros(2, dtype=ref.dtype, device=ref.device, requires_grad=True)
        fresh = type(optimizer)([{**{k: v for k, v in group.items() if k != "params"}, "params": [probe]}])
        probe.grad = torch.zeros_like(probe)
        fresh.step()
    except Exception:  # noqa: BLE001 - an optimizer class that cannot be probed: its keys are not checked
        return None
    return {k: (v.dtype if isinstance(v, Tensor) else None) for k, v in fresh.state[probe].items()}
