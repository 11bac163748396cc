"""Optimizer with per-group learning rates (``backbone`` / ``head`` / ``proxies``) and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainingConfig

__all__ = ["apply_group_settings", "build_optimizer", "build_scheduler", "group_settings"]


def _model_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    if hasattr(model, "parameter_groups"):
        groups = model.parameter_groups()
        return {"backbone": list(groups.get("backbone", [])), "head": list(groups.get("head", []))}
    backbone = [p for p in getattr(model, "backbone", nn.Identity()).parameters() if p.requires_grad]
    ids = {id(p) for p in backbone}
    return {"backbone": backbone, "head": [p for p in model.parameters() if p.requires_grad and id(p) not in ids]}


def build_optimizer(model: nn.Module, loss: nn.Module | None, config: TrainingConfig) -> torch.optim.Optimizer:
    """One optimizer with the named parameter groups ``backbone`` / ``head`` (``model.parameter_groups()``) and
    ``proxies`` (the trainable parameters of ``loss``), each with its own lr; empty groups are left out."""
    settings = group_settings(config)
    groups = _model_groups(model)
    seen = {id(p) for ps in groups.values() for p in ps}
    groups["proxies"] = [p for p in (loss.parameters() if loss is not None else []) if p.requires_grad
                         and id(p) not in seen]  # fmt: skip
    param_groups = [{"params": ps, **settings[name], "name": name} for name, ps in groups.items() if len(ps) > 0]
    if not param_groups:
        raise ValueError("model and loss have no trainable parameters")
    if config.optimizer == "adam":
        return torch.optim.Adam(param_groups)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(param_groups)
    return torch.optim.SGD(param_groups, momentum=config.momentum, nesterov=config.momentum > 0)


def group_settings(config: TrainingConfig) -> dict[str, dict[str, float]]:
    """The hyper-parameters of each named parameter group (``lr``, ``weight_decay``; SGD: ``momentum``)."""
    if not isinstance(config, TrainingConfig):
        raise TypeError(f"config must be a TrainingConfig; got {type(config).__name__}")
    momentum = {"momentum": config.momentum} if config.optimizer == "sgd" else {}
    return {
        "backbone": {"lr": config.lr_backbone, "weight_decay": config.weight_decay, **momentum},
        "head": {"lr": config.lr_head, "weight_decay": config.weight_decay, **momentum},
        "proxies": {"lr": config.lr_proxies, "weight_decay": config.proxies_weight_decay, **momentum},
    }


def apply_group_settings(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, config: TrainingConfig
) -> list[str]:
    """Give an optimizer and its schedule loaded from another run's checkpoint this ``config``'s hyper-parameters
    (:func:`group_settings`): each group's base learning rate (the current one: base times the schedule's factor at
    its step), weight decay and momentum; the optimizer's per-parameter state (moments) is kept. Returns the changes
    as ``"group.key: old -> new"`` (``lr``: the base learning rate)."""
    settings, changes = group_settings(config), []
    names = [group.get("name") for group in optimizer.param_groups]
    if not set(names) <= set(settings) or len(getattr(scheduler, "base_lrs", ())) != len(names):
        raise ValueError(f"optimizer and scheduler must be those of build_optimizer / build_scheduler (groups named "
                         f"{list(settings)}, one base lr each); got groups {names}")  # fmt: skip
    for i, group in enumerate(optimizer.param_groups):
        new = settings[group["name"]]
        old = {**{k: group[k] for k in new if k in group}, "lr": scheduler.base_lrs[i]}
        changes += [f"{group['name']}.{k}: {old[k]!r} -> {v!r}" for k, v in new.items() if old.get(k) != v]
        scheduler.base_lrs[i] = group["initial_lr"] = new["lr"]
        group.update({**new, "lr": new["lr"] * scheduler.lr_lambdas[i](scheduler.last_epoch)})
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return changes


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, config: TrainingConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine decay of every lr to ``min_lr_ratio`` times it over ``total_steps`` (``CosineAnnealingLR`` of the
    reference code), or a constant schedule."""
    total_steps = max(int(total_steps), 1)
    ratio = config.min_lr_ratio

    def factor(step: int) -> float:
        if config.scheduler == "constant":
            return 1.0
        t = min(step, total_steps) / total_steps
        return ratio + (1.0 - ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
