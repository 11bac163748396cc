"""Compiled = eager, or refused: the first call of a compiled loss is checked against the eager loss on that batch.

``torch.compile`` of a loss can be silently wrong on some torch release (torch 2.11's dynamo once returned a zero
gradient for the hierarchical dense kernel while the loss value was right: a model trained with it ended 30 % worse,
reported as a normal result). The guard makes that impossible to miss:

* :meth:`GuardedCompileMixin.compile` (``loss.compile(...)``, the base classes of the package's losses) and
  :func:`compile_loss` (any ``nn.Module`` loss; the recipes' ``--compile_loss``) compile the loss in place as
  ``nn.Module.compile`` does and wrap the compiled call in a :class:`GuardedCall`;
* the first call is compared with the eager call on the same batch — the loss value, and the gradient with respect to
  the embeddings (the first argument) at the first call that has one — one extra eager forward + backward, once;
* a relative difference above :data:`COMPILE_RTOL` raises :class:`CompiledLossMismatchError` naming the torch
  version and the way out (call the loss uncompiled; ``--compile_loss false`` in the recipes).

``torch.compile(loss)`` returns torch's own wrapper module, whose call this package cannot intercept without breaking
the graph of a function that calls the loss: after it, call :func:`check_compiled_loss` once on a batch.

Relative difference of two tensors: ``‖a − b‖₂ / max(‖a‖₂, ‖b‖₂)`` (0 when both are 0; ``inf`` when one is not
finite and the other is, or when their shapes differ).
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
    "check_compiled_loss",
    "compile_loss",
    "relative_difference",
]

#: largest relative difference (value and embedding gradient) accepted between a compiled loss and the eager one
COMPILE_RTOL = 1e-4


class CompiledLossMismatchError(RuntimeError):
    """A compiled loss differs from the eager loss on the same batch (value or embedding gradient)."""


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
    """``args`` / ``kwargs`` with every occurrence of the object ``old`` replaced by ``new`` (identity: a reference
    set that *is* the batch, ``ref_emb=embeddings``, stays the batch)."""
    return (
        tuple(new if a is old else a for a in args),
        {k: (new if v is old else v) for k, v in kwargs.items()},
    )


def _embeddings(args: tuple, kwargs: dict) -> Tensor | None:
    emb = args[0] if args else kwargs.get("embeddings")
    return emb if isinstance(emb, Tensor) and emb.is_floating_point() else None


def _mismatch(owner: str, value_diff: float, grad_diff: float | None, rtol: float) -> CompiledLossMismatchError:
    grad = "" if grad_diff is None else f", of the embedding gradient {grad_diff:.3g}"
    return CompiledLossMismatchError(
        f"the compiled {owner} does not match the eager {owner} on this batch with torch {torch.__version__}: "
        f"relative difference of the loss value {value_diff:.3g}{grad} (tolerance {rtol:g}). Training with it would "
        "silently optimise another objective. Call the loss uncompiled (recipes: --compile_loss false), or use a "
        "torch release on which the compiled loss matches eager."
    )


def compare_with_eager(
    owner: str,
    compiled_out: Any,
    eager: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    *,
    compiled: Callable[..., Any] | None = None,
    rtol: float = COMPILE_RTOL,
) -> bool:
    """Compare the output of a compiled call of ``(args, kwargs)`` with ``eager(*args, **kwargs)``.

    The value always; the gradient with respect to the embeddings (``args[0]``) when gradients are enabled and both
    the embeddings and the output require grad: the gradient of one more call of ``compiled`` on a detached copy of
    the embeddings (the caller's graph is never run backward here: a compiled backward may reuse its saved buffers,
    so a second backward through the caller's graph would read overwritten values; without ``compiled``,
    ``torch.autograd.grad(compiled_out, embeddings, retain_graph=True)``), against the eager gradient on another
    detached copy. Nothing is accumulated into ``.grad``. Returns whether the gradient was checked.

    Raises:
        CompiledLossMismatchError: a relative difference above ``rtol``.
    """
    emb = _embeddings(args, kwargs)
    if not isinstance(compiled_out, Tensor) or not compiled_out.is_floating_point() or emb is None:
        return True  # nothing this guard can compare
    with_grad = torch.is_grad_enabled() and emb.requires_grad and compiled_out.requires_grad
    leaf = emb.detach().requires_grad_(with_grad)
    eager_args, eager_kwargs = _swap(args, kwargs, emb, leaf)
    expected = eager(*eager_args, **eager_kwargs)
    value_diff = relative_difference(compiled_out, expected)
    grad_diff = None
    if with_grad:
        if compiled is not None:
            probe = emb.detach().requires_grad_(True)
            probe_args, probe_kwargs = _swap(args, kwargs, emb, probe)
            (got,) = torch.autograd.grad(compiled(*probe_args, **probe_kwargs).sum(), probe, allow_unused=True)
        else:
            (got,) = torch.autograd.grad(compiled_out.sum(), emb, retain_graph=True, allow_unused=True)
        want = None
        if expected.requires_grad:
            (want,) = torch.autograd.grad(expected.sum(), leaf, allow_unused=True)
        grad_diff = relative_difference(got, want)
    if value_diff > rtol or (grad_diff is not None and grad_diff > rtol):
        raise _mismatch(owner, value_diff, grad_diff, rtol)
    return with_grad


class GuardedCall:
    """The compiled call of a loss, checked against the loss's eager call until a call with an embedding gradient
    has been compared (:func:`compare_with_eager`); afterwards a plain pass-through.

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
        self.value_checked = False
        self.grad_checked = False
        self.eager_calls = 0

    def __call__(self, *args, **kwargs):
        out = self.compiled(*args, **kwargs)
        if self.grad_checked or torch.compiler.is_compiling():
            return out
        with_grad = torch.is_grad_enabled() and (emb := _embeddings(args, kwargs)) is not None and emb.requires_grad
        if self.value_checked and not with_grad:
            return out
        module = self.module()
        if module is None:
            return out
        self.eager_calls += 1
        checked = compare_with_eager(
            self.owner, out, module._call_impl, args, kwargs, compiled=self.compiled, rtol=self.rtol
        )
        self.grad_checked = checked or with_grad  # a call that wanted a gradient and got none: nothing more to check
        self.value_checked = True
        return out


def guard_compiled_call(module: nn.Module, rtol: float = COMPILE_RTOL) -> nn.Module:
    """Wrap the compiled call that ``module.compile(...)`` installed in a :class:`GuardedCall` (no-op when the module
    is not compiled or already guarded). Returns ``module``."""
    compiled = getattr(module, "_compiled_call_impl", None)
    if compiled is not None and not isinstance(compiled, GuardedCall):
        module._compiled_call_impl = GuardedCall(compiled, module, rtol)
    return module


def compile_loss(loss: nn.Module, *args, **kwargs) -> nn.Module:
    """Compile ``loss`` in place (``nn.Module.compile(*args, **kwargs)``: same parameters and state-dict keys) with
    the first-call check against eager. Returns ``loss``."""
    if not isinstance(loss, nn.Module):
        raise TypeError(f"compile_loss needs an nn.Module loss; got {type(loss).__name__}")
    nn.Module.compile(loss, *args, **kwargs)
    return guard_compiled_call(loss)


class GuardedCompileMixin:
    """``compile(*args, **kwargs)`` of an ``nn.Module`` loss: ``nn.Module.compile`` (in place) plus the first-call
    check against eager (:class:`GuardedCall`)."""

    def compile(self, *args, **kwargs) -> None:
        """``nn.Module.compile(*args, **kwargs)``; the first call is then checked against the eager loss and a
        mismatch raises :class:`CompiledLossMismatchError`."""
        compile_loss(self, *args, **kwargs)


def check_compiled_loss(compiled: Callable[..., Any], *args, eager: Callable[..., Any] | None = None, **kwargs):
    """Call ``compiled(*args, **kwargs)`` once, checked against the eager loss, and return its output.

    For ``compiled = torch.compile(loss)`` (``eager`` defaults to the module it wraps, ``compiled._orig_mod``) or
    any compiled callable with an explicit ``eager``. ``args[0]`` are the ``(B, D)`` embeddings: the value and, when
    they require grad, the embedding gradient are compared (relative difference ≤ :data:`COMPILE_RTOL`).

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
    out = compiled(*args, **kwargs)
    compare_with_eager(owner, out, eager, args, kwargs, compiled=compiled)
    return out
