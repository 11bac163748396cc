"""Compiled (numba) row kernels of the exact evaluation, for CPU tensors.

* :func:`count_negatives_compiled`: the fused per-row kernel behind ``counting="compiled"`` of
  :func:`pml_suprank.metrics.ranks.rank_relevant_items`: for every row it prunes the negatives scoring below the
  lowest relevant item, looks the others up in a uniform histogram of the row's relevant scores and finishes with an
  exact comparison against the relevant items sharing a bin, in one pass over the row. Same result as the torch
  counters (exact integer counts; no arithmetic decides an order, the bins only narrow down where to compare).
* :func:`block_keys_compiled` and :func:`block_positions_compiled`: two passes over a score block whose relevant
  items are one contiguous column slice per row (keys of the slice; then, once sorted, the counting over the other
  columns): the reference of the tests of the evaluator's fused kernel
  (:mod:`pml_suprank.metrics._compiled_rank_counts`, which holds the row counter ``_count_row`` both use).

numba is an optional dependency (``pip install 'pml-suprank[fast]'``): this module imports it at import time, so
import the module lazily and treat ``ImportError`` as "not available" (:func:`compiled_counting_available`). The
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

__all__ = [
    "SUPPORTED_DTYPES",
    "block_keys_compiled",
    "block_positions_compiled",
    "count_negatives_compiled",
]

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
    kernel = _count_rows_keys if keys else _count_rows
    # as many threads as torch uses (numba's setting is per calling thread; restored afterwards)
    previous = numba.get_num_threads()
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    try:
        kernel(neg, rel, counts, int(num_bins) if num_bins is not None else 0, out.numpy())
    finally:
        numba.set_num_threads(previous)
    return out


# ----------------------------------------------------------------------------------------------------------------
# the evaluator's fused row kernels: the relevant items of a query are one contiguous column slice of its score row


_KEY_PAD = (2**63 - 1) & ~63  # larger than every key; level bits 0 (== ranks._KEY_PAD)


@numba.njit(parallel=True, nogil=True)
def _block_keys(bits, starts, ends, self_col, keys):  # pragma: no cover - compiled
    """``keys[c, t]`` = pessimistic int64 key ``-m(s)·64 + level`` of column ``starts[c, 0] + t`` of row ``c``
    (``bits``: the float32 scores viewed as int32; ``_KEY_PAD`` on padding and on the query's own column): level 1
    inside ``[starts[c, 0], ends[c, 0])``, +1 per finer nested slice ``[starts[c, m], ends[c, m])`` containing the
    column."""
    C, P = keys.shape
    L = starts.shape[1]
    for c in numba.prange(C):
        a, b = starts[c, 0], ends[c, 0]
        n = b - a
        for t in range(n):
            v = np.int64(bits[c, a + t])
            if v == -(2**31):  # -0.0 ties with +0.0
                v = 0
            keys[c, t] = -(v ^ ((v >> 31) & 0x7FFFFFFF)) * 64 + 1
        for m in range(1, L):
            for j in range(starts[c, m], ends[c, m]):
                keys[c, j - a] += 1
        s = self_col[c]
        if a <= s < b:
            keys[c, s - a] = _KEY_PAD
        for t in range(n, P):
            keys[c, t] = _KEY_PAD


@numba.njit(parallel=True, nogil=True)
def _block_positions(scores, keys, a1, b1, self_col, num_bins, levels, positions):  # pragma: no cover - compiled
    """Levels and 1-based positions ``(C, P)`` of the sorted relevant items (``keys``, padding last) of each row.

    The negatives are every column outside ``[a1, b1)`` but the query's own: the slice and that column are set to
    ``-inf`` in ``scores`` (the caller's buffer), then :func:`_count_row` counts, for each relevant item, the
    negatives scoring at least as high."""
    C, P = keys.shape
    for c in numba.prange(C):
        row = scores[c]
        row[a1[c] : b1[c]] = -np.inf
        if self_col[c] >= 0:
            row[self_col[c]] = -np.inf
        n = 0
        while n < P and keys[c, n] != _KEY_PAD:
            n += 1
        for t in range(n, P):
            levels[c, t] = 0
            positions[c, t] = 0
        if n == 0:
            continue
        r = _decode_keys(keys[c], n)
        neg_ge = np.empty(n, np.int64)
        _count_row(row, r, n, num_bins, neg_ge)
        for k in range(n):
            levels[c, k] = keys[c, k] & 63
            positions[c, k] = neg_ge[k] + k + 1


def block_keys_compiled(scores: Tensor, starts: Tensor, ends: Tensor, self_col: Tensor, P: int) -> Tensor:
    """``(C, P)`` int64 pessimistic keys of the relevant slice of each row (unsorted; padding ``_KEY_PAD``).

    Args:
        scores: ``(C, N)`` float32 CPU score block (gallery in label-path order).
        starts, ends: ``(C, L)`` int64 nested label slices (column 0 coarsest).
        self_col: ``(C,)`` int64 column of the query itself (``-1`` when not in the gallery).
        P: width, at least ``max(ends[:, 0] - starts[:, 0])``.
    """
    keys = torch.empty(scores.shape[0], P, dtype=torch.int64)
    if keys.numel():
        with _threads():
            _block_keys(scores.numpy().view(np.int32), starts.numpy(), ends.numpy(), self_col.numpy(), keys.numpy())
    return keys


def block_positions_compiled(
    scores: Tensor, keys: Tensor, starts: Tensor, ends: Tensor, self_col: Tensor, num_bins: int | None = None
) -> tuple[Tensor, Tensor]:
    """``(levels, positions)`` ``(C, P)`` int64 of the sorted keys of :func:`block_keys_compiled` in the pessimistic
    ranking of each row (negatives: every column outside the row's coarsest slice but the query's own). Overwrites
    the coarsest slice and the query's own column of ``scores`` with ``-inf``."""
    C, P = keys.shape
    levels = torch.empty(C, P, dtype=torch.int64)
    positions = torch.empty(C, P, dtype=torch.int64)
    if levels.numel():
        a1, b1 = starts[:, 0].contiguous(), ends[:, 0].contiguous()
        with _threads():
            _block_positions(
                scores.numpy(),
                keys.numpy(),
                a1.numpy(),
                b1.numpy(),
                self_col.numpy(),
                int(num_bins) if num_bins is not None else 0,
                levels.numpy(),
                positions.numpy(),
            )
    return levels, positions
