"""Shared argument checks. Every public entry point validates its input with these helpers so that
bad input raises a ``ValueError``/``TypeError`` naming the argument, the expectation and what was received."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing the valid values."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")
    return value


def check_positive(name: str, value: float, *, strict: bool = True, allow_inf: bool = False) -> float:
    """Check a real scalar is > 0 (``strict``) or >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    value = float(value)
    if value != value or (value in (float("inf"), float("-inf")) and not allow_inf):
        raise ValueError(f"{name} must be finite; got {value}")
    if (strict and value <= 0) or (not strict and value < 0):
        raise ValueError(f"{name} must be {'>' if strict else '>='} 0; got {value}")
    return value


def check_probability(name: str, value: float, *, closed: bool = True) -> float:
    """Check a real scalar lies in [0, 1] (``closed``) or (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    value = float(value)
    ok = 0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0
    if not ok:
        raise ValueError(f"{name} must lie in {'[0, 1]' if closed else '(0, 1)'}; got {value}")
    return value


def check_embeddings(name: str, x: Any, *, allow_empty: bool = False) -> Tensor:
    """Check ``x`` is a 2-D floating tensor ``(N, D)`` without NaN/inf."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (N, D); got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape (N, D); got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {x.dtype}")
    if x.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} must contain at least one row; got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one feature column; got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x.detach()).all()):
        bad = int((~torch.isfinite(x.detach())).any(dim=1).sum())
        raise ValueError(f"{name} contains NaN or inf values (in {bad} of {x.shape[0]} rows)")
    return x


def check_labels(name: str, labels: Any, n: int, *, allow_2d: bool = True, n_name: str = "embeddings") -> Tensor:
    """Check ``labels`` is an integer tensor of shape ``(n,)`` or ``(n, L)`` (when ``allow_2d``)."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor; got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype (e.g. torch.long); got dtype {labels.dtype}")
    shapes = "(N,) or (N, L)" if allow_2d else "(N,)"
    if labels.dim() not in ((1, 2) if allow_2d else (1,)) or labels.shape[0] != n:
        raise ValueError(
            f"{name} must have shape {shapes} with N == {n_name}.shape[0] == {n}; got shape {tuple(labels.shape)}"
        )
    if labels.dim() == 2 and labels.shape[1] == 0:
        raise ValueError(f"{name} must have at least one label column; got shape {tuple(labels.shape)}")
    return labels
