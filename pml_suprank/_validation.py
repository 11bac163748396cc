"""Shared argument checks. Every public entry point validates its input with these helpers so that
bad input raises a ``ValueError``/``TypeError`` naming the argument, the expectation and what was received.
Declarative checks (:class:`OptionCheck`: a predicate and its expectation) describe the values of option fields and
of loaded files (``config.json``, ``data_spec.json``, hub_configs), whose readers name the key and the file."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from ._async_check import check_async

__all__ = [
    "MAX_CONFIG_INT",
    "OptionCheck",
    "check_bool",
    "check_choice",
    "check_device",
    "check_embeddings",
    "check_labels",
    "check_level_weights",
    "check_positive",
    "check_positive_int",
    "check_probability",
    "is_bool",
    "is_choice",
    "is_finite",
    "is_int",
    "is_number",
    "is_str",
    "list_of",
    "nested_batch_hint",
    "optional",
    "shorten",
]


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool``, else raise ``TypeError`` (``bool("false")`` is ``True``: a string or a
    number read from a config must not silently switch an option on)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (true or false); got {type(value).__name__} {str(value)[:64]!r}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing the valid values."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")
    return value


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    return float(value)


def check_positive(
    name: str, value: float, *, strict: bool = True, allow_inf: bool = False, maximum: float = math.inf
) -> float:
    """Check a real scalar is > 0 (``strict``) or >= 0, and <= ``maximum``."""
    value = _real(name, value)
    if value != value or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be finite; got {value}")
    if (strict and value <= 0) or (not strict and value < 0) or value > maximum:
        bound = f" and <= {maximum:g}" if maximum < math.inf else ""
        raise ValueError(f"{name} must be {'>' if strict else '>='} 0{bound}; got {value}")
    return value


def check_probability(name: str, value: float, *, closed: bool = True) -> float:
    """Check a real scalar lies in [0, 1] (``closed``) or (0, 1)."""
    value = _real(name, value)
    if not (0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0):
        raise ValueError(f"{name} must lie in {'[0, 1]' if closed else '(0, 1)'}; got {value}")
    return value


def check_embeddings(name: str, x: Any, *, allow_empty: bool = False, asynchronous: bool = False) -> Tensor:
    """Check ``x`` is a 2-D floating tensor ``(N, D)`` without NaN/inf; ``asynchronous=True`` (the losses' hot path)
    checks finiteness without a host read (:func:`~pml_suprank._async_check.check_async`: a device-side assertion on
    CUDA), else on the host (always ``ValueError``)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (N, D); got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"{name} must have shape (N, D); got shape {tuple(x.shape)}{nested_batch_hint(tuple(x.shape), 2)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {x.dtype}")
    if x.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} must contain at least one row; got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one feature column; got shape {tuple(x.shape)}")
    finite = torch.isfinite(x).all()  # no gradient flows through isfinite

    def error() -> ValueError:
        bad = int((~torch.isfinite(x.detach())).any(dim=1).sum())
        return ValueError(f"{name} contains NaN or inf values (in {bad} of {x.shape[0]} rows)")

    if asynchronous:
        check_async(finite, error, f"{name} contains NaN or inf values")
    elif not bool(finite):
        raise error()
    return x


def check_labels(name: str, labels: Any, n: int, *, allow_2d: bool = True, n_name: str = "embeddings") -> Tensor:
    """Check ``labels`` is an integer tensor of shape ``(n,)`` or ``(n, L)`` (when ``allow_2d``)."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor; got {type(labels).__name__}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype (e.g. torch.long); got dtype {labels.dtype}")
    shapes = "(N,) or (N, L)" if allow_2d else "(N,)"
    if labels.dim() not in ((1, 2) if allow_2d else (1,)) or labels.shape[0] != n:
        hint = nested_batch_hint(tuple(labels.shape), 2 if allow_2d else 1)
        raise ValueError(
            f"{name} must have shape {shapes} with N == {n_name}.shape[0] == {n}; got shape {tuple(labels.shape)}{hint}"
        )
    if labels.dim() == 2 and labels.shape[1] == 0:
        raise ValueError(f"{name} must have at least one label column; got shape {tuple(labels.shape)}")
    return labels


def nested_batch_hint(shape: tuple[int, ...], expected_dim: int) -> str:
    """The hint for a shape with one dimension too many (a batch of batches, as ``DataLoader(sampler=<batch sampler>)``
    gives)."""
    if len(shape) != expected_dim + 1:
        return ""
    return (
        " (if this is a batch of batches: a pml_suprank batch sampler such as MPerClassBatchSampler or "
        "HierarchicalSampler yields whole batches, so pass it as DataLoader(batch_sampler=...), not sampler= as PML "
        "samplers are passed)"
    )


def check_positive_int(
    name: str, value: Any, *, minimum: int = 1, allow_none: bool = False, maximum: int | None = None
) -> int | None:
    """Return ``int(value)`` if it is an int (``numbers.Integral``, not a bool) in ``[minimum, maximum]`` (or ``None``
    with ``allow_none``); else ``TypeError`` (not an int) or ``ValueError`` (out of range)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = f"None or an int >= {minimum}" if allow_none else f"an int >= {minimum}"
        raise TypeError(f"{name} must be {expected}; got {type(value).__name__} {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        expected = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {expected}; got {value}")
    return int(value)


def check_level_weights(name: str, weights: Any, num_levels: int | None = None) -> list[float] | None:
    """Per-level weights ``w_1..w_L`` (the evaluator's ΣwAP, the hierarchical losses' relevance) as floats: a sequence
    or 1-D tensor of finite reals ``>= 0``, not all zero, ``num_levels`` of them when given; ``None`` stays ``None``.
    ``TypeError``: not a sequence of reals; ``ValueError``: empty, wrong length, NaN/inf, negative or all zero."""
    if weights is None:
        return None
    items = weights.tolist() if isinstance(weights, Tensor) and weights.dim() == 1 else weights
    if isinstance(items, (str, bytes, Tensor)) or not isinstance(items, Iterable):
        raise TypeError(f"{name} must be a sequence of floats (or a 1-D real tensor), one per level; got {weights!r}")
    values = []
    for w in items:
        w = w.item() if isinstance(w, Tensor) and w.numel() == 1 else w
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise TypeError(f"{name} must contain real numbers; got {type(w).__name__} {w!r}")
        values.append(float(w))
    if not values:
        raise ValueError(f"{name} must have one weight per level; got an empty sequence")
    if num_levels is not None and len(values) != num_levels:
        raise ValueError(f"{name} must be {num_levels} weights, one per level (w_1..w_L); got {len(values)}: {values}")
    if not all(math.isfinite(w) for w in values):
        raise ValueError(f"{name} must be finite; got {values}")
    if min(values) < 0:
        raise ValueError(f"{name} must be non-negative; got {values}")
    if max(values) == 0:
        raise ValueError(f"{name} must not be all zero (the weighted sum would be 0/0); got {values}")
    return values


def check_device(name: str, device: Any) -> torch.device | None:
    """Parse ``device`` (``None``, a string or a ``torch.device``) and check that its backend is available here:
    ``TypeError`` for another type, ``ValueError`` for an unparsable string, an unavailable CUDA/MPS/XPU backend or
    a device index past the number of devices."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be None, a str or a torch.device; got {type(device).__name__} {device!r}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{name} must be a valid torch device string such as 'cpu' or 'cuda:0'; got {device!r}") from e
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r} but CUDA is not available on this machine; use {name}='cpu'")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={device!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif parsed.type in ("mps", "xpu"):
        backend = getattr(torch.backends, parsed.type, None) if parsed.type == "mps" else getattr(torch, "xpu", None)
        if backend is None or not backend.is_available():
            raise ValueError(f"{name}={device!r} but the {parsed.type} backend is not available; use {name}='cpu'")
    return parsed


def shorten(text: str, limit: int = 300) -> str:
    """``text`` cut to at most ``limit`` characters, with the number of characters left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


# -- declarative value checks: option fields, loaded files --------------------------------------------------------
#: the largest int an option accepts unless it sets a tighter bound (a loaded file cannot ask for unbounded work)
MAX_CONFIG_INT = 2**31 - 1


@dataclass(frozen=True)
class OptionCheck:
    """A value check: ``fn(value) -> bool`` and the expectation (``"an int >= 1"``); ``choices`` (a closed set, also
    the flag's metavar), ``kind`` and ``bounds`` ``(low, high, strict, open_high)`` describe it for tools and tests."""

    fn: Callable[[Any], bool]
    expected: str
    choices: tuple[Any, ...] | None = None
    kind: str | None = None
    bounds: tuple[float, float, bool, bool] | None = None

    def __call__(self, value: Any) -> bool:
        return bool(self.fn(value))


def is_bool() -> OptionCheck:
    return OptionCheck(lambda v: isinstance(v, bool), "a bool", kind="bool")


def is_str(expected: str = "a non-empty string") -> OptionCheck:
    return OptionCheck(lambda v: isinstance(v, str) and bool(v), expected, kind="str")


def is_int(low: int = 0, high: int = MAX_CONFIG_INT) -> OptionCheck:
    """An int (not a bool) in ``[low, high]``."""
    expected = f"an int >= {low}" if high == MAX_CONFIG_INT else f"an int in [{low}, {high}]"
    return OptionCheck(lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high, expected,
                       kind="int", bounds=(low, high, False, False))  # fmt: skip


def is_number(low: float = 0, *, strict: bool = False, high: float = math.inf, open_high: bool = False) -> OptionCheck:
    """A finite real number ``>= low`` (``> low`` if ``strict``) and ``<= high`` (``< high`` if ``open_high``)."""
    expected = (f"a finite number {'>' if strict else '>='} {low:g}" if high == math.inf
                else f"a number in {'(' if strict else '['}{low:g}, {high:g}{')' if open_high else ']'}")  # fmt: skip
    return OptionCheck(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                       and (isinstance(v, int) or math.isfinite(v))  # an int of any size is finite: no float()
                       and (v > low if strict else v >= low) and (v < high if open_high else v <= high),
                       expected, kind="number", bounds=(low, high, strict, open_high))  # fmt: skip


def is_finite() -> OptionCheck:
    return replace(is_number(-math.inf), expected="a finite number")


def is_choice(*values: Any) -> OptionCheck:
    return OptionCheck(lambda v: v in values, f"one of {', '.join(map(str, values))}", tuple(values), kind="choice")


def optional(check: OptionCheck) -> OptionCheck:
    """``None`` (YAML ``null``) or a value passing ``check``."""
    return replace(check, fn=lambda v: v is None or check(v), expected=f"null or {check.expected}")


def list_of(check: OptionCheck, expected: str, min_len: int = 1) -> OptionCheck:
    return OptionCheck(lambda v: isinstance(v, (list, tuple)) and len(v) >= min_len and all(map(check, v)), expected)
