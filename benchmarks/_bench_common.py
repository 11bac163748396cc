"""Shared helpers of the benchmarks (``bench_losses``, ``bench_hierarchical``, ``bench_memory``, ``bench_eval``):
devices, the profiler's operator / launch-proxy / host-sync counts of one call, ``torch.compile`` of a loss with
its compile time measured apart, and a median fwd+bwd timer.

Counting method (issue 13): ``torch.profiler`` on the CPU; "top-level aten ops" = aten events whose parent is not
an aten op; "compute ops" = leaf aten ops that are not views / allocations (≈ kernel launches on an accelerator);
"host syncs" = aten ops that block the host on an accelerator (``SYNC_OPS``), not counting those nested in another
sync op or in ``aten::_assert_async`` (asynchronous on accelerators), plus Python-level reads of a tensor's data
(``.tolist()``: no aten op on the CPU, a device-to-host copy elsewhere).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch

# host-synchronising aten ops (each drains an accelerator's queue); counted once per outermost call
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::unique")
SYNC_OPS += ("aten::_unique2", "aten::unique_consecutive", "aten::masked_select", "aten::equal")

# metadata-only aten ops (no kernel launch on an accelerator): excluded from the "compute ops" launch proxy
VIEW_OPS = frozenset(
    "aten::" + n
    for n in (
        "view unsqueeze squeeze slice select mT t transpose expand expand_as as_strided flatten detach lift_fresh "
        "alias reshape permute _unsafe_view empty empty_like empty_strided result_type"
    ).split()
)


# device-to-host reads that dispatch no aten op on the CPU. ``.numpy()`` / ``__array__`` are not counted: they only
# work on CPU tensors, so the code paths calling them are CPU-only branches that do not exist on an accelerator
HOST_READS = ("tolist",)


class _HostReads:
    """Counts calls of the ``HOST_READS`` tensor methods while active (forward and backward): the methods are wrapped
    for the duration of the ``with`` block and restored after it."""

    def __enter__(self):
        self.count, self.saved = 0, {name: getattr(torch.Tensor, name) for name in HOST_READS}

        def counting(method):
            def wrapper(*args, **kwargs):
                self.count += 1
                return method(*args, **kwargs)

            return wrapper

        for name, method in self.saved.items():
            setattr(torch.Tensor, name, counting(method))
        return self

    def __exit__(self, *exc):
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, method)


def available_devices() -> list[str]:
    """The CPU, plus ``cuda`` when a GPU is visible."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def device_name(device: str) -> str:
    """A one-line description of ``device`` for table headers (GPU model, or CPU model and torch threads)."""
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_counts(step: Callable[[], object], *, warm_up: bool = True) -> dict:
    """Operator counts of one call of ``step`` (a fwd+bwd closure), after one un-profiled warm-up call (skipped with
    ``warm_up=False``, for a caller that has just run ``step``).

    Returns ``{"aten_ops", "compute_ops", "syncs"}`` (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    if warm_up:
        step()
    with _HostReads() as reads, profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    children = {id(e.cpu_parent) for e in events if e.cpu_parent is not None}

    def nested_in(e, names) -> bool:
        while e.cpu_parent is not None:
            e = e.cpu_parent
            if e.name in names:
                return True
        return False

    top = [e for e in events if not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    leaves = [e for e in events if id(e) not in children and e.name not in VIEW_OPS]
    syncs = [e for e in events if e.name in SYNC_OPS and not nested_in(e, set(SYNC_OPS) | {"aten::_assert_async"})]
    return {"aten_ops": len(top), "compute_ops": len(leaves), "syncs": len(syncs) + reads.count}


def median_time(step: Callable[[], object], device: str, repeats: int) -> float:
    """Median wall time (s) of ``repeats`` calls of ``step`` after one warm-up call (device synchronised)."""
    step()
    _sync(device)
    times = []
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compile_loss(fn: Callable, warm_up: Callable[[Callable], object], device: str) -> tuple[Callable, float]:
    """``torch.compile(fn, fullgraph=True, dynamic=False)`` and the compile time (s): the first call of
    ``warm_up(compiled)`` (a fwd+bwd, which compiles the forward and the backward graphs), timed on its own.

    Dynamo's caches are reset first so that every loss / shape gets a fresh graph (no recompile limit, no dynamic
    shapes carried over from a previous setting). Later calls are the steady state that the timings report.
    """
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
    t0 = time.perf_counter()
    warm_up(compiled)
    _sync(device)
    return compiled, time.perf_counter() - t0
