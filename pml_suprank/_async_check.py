"""Data checks that do not synchronise with the host on an accelerator.

:func:`check_async` evaluates a condition that is a 0-d bool tensor (e.g. "the labels form a tree") with
``torch._assert_async``:

* on the CPU the host *is* the device, so the check is immediate: a failed condition raises the caller's
  ``ValueError`` (built only on the failure path, where it may read the data to name the culprit);
* on CUDA (and other accelerators) the check is queued with the kernels and the host goes on without waiting: a
  failed condition surfaces as a device-side assertion at the next synchronisation, which — like an out-of-range
  index in any CUDA kernel — leaves the CUDA context unusable, and the message is the generic one of the assert.

This is the trade-off of the accelerator path (issue 13): a clear ``ValueError`` for bad data where it costs
nothing, no host round trip per step where it would cost one. Under ``torch.profiler`` on the CPU the op shows up
as ``aten::_assert_async`` with an ``aten::item`` child (the CPU implementation reads the flag); on an accelerator it
has none, so sync counts that stand for an accelerator leave out the children of ``aten::_assert_async``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["check_async", "check_value"]


def check_async(ok: Tensor, error: Callable[[], Exception], message: str = "pml_suprank input check failed") -> None:
    """Assert that the 0-d (or one-element) bool tensor ``ok`` is true, without a host round trip on accelerators.

    Args:
        ok: the condition, on the data's device.
        error: builds the exception raised on the CPU when ``ok`` is false (called only then).
        message: the message of the device-side assertion (accelerators).

    Raises:
        the exception of ``error()`` on the CPU when ``ok`` is false.
    """
    try:
        torch._assert_async(ok, message)
    except RuntimeError:
        if ok.device.type != "cpu":
            raise
        raise error() from None


def check_value(ok: Tensor, error: Callable[[], Exception], message: str = "pml_suprank input check failed") -> None:
    """Raise ``error()`` when the 0-d bool tensor ``ok`` is false — a host read in eager mode (a ``ValueError`` on
    every device), an in-graph assertion (:func:`check_async`) while ``torch.compile`` traces, where a host read
    would break the graph (``fullgraph=True`` fails)."""
    if torch.compiler.is_compiling():
        check_async(ok, error, message)
    elif not bool(ok):
        raise error()
