"""Full precision for the rank losses under ``torch.autocast``: in bfloat16 a cosine near 0.9 has a spacing of
``2⁻⁸``, so most differences between close items become ties at ``τ = 0.01`` (SupRank Eq. 4) and the surrogate ranks
and gradients are wrong. :func:`float32_forward` / :func:`float32_backward` run a loss's forward / a custom
backward with autocast disabled (fp16/bf16 arguments up-cast), eager or ``torch.compile``\\ d.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = ["LOW_PRECISION", "float32_backward", "float32_forward", "upcast"]

LOW_PRECISION = (torch.float16, torch.bfloat16)
F = TypeVar("F", bound=Callable[..., Any])


#: device types this torch build can autocast, read once at import (``torch.amp.is_autocast_available`` cannot be
#: traced by ``torch.compile`` on older torch releases)
AUTOCAST_DEVICE_TYPES = frozenset(
    d for d in ("cpu", "cuda", "xpu", "hpu", "mps", "xla", "privateuseone") if torch.amp.is_autocast_available(d)
)


def upcast(x: Any) -> Any:
    """``x.float()`` for a floating fp16/bf16 tensor; anything else unchanged."""
    if isinstance(x, Tensor) and x.dtype in LOW_PRECISION:
        return x.float()
    return x


def _device_type(args: tuple, kwargs: dict) -> str | None:
    # a plain loop: dynamo before torch 2.5 cannot trace ``next()`` over a generator
    for x in (*args, *kwargs.values()):
        if isinstance(x, Tensor):
            return x.device.type
    return None


def float32_forward(forward: F) -> F:
    """Decorate ``forward(self, *tensors, ...)`` so that it runs with autocast disabled on the device of its first
    tensor argument, fp16/bf16 tensor arguments (embeddings, reference embeddings) up-cast to float32 first."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        device_type = _device_type(args, kwargs)
        args = tuple(upcast(a) for a in args)
        kwargs = {k: upcast(v) for k, v in kwargs.items()}
        if device_type not in AUTOCAST_DEVICE_TYPES:
            return forward(self, *args, **kwargs)
        with torch.autocast(device_type=device_type, enabled=False):
            return forward(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def float32_backward(backward: F) -> F:
    """Decorate a :class:`torch.autograd.Function` ``backward(ctx, *grads)`` to run with autocast disabled: eager
    autograd runs it under the autocast state of ``.backward()``, ``torch.compile`` under that of the compiled call
    (bfloat16 matrix products although the forward ran in float32)."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        device_type = _device_type(grads, {})
        if device_type not in AUTOCAST_DEVICE_TYPES:
            return backward(ctx, *grads)
        with torch.autocast(device_type=device_type, enabled=False):
            return backward(ctx, *grads)

    return wrapper  # type: ignore[return-value]
