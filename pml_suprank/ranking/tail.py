"""Separable evaluation of the far branches of the temperature sigmoid over sorted score lists (the series tail).

Used by the hierarchical kernel (:mod:`pml_suprank.ranking.hierarchical`) to sum the sigmoid branch of SupRank's
``H⁻`` (Ramzi et al., TPAMI 2025, Eq. 4) away from ``t = 0`` without enumerating (item, list element) pairs.

For ``x = t/τ < 0`` the sigmoid is the alternating series ``σ(x) = Σ_{k≥1} (−1)^{k+1} e^{kx}``; truncated after ``K``
terms its error is below the first omitted term, ``|σ(x) − Σ_{k≤K} (−1)^{k+1} e^{kx}| < e^{(K+1)x}``, and the same
holds for the derivative (``< (K+1)·e^{(K+1)x}/τ``). With ``x ≤ −c`` every term ``e^{k(s_j − s_i)/τ}`` separates
into ``e^{k s_j/τ} · e^{−k s_i/τ}``, so for a sorted list ``x_0 ≤ x_1 ≤ …`` and an item scored ``s``:

* lower tail ``Σ_{p < e} σ((x_p − s)/τ)`` (all ``x_p < s − cτ``) = ``Σ_k (−1)^{k+1} e^{−k s/τ} · Σ_{p<e} e^{k x_p/τ}``,
  a prefix sum;
* upper part ``Σ_{u ≤ p < h} σ((x_p − s)/τ)`` (all ``x_p > s + cτ``), with ``σ(x) = 1 − σ(−x)``:
  ``(h − u) − Σ_k (−1)^{k+1} e^{k s/τ} · Σ_{u≤p<h} e^{−k x_p/τ}``, a difference of suffix sums.

The gradient is separable too: ``∂/∂s`` is the same sums times ``∓k/τ``, and ``∂/∂x_p`` is ``e^{±k x_p/τ}`` times a
suffix sum (lower tail) or a running sum (upper part) of ``grad · e^{∓k s/τ}`` over the items whose range contains
``p``. Everything is ``O(K · R · N)`` for ``R`` sorted lists of length ``N`` plus ``O(K)`` per item, instead of one
evaluation per (item, list element) pair; nothing of size items × ``N`` exists, and backward recomputes the prefix
sums instead of saving them.

Range safety: the exponentials are taken relative to an anchor ``a`` (``e^{k(x − a)/τ}``) and accumulated in
float64. Items are grouped in score bands of width ``W = 600·τ/K`` per list, each with its own anchor (the band
centre), so every factor used stays below ``e^{300}`` and every product below ``N·e^{−kc}``; list elements far
from the band overflow/underflow harmlessly (exponents clamped so that even ``(K/τ)·e^{K z}`` stays finite: backward
multiplies the ``K``-th power by ``±k/τ`` before the zero weight of such an element; never used with a non-zero
weight).

With ``c = 2`` and ``K = 19`` (float64 scores) the truncation error is below ``e^{−40} ≈ 4.2e−18`` per (item,
element) pair and below ``(K + 1)·e^{−40}/τ ≈ 8e−15`` for its derivative (``τ = 0.01``), far below float64 rounding
of the ranks; for float32/half scores ``K = 11`` gives ``< e^{−24} ≈ 3.8e−11`` per pair, far below their rounding.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._precision import float32_backward
from .window import CHUNK_SIZE

__all__ = ["CUT", "NUM_TERMS", "NUM_TERMS_LOW", "SigmoidTail", "band_width", "bands", "num_terms_for", "table_rows"]

NUM_TERMS = 19  # K: terms of the alternating series kept (float64)
NUM_TERMS_LOW = 11  # K for float32 / half scores: error < e^{−24} ≈ 4e−11 per pair, far below their rounding
CUT = 2.0  # c: the series is used where |t| / τ > c; error < e^{−(K+1)c} = e^{−40} per pair in float64


def num_terms_for(dtype: torch.dtype) -> int:
    """``K`` for scores of ``dtype``: ``(K + 1)·c ≥ 40`` in float64, ``≥ 24`` otherwise."""
    return NUM_TERMS if dtype == torch.float64 else NUM_TERMS_LOW


def band_width(tau: float, num_terms: int = NUM_TERMS) -> float:
    """Score width ``W`` of one band: factors ``e^{k|s − a|/τ}`` stay below ``e^{300}`` for ``|s − a| ≤ W/2``."""
    return 600.0 * tau / num_terms


def band_span(row_min: Tensor, row_max: Tensor, s_item: Tensor, item_row: Tensor) -> tuple[Tensor, Tensor]:
    """Lowest score ``(R,)`` (float64) of each list and of its items, and the score span ``(R,)`` the bands of that
    list must cover (the bands bracket the items too: their factors ``e^{∓k(s − a)/τ}`` are only bounded inside
    their band)."""
    s64 = s_item.detach().double()
    lo = row_min.double().scatter_reduce(0, item_row, s64, reduce="amin")
    hi = row_max.double().scatter_reduce(0, item_row, s64, reduce="amax")
    return lo, (hi - lo).clamp_min(0.0)


def bands(
    row_min: Tensor,
    row_max: Tensor,
    s_item: Tensor,
    item_row: Tensor,
    tau: float,
    num_terms: int = NUM_TERMS,
    span: tuple[Tensor, float] | None = None,
):
    """Anchors ``(num_bands, R)`` (float64, band centres) and the band of each item ``(M,)``.

    Args:
        row_min, row_max: ``(R,)`` lowest and highest finite score of each list (detached).
        s_item: ``(M,)`` item scores; ``item_row``: ``(M,)`` the list of each item.
        span: ``(lo, largest span)`` when the caller has already read them (:func:`band_span`: ``lo`` and the
            host float ``span.max()``); else computed here with one host read.
    """
    width = band_width(tau, num_terms)
    s64 = s_item.detach().double()
    if span is None:
        lo, spans = band_span(row_min, row_max, s_item, item_row)
        span = (lo, float(spans.max()) if spans.numel() else None)
    lo, span_max = span
    num_bands = max(1, int(math.floor(span_max / width)) + 1) if span_max is not None else 1
    band = torch.floor((s64 - lo[item_row]) / width).long().clamp(0, num_bands - 1)
    centres = lo[None, :] + (torch.arange(num_bands, dtype=torch.float64, device=lo.device)[:, None] + 0.5) * width
    return centres, band


def table_rows(rows: Tensor, band: Tensor, num_rows: int | None = None) -> int:
    """Number of (list, band) tables :class:`SigmoidTail` builds for these items (its cost is ``O(K·N)`` each);
    ``num_rows``: the number of lists when known. One host read."""
    if not rows.numel():
        return 0
    if num_rows is None:
        return int(torch.unique(band * (int(rows.max()) + 1) + rows).numel())
    key = torch.sort(band * int(num_rows) + rows).values
    return int((key[1:] != key[:-1]).sum()) + 1


def _flat_prefix_index(r: Tensor, c: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Flat positions in an ``(T, N)`` inclusive cumulative sum of ``Σ_{p < c}`` in row ``r``, and ``c > 0``."""
    return r * n + (c - 1).clamp_min(0), c > 0


def _take_prefix(cum: Tensor, flat: tuple[Tensor, Tensor]) -> Tensor:
    return torch.where(flat[1], cum.view(-1).take(flat[0]), 0.0)


class SigmoidTail(torch.autograd.Function):
    """``out[m] = Σ_{p < e_m} σ((x[r_m, p] − s_m)/τ) + Σ_{u_m ≤ p < h_m} σ((x[r_m, p] − s_m)/τ)`` (series form).

    Inputs: ``keys`` ``(R, N)`` float64 sorted ascending per row (``+inf`` past the members; differentiable),
    ``s_item`` ``(M,)`` float64 (differentiable), ``rows``/``lo_end``/``up_begin``/``up_end`` ``(M,)`` long,
    ``anchors`` ``(num_bands, R)`` and ``band`` ``(M,)`` from :func:`bands`. Caller's contract: every
    ``keys[r_m, p]`` with ``p < e_m`` is ``< s_m − cτ`` and every one in ``[u_m, h_m)`` is ``> s_m + cτ`` (finite),
    and ``up_begin <= up_end``. Returns ``(M,)`` float64. Per (list, band) table: ``K`` rounds of a product and a
    cumulative sum forward, about four such passes backward; the per-item terms of forward are kept for backward
    (``(K, M)``), the tables are recomputed.
    """

    @staticmethod
    def _plan(rows, band, up_begin, up_end, num_bands, num_lists, n, chunk_size):
        """Items grouped by (band, table row), in blocks of at most ``chunk_size / N`` table rows: a list of
        ``(band, items, table rows, item -> table row in the block)`` and whether any item has an upper part. Two
        host reads (the tables per band, then the item range of every block); reused by backward."""
        device = rows.device
        key = band * num_lists + rows
        order = torch.argsort(key, stable=True)  # items grouped by (band, list row), in item order within a group
        skey = key[order]
        new = torch.ones_like(skey, dtype=torch.bool)
        new[1:] = skey[1:] != skey[:-1]
        table = torch.cumsum(new, 0) - 1  # table of every sorted item
        per_band = torch.zeros(num_bands, dtype=torch.long, device=device).index_add_(0, skey // num_lists, new.long())
        host = torch.cat([per_band, (up_end > up_begin).any().long().view(1)]).tolist()  # host read 1
        rows_per_block = max(1, chunk_size // max(n, 1))
        blocks, t0 = [], 0
        for b, count in enumerate(host[:-1]):
            blocks += [(b, s0, min(s0 + rows_per_block, t0 + count)) for s0 in range(t0, t0 + count, rows_per_block)]
            t0 += count
        if not blocks:
            return [], bool(host[-1])
        tab_row = torch.zeros(t0, dtype=torch.long, device=device).scatter_(0, table, rows[order])
        firsts = torch.tensor([s0 for _, s0, _ in blocks] + [t0], dtype=table.dtype).to(device)
        starts = torch.searchsorted(table, firsts).tolist()  # host read 2
        plan = [
            (b, order[starts[k] : starts[k + 1]], tab_row[s0:s1], table[starts[k] : starts[k + 1]] - s0)
            for k, (b, s0, s1) in enumerate(blocks)
        ]
        return plan, bool(host[-1])

    @staticmethod
    def _bands(keys, s_item, rows, anchors, plan, tau, num_terms, flip_e):
        """Per block of the plan (:meth:`_plan`): the items, their table rows, and the base tables ``e^{z}``,
        ``e^{−z}`` (``z = (x − a)/τ``, clamped so that their ``K``-th powers stay finite, 0 past the members);
        ``e^{z}`` is reversed along the list when ``flip_e`` (else ``e^{−z}``)."""
        zmax = (700.0 - math.log(max(num_terms / tau, 1.0))) / num_terms  # (K/τ)·e^{K·zmax} <= e^{700}
        for b, idx, tab_rows, r in plan:
            x = keys[tab_rows]
            finite = torch.isfinite(x)
            z = (x.detach() - anchors[b][tab_rows, None]) / tau
            e1 = torch.where(finite, torch.exp(z.clamp_max(zmax)), 0.0)
            d1 = torch.where(finite, torch.exp((-z).clamp_max(zmax)), 0.0)
            e1, d1 = (e1.flip(1), d1) if flip_e else (e1, d1.flip(1))
            zi = (s_item.detach()[idx] - anchors[b][rows[idx]]) / tau
            yield idx, tab_rows, r, e1, d1, torch.exp(-zi), torch.exp(zi)

    @staticmethod
    def forward(
        ctx, keys, s_item, rows, lo_end, up_begin, up_end, anchors, band, tau, num_terms, chunk_size=CHUNK_SIZE
    ):
        n = keys.shape[1]
        lows = torch.zeros(num_terms, s_item.shape[0], dtype=torch.float64, device=keys.device)
        ups = torch.zeros_like(lows)
        plan, has_up = SigmoidTail._plan(rows, band, up_begin, up_end, anchors.shape[0], keys.shape[0], n, chunk_size)
        tables = SigmoidTail._bands(keys, s_item, rows, anchors, plan, tau, num_terms, False)
        for idx, _, r, e1, d1r, f1, phi1 in tables:
            at_e = _flat_prefix_index(r, lo_end[idx], n)
            at_u, at_h = _flat_prefix_index(r, n - up_begin[idx], n), _flat_prefix_index(r, n - up_end[idx], n)
            ek, dk, fk, pk = e1.clone(), d1r.clone(), f1.clone(), phi1.clone()
            for k in range(1, num_terms + 1):
                if k > 1:
                    ek.mul_(e1)
                    fk.mul_(f1)
                lows[k - 1, idx] = _take_prefix(torch.cumsum(ek, 1), at_e) * fk  # e^{−k zi}·Σ_{p<e} e^{k z_p}
                if has_up:  # e^{k zi}·Σ_{u≤p<h} e^{−k z_p}, from suffix sums (prefix sums of the reversed list)
                    if k > 1:
                        dk.mul_(d1r)
                        pk.mul_(phi1)
                    cum = torch.cumsum(dk, 1)
                    ups[k - 1, idx] = (_take_prefix(cum, at_u) - _take_prefix(cum, at_h)) * pk
        signs = _signs(num_terms, keys.device)
        ctx.save_for_backward(keys, s_item, rows, lo_end, up_begin, up_end, anchors, band, (lows + ups).mul_(signs))
        ctx.tau, ctx.num_terms, ctx.has_up, ctx.plan = tau, num_terms, has_up, plan
        count = (up_end - up_begin).to(torch.float64)  # the "1" of σ(x) = 1 − σ(−x) on the upper part
        return count + ((lows - ups) * signs).sum(0)

    @staticmethod
    @float32_backward
    def backward(ctx, grad_out):
        keys, s_item, rows, lo_end, up_begin, up_end, anchors, band, signed_sums = ctx.saved_tensors
        tau, num_terms, has_up = ctx.tau, ctx.num_terms, ctx.has_up
        g = grad_out.to(torch.float64)
        ks = torch.arange(1, num_terms + 1, dtype=torch.float64, device=keys.device)[:, None] / tau
        grad_s = -(ks * signed_sums).sum(0) * g  # ∂/∂s of sign·(low − up) = −sign·(k/τ)·(low + up)
        grad_keys = torch.zeros_like(keys)
        n = keys.shape[1]
        for idx, tab_rows, r, e1r, d1, f1, phi1 in SigmoidTail._bands(
            keys, s_item, rows, anchors, ctx.plan, tau, num_terms, True
        ):
            gi = g[idx]
            flat_lo = r * (n + 1) + (n - lo_end[idx])  # reversed: Σ_{e > p} = prefix sum up to n − 1 − p
            flat_u, flat_h = r * (n + 1) + up_begin[idx], r * (n + 1) + up_end[idx]
            num_tab = tab_rows.numel()
            acc_lo = torch.zeros(num_tab, n, dtype=torch.float64, device=keys.device)  # reversed orientation
            acc_up = torch.zeros_like(acc_lo)
            buf = torch.empty(num_tab * (n + 1), dtype=torch.float64, device=keys.device)
            ek, dk, fk, pk = e1r.clone(), d1.clone(), gi * f1, gi * phi1
            for k in range(1, num_terms + 1):
                c = (k / tau) * (1.0 if k % 2 else -1.0)
                if k > 1:
                    ek.mul_(e1r)
                    fk.mul_(f1)
                w = buf.zero_().index_add_(0, flat_lo, fk).view(num_tab, n + 1).cumsum(1)[:, :n]
                acc_lo.addcmul_(ek, w, value=c)  # p gets e^{k z_p}·Σ_{items with e > p} g·e^{−k zi}
                if has_up:
                    if k > 1:
                        dk.mul_(d1)
                        pk.mul_(phi1)
                    w = buf.zero_().index_add_(0, flat_u, pk).index_add_(0, flat_h, -pk)
                    w = w.view(num_tab, n + 1).cumsum(1)[:, :n]
                    acc_up.addcmul_(dk, w, value=c)  # p gets e^{−k z_p}·Σ_{items with u <= p < h} g·e^{k zi}
            grad_keys.index_add_(0, tab_rows, acc_lo.flip(1) + acc_up)
        return grad_keys, grad_s.to(s_item.dtype), None, None, None, None, None, None, None, None, None


def _signs(num_terms: int, device) -> Tensor:
    return torch.tensor([1.0 if k % 2 else -1.0 for k in range(1, num_terms + 1)], dtype=torch.float64)[:, None].to(
        device
    )
