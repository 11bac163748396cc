"""``njit``: :func:`numba.njit` with numba's on-disk cache wherever numba finds a writable place for it.

The compiled kernels of the exact evaluation take several seconds to compile. With ``cache=True`` numba writes the
machine code next to the module (``__pycache__``) or, for a read-only installation, in the user's cache directory
(``NUMBA_CACHE_DIR`` overrides both), and later processes load it in a fraction of a second; the cache is keyed by
the source file and the CPU, and rebuilt when either changes. Where numba finds no writable place at all, the kernel
is compiled once per process instead, as without the cache.

numba rebuilds a cached kernel when its own source file changes, not when a compiled function it calls from another
file does: use :func:`njit` only in modules whose kernels call compiled functions of the same file
(``_compiled_rank_counts``, ``_compiled_rank_sums``; ``tests/metrics/test_numba_cache.py`` checks it).
:class:`_threads` sets numba's thread count to torch's around a parallel kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import torch

__all__ = ["njit"]  # and _threads, for the kernel modules


def njit(**options: Any) -> Callable[[Callable], Callable]:
    """Decorator: ``numba.njit(cache=True, **options)``, or ``numba.njit(**options)`` where numba has no place to
    write its cache (it raises ``RuntimeError`` when the function is decorated)."""

    def decorate(fn: Callable) -> Callable:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # no writable cache location for this file
            return numba.njit(**options)(fn)

    return decorate


class _threads:
    """As many numba threads as torch uses (numba's setting is per calling thread; restored afterwards)."""

    def __enter__(self) -> None:
        self.previous = numba.get_num_threads()
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))

    def __exit__(self, *exc) -> None:
        numba.set_num_threads(self.previous)
