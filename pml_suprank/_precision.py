"""Full precision for the rank losses under mixed precision (``torch.autocast``).

A rank loss compares similarities through sigmoids of differences divided by a small temperature (SupRank Eq. 4,
``τ = 0.01``): in bfloat16 a cosine near 0.9 has a spacing of ``2⁻⁸ ≈ 0.004`` and most differences between close
items round to exactly zero (ties), so the surrogate ranks and their gradients are wrong. :func:`float32_forward`
runs a loss's ``forward`` with autocast disabled and every fp16/bf16 tensor argument up-cast to float32: the scores,
the rank math and every sub-term (proxy / calibration terms) are then float32 under any autocast context, eager or
``torch.compile``\\ d (the context is part of the traced graph).
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


def _autocast_device_types() -> frozenset[str]:
    """The device types this torch build can autocast, read once at import (``torch.amp.is_autocast_available``
    cannot be traced by ``torch.compile`` on older torch releases)."""
    candidates = ("cpu", "cuda", "xpu", "hpu", "mps", "xla", "privateuseone")
    return frozenset(d for d in candidates if torch.amp.is_autocast_available(d))


#: device types with autocast support in this torch build (a constant of the installed torch)
AUTOCAST_DEVICE_TYPES = _autocast_device_types()


def upcast(x: Any) -> Any:
    """``x.float()`` for a floating fp16/bf16 tensor; anything else unchanged."""
    if isinstance(x, Tensor) and x.dtype in LOW_PRECISION:
        return x.float()
    return x


def _device_type(args: tuple, kwargs: dict) -> str | None:
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
    """Decorate a :class:`torch.autograd.Function` ``backward(ctx, *grads)`` so that it runs with autocast disabled.

    Eager autograd runs a custom backward under the autocast state of the ``.backward()`` call; ``torch.compile``
    traces it together with the forward, under the autocast state of the compiled call: a backward traced inside
    ``torch.autocast(dtype=torch.bfloat16)`` would compute its matrix products in bfloat16 although the forward ran
    in float32. Disabled autocast keeps the gradient float32 in both cases."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        device_type = _device_type(grads, {})
        if device_type not in AUTOCAST_DEVICE_TYPES:
            return backward(ctx, *grads)
        with torch.autocast(device_type=device_type, enabled=False):
            return backward(ctx, *grads)

    return wrapper  # type: ignore[return-value]
