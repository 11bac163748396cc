"""``njit``: :func:`numba.njit` with numba's on-disk cache wherever numba finds a writable place for it.

The kernels take seconds to compile; numba's cache (``__pycache__``, else the user cache dir, ``NUMBA_CACHE_DIR``
overrides) is keyed by source file and CPU. Without a writable place, or on any cache read/write error (one warning,
:class:`_FallbackCache`), the kernel is compiled in memory.

Trust: cache files are pickles of machine code that numba runs, so the cache folder needs the trust of the package's
own files (a shared writable ``NUMBA_CACHE_DIR`` lets others run code here).

Kernels call only compiled functions of their own file (numba's cache misses changes in other files;
``tests/metrics/test_numba_cache.py``). :class:`_threads` sets numba's thread count to torch's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numba
import torch
from numba.core.caching import NullCache

__all__ = ["njit"]  # and _threads, for the kernel modules


def njit(**options: Any) -> Callable[[Callable], Callable]:
    """Decorator: ``numba.njit(cache=True, **options)``, or ``numba.njit(**options)`` where numba has no place to
    write its cache (it raises ``RuntimeError`` when the function is decorated)."""

    def decorate(fn: Callable) -> Callable:
        try:
            kernel = numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # no writable cache location for this file
            return numba.njit(**options)(fn)
        cache = getattr(kernel, "_cache", None)
        if cache is not None and not isinstance(cache, (NullCache, _FallbackCache)):
            kernel._cache = _FallbackCache(cache, getattr(fn, "__qualname__", "kernel"))
        return kernel

    return decorate


class _FallbackCache:
    """A kernel's numba cache (``_cache``) that turns itself off, with one warning, on a load or save error."""

    def __init__(self, cache: Any, name: str) -> None:
        self._cache = cache
        self._name = name
        self._broken = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def _fail(self, doing: str, error: BaseException) -> None:
        self._broken = True
        where = getattr(self._cache, "cache_path", None)
        warnings.warn(
            f"numba's cache of {self._name} could not be {doing} ({type(error).__name__}: {str(error)[:200]}; "
            f"cache folder {where}): compiling it in memory instead (slower first evaluation, same results)",
            RuntimeWarning,
            stacklevel=2,
        )

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        if self._broken:
            return None
        try:
            return self._cache.load_overload(sig, target_context)
        except Exception as e:  # OSError, an unpickling error of a corrupt file, ...: never a failed evaluation
            self._fail("read", e)
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        if self._broken:
            return
        try:
            self._cache.save_overload(sig, data)
        except Exception as e:  # e.g. OSError: no space left on device
            self._fail("written", e)


class _threads:
    """As many numba threads as torch uses (numba's setting is per calling thread; restored afterwards)."""

    def __enter__(self) -> None:
        self.previous = numba.get_num_threads()
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))

    def __exit__(self, *exc) -> None:
        numba.set_num_threads(self.previous)
