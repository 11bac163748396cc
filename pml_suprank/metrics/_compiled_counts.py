"""Compiled (numba) row kernels of the exact evaluation, for CPU tensors.

* :func:`count_negatives_compiled`: the fused per-row kernel behind ``counting="compiled"`` of
  :func:`pml_suprank.metrics.ranks.rank_relevant_items`: for every row it prunes the negatives scoring below the
  lowest relevant item, looks the others up in a uniform histogram of the row's relevant scores and finishes with an
  exact comparison against the relevant items sharing a bin, in one pass over the row. Same result as the torch
  counters (exact integer counts; no arithmetic decides an order, the bins only narrow down where to compare).
  The row counter ``_count_row`` lives in :mod:`pml_suprank.metrics._compiled_rank_counts`, whose fused kernel
  uses it too.

numba is an optional dependency (``pip install 'pml-suprank[fast]'``): this module imports it at import time, so
import the module lazily and treat ``ImportError`` as "not available" (``ranks._compiled_available``). The
kernel compiles on its first call (a few seconds, once per process and dtype; no on-disk cache is written, so a
read-only installation works unchanged) and runs its rows in parallel on as many numba threads as torch uses.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

from ._compiled_rank_counts import _count_row, _decode_keys
from ._numba_jit import _threads

__all__ = ["SUPPORTED_DTYPES", "count_negatives_compiled"]

SUPPORTED_DTYPES = (torch.float32, torch.float64)


@numba.njit(parallel=True, nogil=True)
def _count_rows(neg, rs, n_rel, num_bins, out):  # pragma: no cover - compiled
    """``out[c, k] = #{j : neg[c, j] >= rs[c, k]}`` for ``k < n_rel[c]`` (0 elsewhere).

    ``neg`` ``(C, N)``; ``rs`` ``(C, P)`` relevant scores in descending order (the first ``n_rel[c]`` of a row are
    valid); ``num_bins`` ``<= 0`` means ``_DEFAULT_BINS · n_rel[c]`` bins.
    """
    for c in numba.prange(neg.shape[0]):
        out[c, :] = 0
        n = n_rel[c]
        if n > 0:
            r = np.empty(n + 1, rs.dtype)
            r[:n] = rs[c, :n]
            r[n] = -np.inf
            _count_row(neg[c], r, n, num_bins, out[c])


@numba.njit(parallel=True, nogil=True)
def _count_rows_keys(neg, keys, n_rel, num_bins, out):  # pragma: no cover - compiled
    """:func:`_count_rows` for float32 ``neg`` with the relevant items given by their sorted int64 pessimistic keys
    ``-m(r)·64 + level`` (:func:`pml_suprank.metrics.ranks._pessimistic_keys`), decoded here row by row."""
    for c in numba.prange(neg.shape[0]):
        out[c, :] = 0
        n = n_rel[c]
        if n > 0:
            _count_row(neg[c], _decode_keys(keys[c], n), n, num_bins, out[c])


def count_negatives_compiled(neg_scores: Tensor, rs: Tensor, n_rel: Tensor, num_bins: int | None = None) -> Tensor:
    """``neg_ge[c, k] = #{j : neg_scores[c, j] >= rs[c, k]}`` for the valid relevant items, with the compiled kernel.

    Args:
        neg_scores: ``(C, N)`` float32/float64 CPU scores of the negatives, ``-inf`` (or anything below the row's
            lowest relevant score) elsewhere. Not modified.
        rs: ``(C, P)`` float32/float64 relevant scores in descending order per row, valid slots first; or, with
            float32 ``neg_scores``, their sorted int64 pessimistic keys (``-m(r)·64 + level``, decoded in the kernel).
        n_rel: ``(C,)`` int64 number of valid slots of each row of ``rs``.
        num_bins: bins per row (default ``8 · n_rel``, at most ``64 · n_rel``); speed only.

    Returns:
        ``(C, P)`` int64 counts, ``0`` on padding slots.

    Raises:
        ValueError: a tensor not on the CPU or of an unsupported dtype (naming the argument).
    """
    keys = rs.dtype == torch.int64
    for name, t in (("neg_scores", neg_scores), ("rs", rs)):
        if t.device.type != "cpu" or t.dtype not in SUPPORTED_DTYPES and not (name == "rs" and keys):
            raise ValueError(f"{name} must be a float32/float64 CPU tensor; got {t.dtype} on {t.device}")
    if keys and neg_scores.dtype != torch.float32:
        raise ValueError(f"int64 keys rs need float32 neg_scores; got {neg_scores.dtype}")
    C, P = rs.shape
    out = torch.empty(C, P, dtype=torch.int64)
    if C == 0 or P == 0:
        return out.zero_()
    neg = neg_scores.detach().contiguous().numpy()
    rel = rs.detach().contiguous().numpy()
    counts = n_rel.detach().to(torch.int64).contiguous().numpy()
    with _threads():
        (_count_rows_keys if keys else _count_rows)(neg, rel, counts, int(num_bins or 0), out.numpy())
    return out
