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


def _kernel():
    """A fresh dispatcher of the same function each call (a later process, as far as numba's cache is concerned)."""

    def add_one(x):
        return x + 1

    return _numba_jit.njit(nogil=True)(add_one)


def test_a_corrupt_cache_index_falls_back_to_compiling_in_memory_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    assert _kernel()(1) == 2  # writes the cache
    index = list(tmp_path.rglob("*.nbi"))
    assert index
    for path in index:
        path.write_bytes(b"\x80\x04not a pickle at all")
    kernel = _kernel()
    with pytest.warns(RuntimeWarning, match="could not be read") as record:
        assert kernel(41) == 42
    assert len([w for w in record if "numba" in str(w.message)]) == 1
    assert kernel(1) == 2  # compiled in memory, no second warning


def test_a_cache_that_cannot_be_written_falls_back_to_compiling_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    from numba.core import caching

    def no_space(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(caching.IndexDataCacheFile, "_open_for_write", no_space)
    kernel = _kernel()
    with pytest.warns(RuntimeWarning, match="could not be written.*No space left"):
        assert kernel(2) == 3


def test_a_read_only_cache_folder_falls_back_to_compiling_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    assert _kernel()(1) == 2
    from numba.core import caching

    def read_only(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", read_only)
    kernel = _kernel()
    with pytest.warns(RuntimeWarning, match="could not be read.*Permission denied"):
        assert kernel(5) == 6
