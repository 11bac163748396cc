"""What a loaded object must hold: tensor layouts declared from its config and checked before any tensor is used.

A saved object (a detector, a HEAT prior) declares its tensors as ``{name: TensorSpec}``: the shape, with symbolic
sizes shared between tensors (``("C", "D")`` for a classifier weight, ``("C",)`` for its bias), the dtype kind and
the value constraints no fitted object can violate, checked by :func:`check_schema`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

__all__ = ["Sizes", "TensorSpec", "check_names", "check_schema", "check_tensor", "kind_of"]

Kind = Literal["floating", "integer", "bool"]


def kind_of(t: Tensor) -> str:
    """``"floating"``, ``"integer"`` or ``"bool"`` (complex tensors count as floating and are refused elsewhere)."""
    if t.is_floating_point() or t.is_complex():
        return "floating"
    return "bool" if t.dtype == torch.bool else "integer"


def check_tensor(name: str, t: object, source: str | Path, *, finite: bool) -> None:
    """Refuse (``ValueError`` naming ``source`` and ``name``) a non-tensor, a complex tensor and, with ``finite``, a
    floating tensor holding NaN or infinite values."""
    if not isinstance(t, Tensor) or t.is_complex():
        raise ValueError(f"{source}: tensor {name!r} must be a real or integer tensor; got {type(t).__name__}")
    if finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{source}: tensor {name!r} holds NaN or infinite values (corrupt checkpoint?)")


def check_names(state: Mapping[str, object], source: str | Path, names: Collection[str]) -> None:
    """Refuse (``ValueError`` naming ``source``) tensor names of ``state`` outside ``names``."""
    unexpected = sorted(set(state) - set(names))
    if unexpected:
        raise ValueError(f"{source} holds tensors {unexpected} that are not part of the state {sorted(names)}")


@dataclass(frozen=True)
class TensorSpec:
    """The expected layout of one saved tensor.

    Attributes:
        shape: One entry per dimension: an ``int`` (exact size) or a ``str`` symbol bound at its first use and
            required to agree everywhere else (``()`` for a scalar).
        kind: ``"floating"``, ``"integer"`` or ``"bool"``.
        optional: The tensor may be absent (e.g. a classifier bias).
        nonzero: Refuse a tensor whose values are all zero (no fitted object can hold one).
        positive: Refuse values ``<= 0`` (standard deviations, class weights must be ``>= 0`` — use ``min_value``).
        min_value: Refuse values below it.
        lower_triangular: A square factor ``L`` of ``L Lᵀ``: zero above the diagonal, positive diagonal.
        min_sizes: ``{symbol: minimum}`` checked once the symbol is bound.
    """

    shape: tuple[int | str, ...]
    kind: Kind = "floating"
    optional: bool = False
    nonzero: bool = False
    positive: bool = False
    min_value: float | None = None
    lower_triangular: bool = False
    min_sizes: tuple[tuple[str, int], ...] = ()

    def renamed(self, prefix: str) -> TensorSpec:
        """The same spec with every size symbol prefixed (to keep per-component symbols apart)."""
        shape = tuple(f"{prefix}{s}" if isinstance(s, str) else s for s in self.shape)
        return replace(self, shape=shape, min_sizes=tuple((f"{prefix}{s}", m) for s, m in self.min_sizes))


class Sizes(dict):
    """``{symbol: size}`` bound by :func:`check_schema`, remembering which tensor bound each symbol (``origin``)."""

    def __init__(self, *args, origin: Mapping[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.origin = {symbol: "config.json or an earlier tensor" for symbol in self} | dict(origin or {})


def _check_values(name: str, t: Tensor, spec: TensorSpec, where: str) -> None:
    check_tensor(name, t, where, finite=True)
    if spec.kind == "bool" or t.numel() == 0:
        return
    values = t.detach().to(torch.float64) if spec.kind == "floating" else t.detach()
    if spec.nonzero and not bool((values != 0).any()):
        raise ValueError(f"{where}: tensor {name!r} is all zeros, which no fitted object can hold (corrupt file?)")
    if spec.positive and not bool((values > 0).all()):
        raise ValueError(f"{where}: tensor {name!r} must be > 0 everywhere; got min {float(values.min())}")
    if spec.min_value is not None and not bool((values >= spec.min_value).all()):
        raise ValueError(f"{where}: tensor {name!r} must be >= {spec.min_value}; got min {float(values.min())}")
    if spec.lower_triangular:
        if bool(torch.triu(values, diagonal=1).ne(0).any()) or not bool((torch.diagonal(values) > 0).all()):
            raise ValueError(
                f"{where}: tensor {name!r} must be a Cholesky factor (lower triangular, positive diagonal)"
            )


def check_schema(
    state: Mapping[str, Tensor],
    source: str | Path,
    specs: Mapping[str, TensorSpec],
    *,
    sizes: Mapping[str, int] | None = None,
    allow_unexpected: bool = False,
) -> Sizes:
    """Check loaded tensors against their declared layouts; return the bound size symbols.

    Args:
        state: The loaded ``{name: Tensor}``.
        source: The file the tensors came from (named in every error).
        specs: ``{name: TensorSpec}``: every non-optional name must be present.
        sizes: Symbols already bound (e.g. by an earlier call, or from the config).
        allow_unexpected: Ignore names of ``state`` absent from ``specs`` (checked by a later call).

    Returns:
        ``{symbol: size}`` with ``sizes`` and every symbol bound here (a :class:`Sizes`: pass it on as ``sizes``
        so that later errors name the tensor that bound a symbol).

    Raises:
        ValueError: A missing or unexpected tensor, a non-tensor, a wrong rank, size or dtype kind, or values that
            violate the spec, naming ``source`` and the key.
    """
    bound = Sizes(sizes or {}, origin=getattr(sizes, "origin", None))
    if not allow_unexpected:
        check_names(state, source, specs)
    for name, spec in specs.items():
        if name not in state:
            if spec.optional:
                continue
            raise ValueError(
                f"{source} has no tensor {name!r} (expected shape {spec.shape}); truncated or foreign file?"
            )
        t = state[name]
        check_tensor(name, t, source, finite=False)
        if t.dim() != len(spec.shape):
            raise ValueError(
                f"{source}: tensor {name!r} must have {len(spec.shape)} dimension(s) {spec.shape}; "
                f"got shape {tuple(t.shape)}"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, t.shape)):
            like = ""
            if isinstance(want, str):
                origin = bound.origin.setdefault(want, f"dimension {axis} of tensor {name!r}")
                like, want = f" ({want}, as {origin})", bound.setdefault(want, int(got))
            if int(got) != want:
                raise ValueError(
                    f"{source}: tensor {name!r} has shape {tuple(t.shape)}; dimension {axis} must be {want}{like}; "
                    "the saved tensors disagree with each other or with their config"
                )
        for symbol, minimum in spec.min_sizes:
            if symbol in bound and bound[symbol] < minimum:
                raise ValueError(f"{source}: tensor {name!r} has shape {tuple(t.shape)}; {symbol} must be >= {minimum}")
        if kind_of(t) != spec.kind:
            raise ValueError(f"{source}: tensor {name!r} must be a {spec.kind} tensor; got {t.dtype}")
        _check_values(name, t, spec, str(source))
    return bound
