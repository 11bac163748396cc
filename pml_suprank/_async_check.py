"""Data checks without a host round trip on accelerators: ``torch._assert_async`` on a 0-d bool tensor raises the
caller's ``ValueError`` at once on the CPU (built only then, so it may read the data to name the culprit); on CUDA a
failure surfaces as a device-side assertion at the next synchronisation, which leaves the CUDA context unusable.
(Under ``torch.profiler`` the op has an ``aten::item`` child on the CPU only: accelerator sync counts leave it out.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["check_async", "check_value"]


def check_async(ok: Tensor, error: Callable[[], Exception], message: str = "pml_suprank input check failed") -> None:
    """Assert the one-element bool tensor ``ok`` without a host round trip on accelerators; on the CPU raise
    ``error()`` (called only then) when it is false. ``message``: the device-side assertion's message."""
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
