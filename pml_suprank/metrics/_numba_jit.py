"""``njit``: :func:`numba.njit` with numba's on-disk cache wherever numba finds a writable place for it.

The compiled kernels of the exact evaluation take several seconds to compile. With ``cache=True`` numba writes the
machine code next to the module (``__pycache__``) or, for a read-only installation, in the user's cache directory
(``NUMBA_CACHE_DIR`` overrides both), and later processes load it in a fraction of a second; the cache is keyed by
the source file and the CPU, and rebuilt when either changes. Where numba finds no writable place at all, the kernel
is compiled once per process instead, as without the cache. The cache is an optimisation only: any error while
reading or writing it (a full or read-only disk, a corrupt or truncated index or data file) is said in one warning
and the kernel is compiled in memory, as without the cache (:class:`_FallbackCache`).

Trust: numba's cache files are pickles holding machine code, which numba loads and runs. The cache folder therefore
has the trust of the package's own files: a folder others can write to (a shared ``NUMBA_CACHE_DIR``) lets them run
code in every process that evaluates.

numba rebuilds a cached kernel when its own source file changes, not when a compiled function it calls from another
file does: use :func:`njit` only in modules whose kernels call compiled functions of the same file
(``_compiled_rank_counts``, ``_compiled_rank_sums``; ``tests/metrics/test_numba_cache.py`` checks it).
:class:`_threads` sets numba's thread count to torch's around a parallel kernel.
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
    """numba's on-disk cache of one kernel (the dispatcher's ``_cache``), where an error while loading or saving an
    overload turns the cache off for that kernel with one warning: the kernel is then compiled in memory. Every
    other attribute is the wrapped cache's."""

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
