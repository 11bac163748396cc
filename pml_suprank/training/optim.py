"""Optimizer with per-group learning rates (``backbone`` / ``head`` / ``proxies``) and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainingConfig

__all__ = ["build_optimizer", "build_scheduler"]


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
    if not isinstance(config, TrainingConfig):
        raise TypeError(f"config must be a TrainingConfig; got {type(config).__name__}")
    groups = _model_groups(model)
    seen = {id(p) for ps in groups.values() for p in ps}
    proxies = [p for p in (loss.parameters() if loss is not None else []) if p.requires_grad and id(p) not in seen]
    spec = [
        ("backbone", groups["backbone"], config.lr_backbone, config.weight_decay),
        ("head", groups["head"], config.lr_head, config.weight_decay),
        ("proxies", proxies, config.lr_proxies, config.proxies_weight_decay),
    ]
    param_groups = [
        {"params": ps, "lr": lr, "weight_decay": wd, "name": name} for name, ps, lr, wd in spec if len(ps) > 0
    ]
    if not param_groups:
        raise ValueError("model and loss have no trainable parameters")
    if config.optimizer == "adam":
        return torch.optim.Adam(param_groups)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(param_groups)
    return torch.optim.SGD(param_groups, momentum=config.momentum, nesterov=config.momentum > 0)


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
