"""The evaluator's compiled kernels are cached on disk by numba where it can write, compiled per process where it
cannot, and each cached kernel calls only compiled functions of its own file (numba rebuilds a cached kernel when
its own source file changes, not when a callee in another file does)."""

from __future__ import annotations

import importlib

import pytest

numba = pytest.importorskip("numba")

from numba.core.caching import NullCache  # noqa: E402

from pml_suprank.metrics import _numba_jit  # noqa: E402

CACHED_MODULES = ("pml_suprank.metrics._compiled_rank_counts", "pml_suprank.metrics._compiled_rank_sums")


def _dispatchers(module):
    return {name: f for name, f in vars(module).items() if isinstance(f, numba.core.registry.CPUDispatcher)}


@pytest.mark.parametrize("name", CACHED_MODULES)
def test_cached_kernels_call_only_compiled_functions_of_their_own_file(name):
    module = importlib.import_module(name)
    kernels = _dispatchers(module)
    assert kernels
    for kernel_name, kernel in kernels.items():
        assert not isinstance(kernel._cache, NullCache), kernel_name  # cached on disk
        for ref in kernel.py_func.__code__.co_names:
            target = vars(module).get(ref)
            if isinstance(target, numba.core.registry.CPUDispatcher):
                assert target.py_func.__module__ == name, (kernel_name, ref, target.py_func.__module__)


def test_without_a_writable_cache_location_the_kernel_compiles_per_process(monkeypatch):
    real = numba.njit

    def no_cache_location(*args, **options):
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file '<read-only>'")
        return real(*args, **options)

    monkeypatch.setattr(_numba_jit.numba, "njit", no_cache_location)

    @_numba_jit.njit(nogil=True)
    def twice(x):
        return 2 * x

    assert twice(21) == 42
    assert isinstance(twice._cache, NullCache)
