"""Compiled = eager, or refused: each new graph of a compiled loss is checked against the eager loss on its batch.

``loss.compile(...)`` (:class:`GuardedCompileMixin`) and :func:`compile_loss` (the recipes' ``--compile_loss``)
compile in place and compare the first call of every call signature with eager (outputs, embedding and parameter
gradients): a relative difference above :data:`COMPILE_RTOL` raises :class:`CompiledLossMismatchError`; a batch with
a non-finite eager loss is judged later. After ``torch.compile(loss)``, call :func:`check_compiled_loss`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "COMPILE_RTOL",
    "CompiledLossMismatchError",
    "GuardedCall",
    "GuardedCompileMixin",
    "call_signature",
    "check_compiled_loss",
    "compile_loss",
    "relative_difference",
]

#: largest relative difference (outputs and gradients) accepted between a compiled loss and the eager one
COMPILE_RTOL = 1e-4


class CompiledLossMismatchError(RuntimeError):
    """A compiled loss differs from the eager loss on the same batch (an output or a gradient)."""


def relative_difference(got: Tensor | None, expected: Tensor | None) -> float:
    """``‖got − expected‖₂ / max(‖got‖₂, ‖expected‖₂)`` in float64; ``None`` stands for a zero tensor (an unused
    input's gradient). 0 when both are zero; ``inf`` for different shapes or a non-finite entry on one side only."""
    if got is None and expected is None:
        return 0.0
    if got is None or expected is None:
        present = got if got is not None else expected
        return 0.0 if not bool(present.detach().ne(0).any()) else 1.0
    a, b = got.detach().double(), expected.detach().double()
    if a.shape != b.shape:
        return math.inf
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(finite_a, finite_b) or not torch.equal(a[~finite_a], b[~finite_b]):
        return math.inf
    a, b = a[finite_a], b[finite_b]
    scale = max(float(a.norm()), float(b.norm()))
    return 0.0 if scale == 0.0 else float((a - b).norm()) / scale


def _swap(args: tuple, kwargs: dict, old: Tensor, new: Tensor) -> tuple[tuple, dict]:
    """``args`` / ``kwargs`` with every occurrence of the object ``old`` replaced by ``new`` (``ref_emb=embeddings``
    stays the batch)."""
    return (
        tuple(new if a is old else a for a in args),
        {k: (new if v is old else v) for k, v in kwargs.items()},
    )


def _tensors(out: Any) -> list[Tensor] | None:
    """The floating tensors of a loss output (tuples, lists and dicts walked in order), or ``None``."""
    if isinstance(out, Tensor):
        return [out] if out.is_floating_point() else None
    found: list[Tensor] = []
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    for item in items:
        found += _tensors(item) or []
    return found or None


def _finite(tensors: list[Tensor | None]) -> bool:
    return all(t is None or bool(torch.isfinite(t.detach()).all()) for t in tensors)


def call_signature(args: tuple, kwargs: dict) -> tuple:
    """What makes ``torch.compile`` trace another graph: every tensor argument's shape, dtype, device and
    ``requires_grad``, the others' types, and the grad mode."""

    def one(v: Any) -> Any:
        if isinstance(v, Tensor):
            return ("T", tuple(v.shape), v.dtype, v.device.type, v.requires_grad)
        return type(v).__name__

    return (torch.is_grad_enabled(), tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items())))


def _gradients(out: Tensor, inputs: list[Tensor]) -> list[Tensor | None]:
    if not inputs or not out.requires_grad:
        return [None] * len(inputs)
    return list(torch.autograd.grad(out.sum(), inputs, allow_unused=True))


def compare_with_eager(
    owner: str,
    compiled_out: Any,
    eager: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    *,
    compiled: Callable[..., Any],
    parameters: list[tuple[str, Tensor]] | None = None,
    rtol: float = COMPILE_RTOL,
) -> bool:
    """Compare ``compiled(*args, **kwargs)`` with ``eager(*args, **kwargs)``: every floating output and the gradients
    of the first for the embeddings (``args[0]``) and the ``parameters`` ``(name, tensor)``; nothing into ``.grad``.

    Returns:
        Whether the call was judged: ``False`` when the eager output or gradient is not finite (the caller's
        non-finite step handling decides), or when the output has no floating tensor.

    Raises:
        CompiledLossMismatchError: a relative difference above ``rtol`` (the message names each quantity).
    """
    got_out = _tensors(compiled_out)
    if got_out is None:
        return False
    emb = args[0] if args else kwargs.get("embeddings")
    emb = emb if isinstance(emb, Tensor) and emb.is_floating_point() else None
    params = [(n, p) for n, p in (parameters or []) if p.requires_grad]
    grad_mode = torch.is_grad_enabled()
    emb_grad = grad_mode and emb is not None and emb.requires_grad
    leaf = emb.detach().requires_grad_(emb_grad) if emb is not None else None
    eager_args, eager_kwargs = (args, kwargs) if emb is None else _swap(args, kwargs, emb, leaf)
    want_out = _tensors(eager(*eager_args, **eager_kwargs))
    if want_out is None or not _finite(want_out):
        return False
    diffs: dict[str, float] = {}
    if len(want_out) != len(got_out):
        diffs["output structure"] = math.inf
    else:
        for i, (a, b) in enumerate(zip(got_out, want_out, strict=True)):
            diffs["loss value" if i == 0 else f"output {i}"] = relative_difference(a, b)
    with_grad = grad_mode and (got_out[0].requires_grad or want_out[0].requires_grad)  # one without: a mismatch
    if with_grad and (emb_grad or params):
        names = (["embedding gradient"] if emb_grad else []) + [f"gradient of {n}" for n, _ in params]
        probe = emb.detach().requires_grad_(True) if emb_grad else None
        probe_args, probe_kwargs = _swap(args, kwargs, emb, probe) if emb_grad else (args, kwargs)
        probe_out = _tensors(compiled(*probe_args, **probe_kwargs)) or [torch.zeros(())]
        got = _gradients(probe_out[0], ([probe] if emb_grad else []) + [p for _, p in params])
        want = _gradients(want_out[0], ([leaf] if emb_grad else []) + [p for _, p in params])
        if not _finite(want):
            return False
        for name, a, b in zip(names, got, want, strict=True):
            diffs[name] = relative_difference(a, b)
    if any(v > rtol for v in diffs.values()):
        shown = ", ".join(f"of the {what} {diff:.3g}" for what, diff in diffs.items())
        raise CompiledLossMismatchError(
            f"the compiled {owner} does not match the eager {owner} on this batch with torch {torch.__version__}: "
            f"relative difference {shown} (tolerance {rtol:g}). Training with it would silently optimise another "
            "objective. Call the loss uncompiled (recipes: --compile_loss false), or use a torch release on which "
            "the compiled loss matches eager."
        )
    return True


class GuardedCall:
    """The compiled call of a loss, checked against eager (:func:`compare_with_eager`) once per new
    :func:`call_signature` (again at the next call when the eager output is not finite).

    Args:
        compiled: the compiled callable (``torch.compile(module._call_impl, ...)``).
        module: the loss; its uncompiled ``_call_impl`` is the reference (held by a weak reference).
        rtol: :data:`COMPILE_RTOL` by default.
    """

    def __init__(self, compiled: Callable[..., Any], module: nn.Module, rtol: float = COMPILE_RTOL) -> None:
        self.compiled = compiled
        self.module = weakref.ref(module)
        self.owner = type(module).__name__
        self.rtol = rtol
        self.checked: set[tuple] = set()  #: the call signatures compared with eager
        self.eager_calls = 0

    def __call__(self, *args, **kwargs):
        out = self.compiled(*args, **kwargs)
        if torch.compiler.is_compiling():
            return out
        key = call_signature(args, kwargs)
        if key in self.checked:
            return out
        module = self.module()
        if module is None:
            return out
        self.eager_calls += 1
        judged = compare_with_eager(
            self.owner, out, module._call_impl, args, kwargs, compiled=self.compiled,
            parameters=list(module.named_parameters()), rtol=self.rtol,
        )  # fmt: skip
        if judged:
            self.checked.add(key)
        return out


def compile_loss(loss: nn.Module, *args, **kwargs) -> nn.Module:
    """Compile ``loss`` in place (``nn.Module.compile``), every new call signature checked (:class:`GuardedCall`)."""
    if not isinstance(loss, nn.Module):
        raise TypeError(f"compile_loss needs an nn.Module loss; got {type(loss).__name__}")
    nn.Module.compile(loss, *args, **kwargs)
    compiled = getattr(loss, "_compiled_call_impl", None)
    if compiled is not None and not isinstance(compiled, GuardedCall):
        loss._compiled_call_impl = GuardedCall(compiled, loss)
    return loss


class GuardedCompileMixin:
    """``compile(*args, **kwargs)``: in place, each new call signature checked (:class:`GuardedCall`)."""

    def compile(self, *args, **kwargs) -> None:
        """``nn.Module.compile(*args, **kwargs)``; a mismatch with eager raises :class:`CompiledLossMismatchError`."""
        compile_loss(self, *args, **kwargs)


def check_compiled_loss(compiled: Callable[..., Any], *args, eager: Callable[..., Any] | None = None, **kwargs):
    """Call ``compiled(*args, **kwargs)`` once, checked against the eager loss, and return its output.

    ``eager`` defaults to ``compiled._orig_mod`` (``compiled = torch.compile(loss)``). ``args[0]`` are the ``(B, D)``
    embeddings; outputs and gradients are compared by :func:`compare_with_eager` (≤ :data:`COMPILE_RTOL`).

    Raises:
        TypeError: no ``eager`` given and ``compiled`` wraps no module.
        CompiledLossMismatchError: the compiled call differs from eager.
    """
    if eager is None:
        eager = getattr(compiled, "_orig_mod", None)
        if eager is None:
            raise TypeError(
                "check_compiled_loss needs eager= (the uncompiled loss) unless compiled = torch.compile(loss); got "
                f"compiled of type {type(compiled).__name__}"
            )
    owner = type(eager).__name__ if isinstance(eager, nn.Module) else getattr(eager, "__name__", "loss")
    params = list(eager.named_parameters()) if isinstance(eager, nn.Module) else None
    out = compiled(*args, **kwargs)
    compare_with_eager(owner, out, eager, args, kwargs, compiled=compiled, parameters=params)
    return out
