"""Compiled (numba) sums of the ranked relevant items behind every retrieval metric, for CPU tensors.

:class:`~pml_suprank.metrics.from_ranks.RankStats` reads the prefix sums only at a few thresholds (last slot, top
``k``, ``R``), so on the CPU one walk per row (:func:`rank_sums_compiled`) computes those values and the per-level
sums of H-AP and NDCG without any ``(Q, P)`` array, bitwise equal to the torch path. numba is the optional ``fast``
extra: import lazily, ``ImportError`` = not available.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

from ._numba_jit import _threads, njit

__all__ = ["rank_sums_compiled"]


@njit(nogil=True)
def _position_tables(positions):  # pragma: no cover - compiled
    """``(n + 1,)`` float64 tables ``1 / p`` and ``1 / log2(1 + p)`` for ``p = 1..max(positions)`` (index 0 unused)."""
    n = max(positions.max(), 0)
    inv = np.zeros(n + 1, np.float64)
    disc = np.zeros(n + 1, np.float64)
    for p in range(1, n + 1):
        position = np.float64(p)
        inv[p] = 1.0 / position
        disc[p] = 1.0 / np.log2(1.0 + position)
    return inv, disc


@njit(parallel=True, nogil=True)
def _rank_sums(  # pragma: no cover - compiled
    levels, positions, counts, thresholds, inv_table, disc_table, ge_at, prec_at, level_sums, level_disc, asi
):
    """One walk per row ``c`` over its ranked slots (positions increasing, level ``0``: padding, skipped).

    With ``A_m(k)`` the items of level ``>= m`` ranked at or before slot ``k`` and ``p_k`` its position:

    * ``ge_at[m - 1, c, t]`` = ``A_m`` over the slots with ``p_k <= thresholds[c, t]``, ``prec_at[m - 1, c, t]`` =
      ``Σ A_m(k) / p_k`` over those of level ``>= m``;
    * ``level_sums[c, λ - 1, m - 1]`` = ``Σ_{k: level λ} A_m(k) / p_k`` and ``level_disc[c, λ - 1]`` =
      ``Σ_{k: level λ} 1 / log2(1 + p_k)``;
    * ``asi[c]`` = ``Σ_{n=1}^{min(N⁺, P)} Σ_l min(c_l(n), c*_l(n)) / n`` (ASI before ``/ N⁺``, see
      :func:`pml_suprank.metrics.from_ranks.asi_from_ranks`; ``counts`` ``(C, L + 1)``).
    """
    C, P = levels.shape
    L = ge_at.shape[0]
    T = thresholds.shape[1]
    none = 2**62  # above every position
    for c in numba.prange(C):
        order = np.argsort(thresholds[c])
        a = np.zeros(L, np.float64)
        acc = np.zeros(L, np.float64)
        sums = np.zeros((L, L), np.float64)
        disc = np.zeros(L, np.float64)
        j = 0
        next_threshold = thresholds[c, order[0]] if T else none
        # ASI up to N⁺ relevant items: the ideal order ranks the higher levels first; clamped to the P slots of the row
        last_n = min(counts[c, 1 : L + 1].sum(), P)
        start = np.zeros(L + 1, np.int64)  # relevant items of a higher level than lvl (clamped to P)
        cap = np.zeros(L + 1, np.int64)  # items of level lvl (clamped to P)
        above = 0
        for lvl in range(L, 0, -1):
            start[lvl] = min(above, P)
            cap[lvl] = min(counts[c, lvl], P)
            above += counts[c, lvl]
        cnt = np.zeros(L + 1, np.int64)  # items of each level in the top n
        n = 1
        asi_sum = 0.0
        for k in range(P + 1):  # k = P: past the last slot, every threshold left and the ASI terms up to N⁺
            past = k == P
            lv = levels[c, k] if not past else L
            if lv <= 0:
                continue
            p = positions[c, k] if not past else none
            if next_threshold < p or past:
                while j < T and (past or thresholds[c, order[j]] < p):
                    for m in range(L):
                        ge_at[m, c, order[j]] = a[m]
                        prec_at[m, c, order[j]] = acc[m]
                    j += 1
                next_threshold = thresholds[c, order[j]] if j < T else none
            end = min(p, last_n + 1)
            while n < end:  # the top n before this item
                total = cnt[L]
                for lvl in range(1, L):
                    total += min(cnt[lvl], min(max(n - start[lvl], 0), cap[lvl]))
                asi_sum += np.float64(total) / np.float64(n)
                n += 1
            if past:
                break
            cnt[lv] += 1
            inv = inv_table[p]
            disc[lv - 1] += disc_table[p]
            for m in range(L):
                inside = 1.0 if lv > m else 0.0
                a[m] += inside
                term = a[m] * inv
                acc[m] += term * inside
                sums[lv - 1, m] += term
        asi[c] = asi_sum
        level_sums[c] = sums
        level_disc[c] = disc


def rank_sums_compiled(
    levels: Tensor, positions: Tensor, counts: Tensor, thresholds: Tensor, num_levels: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(ge_at, prec_at, level_sums, level_disc, asi)`` of ``(C, P)`` int64 ranked ``levels`` / ``positions``.

    Args:
        levels: ``(C, P)`` int64 levels in ranked order, ``0`` on padding.
        positions: ``(C, P)`` int64 1-based positions, increasing along the valid slots.
        counts: ``(C, L + 1)`` items per level in the gallery.
        thresholds: ``(C, T)`` int64 positions at which the prefix sums are read (``>= P``: the whole row).
        num_levels: ``L``.

    Returns:
        ``(L, C, T)``, ``(L, C, T)``, ``(C, L, L)``, ``(C, L)`` and ``(C,)`` float64 tensors (:func:`_rank_sums`).
    """
    C, P = levels.shape
    L, T = num_levels, thresholds.shape[1]
    out = tuple(torch.zeros(shape, dtype=torch.float64) for shape in ((L, C, T), (L, C, T), (C, L, L), (C, L), (C,)))
    if C and P and L:
        positions = positions.contiguous().numpy()
        inv_table, disc_table = _position_tables(positions)
        with _threads():
            _rank_sums(
                levels.contiguous().numpy(),
                positions,
                counts.to(torch.int64).contiguous().numpy(),
                thresholds.contiguous().numpy(),
                inv_table,
                disc_table,
                *(t.numpy() for t in out),
            )
    return out
