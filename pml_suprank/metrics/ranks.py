"""Positions of the relevant items in the pessimistic full ranking, without sorting whole rows.

Conventions: ``scores`` ``(Q, N)`` (higher = closer); ``levels`` ``(Q, N)`` in ``{0..L}`` (``L`` = same fine class,
``0`` = negative; bool = binary relevance); ``mask`` ``(Q, N)`` bool, ``False`` removes an item from that query's
gallery. **Ties are pessimistic**: among exactly equal scores the less relevant items rank first (no result depends
on the input order). ``±inf`` scores rank first/last; NaN raises ``ValueError``.

Only the ``P`` relevant items of a query are sorted; negatives are only *counted* (:func:`rank_relevant_items`).
Metrics then read the ``(Q, P)`` positions (:mod:`pml_suprank.metrics.from_ranks`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import Tensor

from .._validation import check_positive_int
from ..relevance import level_counts

__all__ = ["COUNTING_METHODS", "RetrievalRanks", "rank_levels", "rank_relevant_items", "retrieval_ranks"]

COUNTING_METHODS = ("auto", "search", "histogram", "compiled", "dense")


class RetrievalRanks(NamedTuple):
    """Positions of the relevant items of every query in the pessimistic full ranking.

    Attributes:
        levels: ``(Q, P)`` int64 levels of the relevant items in ranked order; ``0`` marks padding.
        positions: ``(Q, P)`` int64 1-based positions among the gallery items that count; ``0`` for padding.
        counts: ``(Q, L + 1)`` int64 number of gallery items at each level (``counts[:, 0]`` = negatives).
        num_levels: ``L``.
    """

    levels: Tensor
    positions: Tensor
    counts: Tensor
    num_levels: int


def check_scores(scores: Tensor) -> Tensor:
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor of shape (Q, N); got {type(scores).__name__}")
    if scores.dim() != 2:
        raise ValueError(f"scores must have shape (Q, N); got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor; got dtype {scores.dtype}")
    scores = scores.detach()
    if bool(torch.isnan(scores).any()):
        bad = int(torch.isnan(scores).any(1).sum())
        raise ValueError(f"scores contains NaN values (in {bad} of {scores.shape[0]} rows); NaN has no rank")
    return _finite_order_preserving(scores)


def _finite_order_preserving(scores: Tensor) -> Tensor:
    """``scores`` with ``±inf`` mapped to ``±finfo.max`` (same order, equal infinities stay tied); the kernels use
    ``−inf`` to mark removed items. If a finite score already equals ``±finfo.max``, non-float64 scores are widened to
    float64 and the infinities become ``±2·finfo.max``; float64 scores then raise ``ValueError``."""
    inf = torch.isinf(scores)
    if not bool(inf.any()):
        return scores
    big = torch.finfo(scores.dtype).max
    if bool((scores.abs() == big).any()):
        if scores.dtype == torch.float64:
            raise ValueError(
                "scores holds ±inf together with a finite ±1.797e308 (float64 max): their order cannot be kept; "
                "rescale the scores"
            )
        scores, big = scores.double(), 2.0 * big
    return torch.where(inf, torch.full_like(scores, big).copysign_(scores), scores)


def _check_levels(levels: Tensor, scores: Tensor, num_levels: int | None) -> tuple[Tensor, int]:
    if not isinstance(levels, Tensor):
        raise TypeError(f"levels must be an integer or bool torch.Tensor of shape (Q, N); got {type(levels).__name__}")
    if levels.shape != scores.shape:
        raise ValueError(f"levels must have the shape of scores {tuple(scores.shape)}; got shape {tuple(levels.shape)}")
    if levels.is_floating_point() or levels.is_complex():
        raise TypeError(f"levels must have an integer or bool dtype; got dtype {levels.dtype}")
    if levels.dtype == torch.bool:
        if num_levels not in (None, 1):
            raise ValueError(f"bool levels are binary, so num_levels must be None or 1; got {num_levels}")
        return levels.long(), 1
    levels = levels.long()
    lmin = int(levels.min()) if levels.numel() else 0
    lmax = int(levels.max()) if levels.numel() else 0
    if num_levels is None:
        num_levels = max(lmax, 1)
    elif isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
        raise ValueError(f"num_levels must be a positive int; got {num_levels!r}")
    if lmin < 0 or lmax > num_levels:
        raise ValueError(f"levels must lie in [0, num_levels={num_levels}]; got values in [{lmin}, {lmax}]")
    return levels, num_levels


def check_mask(mask: Tensor | None, scores: Tensor, name: str = "mask") -> Tensor | None:
    """``mask`` (None, or a bool tensor of the shape of ``scores``), else TypeError / ValueError naming ``name``."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool torch.Tensor; got {getattr(mask, 'dtype', type(mask).__name__)}")
    if mask.shape != scores.shape:
        raise ValueError(f"{name} must have the shape of scores {tuple(scores.shape)}; got shape {tuple(mask.shape)}")
    return mask


_KEY_PAD = (2**63 - 1) & ~63  # larger than every key; its level bits are 0
_SORT_BAND_MIN = 2**18  # entries per sorting thread below which one thread is faster


def _descending_key(scores: Tensor) -> Tensor:
    """int64 ``-m(s)`` for float32 ``scores`` (``m``: order-preserving int32 image; ``-0.0`` and ``0.0`` equal)."""
    bits = (scores + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).long().neg_()


def _pessimistic_keys(scores: Tensor, levels: Tensor, max_level: int | None = None) -> Tensor | None:
    """int64 sort keys ``(C, P)`` (score descending, then level ascending, padding last; ``level = key & 63``), or
    None for non-float32 scores or levels >= 64 (``max_level``: a known bound, saves a host read-back)."""
    if scores.dtype != torch.float32:
        return None
    if max_level is None:
        max_level = int(levels.max()) if levels.numel() else 0
    if max_level >= 64:
        return None
    key = _descending_key(scores).mul_(64).add_(levels)
    return key.masked_fill_(levels == 0, _KEY_PAD)


def _decode_key(keys: Tensor) -> Tensor:
    """float32 scores of int64 keys from :func:`_pessimistic_keys` (inverse of the order-preserving int32 image)."""
    m = -(keys >> 6)  # key = -m·64 + level with 0 < level < 64
    return (m ^ ((m >> 31) & 0x7FFFFFFF)).to(torch.int32).view(torch.float32)


def _sort_rows(keys: Tensor) -> Tensor:
    """Sort each row of an int64 tensor (values only); on the CPU by numpy's in-place sort, in row bands on threads."""
    if keys.device.type == "cpu" and keys.is_contiguous():
        arr = keys.numpy()  # shares memory with keys
        parts = max(min(torch.get_num_threads(), arr.shape[0], arr.size // _SORT_BAND_MIN), 1)
        bounds = [arr.shape[0] * i // parts for i in range(parts + 1)]
        threads = [threading.Thread(target=arr[a:b].sort, kwargs={"axis": 1}) for a, b in zip(bounds[1:-1], bounds[2:])]
        for t in threads:
            t.start()
        arr[: bounds[1]].sort(axis=1)
        for t in threads:
            t.join()
        return keys
    return torch.sort(keys, dim=1).values


def _pessimistic_order(scores: Tensor, levels: Tensor, valid: Tensor) -> Tensor:
    """Argsort ``(C, P)``: score descending, then level ascending, padding last (fallback of ``_pessimistic_keys``)."""
    first = torch.sort(levels.masked_fill(~valid, 0), dim=1, stable=True).indices
    s = scores.masked_fill(~valid, float("-inf")).gather(1, first)
    return first.gather(1, torch.sort(s, dim=1, descending=True, stable=True).indices)


def _workspace(ws: dict | None, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A reusable buffer (no re-allocation of ``(C, N)`` tensors per chunk)."""
    n = math.prod(shape)
    if ws is None:
        return torch.empty(shape, dtype=dtype, device=device)
    b = ws.get(name)
    if b is None or b.numel() < n or b.dtype != dtype or b.device != device:
        b = torch.empty(n, dtype=dtype, device=device)
        ws[name] = b
    return b[:n].view(shape)


def rank_relevant_items(
    neg_scores: Tensor | Iterable[Tensor],
    rel_scores: Tensor,
    rel_levels: Tensor,
    num_bins: int | None = None,
    workspace: dict | None = None,
    counting: str = "auto",
    max_level: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Sort the relevant items of each query and find their positions in the full pessimistic ranking.

    Args:
        neg_scores: ``(C, N)`` scores of the negatives (level 0) of each query; every other entry (relevant items,
            removed items) must be ``-inf``. Not modified. Or an iterable of ``(C, N_b)`` column blocks of it (same
            dtype as ``rel_scores``; the counts of the blocks are summed, so a gallery is ranked block by block).
        rel_scores: ``(C, P)`` scores of the relevant items (finite); padding slots arbitrary.
        rel_levels: ``(C, P)`` int64 levels ``>= 1`` of the relevant items; ``0`` marks a padding slot.
        num_bins: histogram resolution (default ``min(N, 64 P)``); affects speed only, never the result.
        workspace: optional dict keeping ``(C, N)`` buffers between calls.
        counting: how negatives are counted (speed only): ``"search"`` binary-searches the negatives above the
            row's lowest relevant score (``O(N + M log P)``); ``"histogram"`` bins rows (``O(N)``); ``"compiled"``
            the histogram in numba (CPU); ``"dense"`` searches every entry, no host sync (accelerators); ``"auto"``:
            ``"dense"`` off the CPU, ``"compiled"`` with numba, else ``"search"`` below 5 % of negatives in range.
        max_level: a known upper bound of ``rel_levels`` (the evaluator's ``L``); saves one read-back to the host.

    Returns:
        ``(levels, positions)``, both ``(C, P)`` int64, in ranked order: the levels of the relevant items (``0`` =
        padding, always last) and their 1-based positions among the negatives and relevant items (``0`` for padding).
    """
    blocks = (neg_scores,) if isinstance(neg_scores, Tensor) else neg_scores
    C, P = rel_scores.shape
    device = rel_scores.device
    if P == 0:
        empty = torch.zeros(C, 0, dtype=torch.long, device=device)
        return empty, empty.clone()
    if counting not in COUNTING_METHODS:
        raise ValueError(f"counting must be one of {COUNTING_METHODS}; got {counting!r}")
    arange_p = torch.arange(P, device=device)
    same_dtype = not isinstance(neg_scores, Tensor) or neg_scores.dtype == rel_scores.dtype
    keys, order, rl = _sort_relevant(rel_scores, rel_levels, same_dtype, max_level)
    vs = rl > 0
    n_rel = vs.sum(1)
    # lowest relevant score of each row (+inf without relevant items: then no negative matters)
    last = (n_rel - 1).clamp_min(0)[:, None]
    lo = (_decode_key(keys.gather(1, last)) if order is None else rel_scores.gather(1, order.gather(1, last)))[:, 0]
    lo = torch.where(n_rel > 0, lo, torch.full_like(lo, float("inf")))
    neg_ge = torch.zeros(C, P, dtype=torch.long, device=device)
    for block in blocks:
        method = _auto_counting(block, rel_scores, lo) if counting == "auto" else counting
        neg_ge += _count_block(block, method, keys, order, rel_scores, vs, n_rel, lo, num_bins, workspace)
    return rl, neg_ge.add_(arange_p + 1).masked_fill_(~vs, 0)


def _count_block(neg_scores, counting, keys, order, rel_scores, vs, n_rel, lo, num_bins, workspace) -> Tensor:
    """``(C, P)`` ``#{j : neg_scores[c, j] >= r_k}`` of one block by the method ``counting`` (not ``"auto"``)."""
    if counting == "compiled":  # the kernel decodes the sorted keys itself
        if (refusal := _compiled_refusal(neg_scores, rel_scores)) is not None:
            raise refusal
        from ._compiled_rank_counts import count_negatives_compiled

        rs = keys if keys is not None else rel_scores.gather(1, order).masked_fill_(~vs, float("-inf"))
        return count_negatives_compiled(neg_scores, rs, n_rel, num_bins)
    if counting == "histogram":
        # descending relevant scores, padding (-inf) last
        rs = (_decode_key(keys) if order is None else rel_scores.gather(1, order)).masked_fill_(~vs, float("-inf"))
        return _count_negatives_histogram(neg_scores, rs, vs, num_bins, workspace)
    seq, to_seq = _search_sequence(keys, order, rel_scores, vs, neg_scores.dtype)
    if counting == "dense":
        return _count_negatives_dense(neg_scores, seq, to_seq, workspace)
    pad = _KEY_PAD if keys is not None else float("inf")
    return _count_negatives_search(neg_scores, lo, seq, pad, to_seq, workspace)


def _sort_relevant(
    rel_scores: Tensor, rel_levels: Tensor, same_dtype: bool, max_level: int | None = None
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """Pessimistic order of each row's relevant items: ``(keys, order, levels)``, the sorted int64 keys of
    :func:`_pessimistic_keys` or None (encoding inapplicable or mixed dtypes) with then the ``(C, P)`` argsort
    ``order``, and the ``(C, P)`` levels in ranked order, ``0`` on padding (last)."""
    keys = _pessimistic_keys(rel_scores, rel_levels, max_level) if same_dtype else None
    if keys is not None:  # one int64 key per item carries the score and the level: no permutation needed
        keys = _sort_rows(keys)
        return keys, None, keys & 63
    valid = rel_levels > 0
    order = _pessimistic_order(rel_scores, rel_levels, valid)
    return None, order, rel_levels.gather(1, order).masked_fill_(~valid.gather(1, order), 0)


def _search_sequence(
    keys: Tensor | None, order: Tensor | None, rel_scores: Tensor, vs: Tensor, neg_dtype: torch.dtype
) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """Ascending ``(C, P)`` image ``seq`` of the ranked relevant items (padding last) and the map ``to_seq`` with
    ``#{k : seq_k < to_seq(s)} = #{k : r_k > s}``: the sorted int64 keys and ``-m(s)·64``, else ``-r`` in the
    promoted dtype (padding ``+inf``)."""
    if keys is not None:
        return keys, lambda v: _descending_key(v).mul_(64)
    dt = torch.promote_types(neg_dtype, rel_scores.dtype)
    seq = rel_scores.gather(1, order).to(dt).neg_().masked_fill_(~vs, float("inf"))
    return seq, lambda v: -v.to(dt)


def _count_negatives_dense(
    neg_scores: Tensor, seq: Tensor, to_seq: Callable[[Tensor], Tensor], workspace: dict | None
) -> Tensor:
    """Fresh ``(C, P)`` int64 ``neg_ge[c, k] = #{j : neg_scores[c, j] >= r_k}`` by binary-searching every entry.

    Fixed shapes, no host synchronisation (the accelerator path), ``O(C·N log P)``: each entry's slot
    ``#{k : r_k > s}`` is scattered into a ``(C, P + 1)`` histogram and prefix-summed.
    """
    C, N = neg_scores.shape
    P = seq.shape[1]
    device = neg_scores.device
    above = _workspace(workspace, "above", (C, N), torch.long, device)
    torch.searchsorted(seq.contiguous(), to_seq(neg_scores), out=above)
    hist = torch.zeros(C, P + 1, dtype=torch.long, device=device)
    hist.scatter_add_(1, above, torch.ones(1, 1, dtype=torch.long, device=device).expand(C, N))
    return hist[:, :P].cumsum(1)


def _auto_counting(neg_scores: Tensor, rel_scores: Tensor, lo: Tensor) -> str:
    """``counting="auto"`` as documented in :func:`rank_relevant_items` (share estimated on 256 strided columns)."""
    if neg_scores.device.type != "cpu":
        return "dense"
    if _compiled_refusal(neg_scores, rel_scores) is None:
        return "compiled"
    C, N = neg_scores.shape
    if C == 0 or N == 0:
        return "search"
    in_range = float((neg_scores[:, :: max(N // 256, 1)] >= lo[:, None]).float().mean())
    return "search" if in_range < 0.05 else "histogram"


def _compiled_available() -> bool:
    """Whether the numba kernel can be imported (numba is the optional ``fast`` extra)."""
    try:
        from . import _compiled_rank_counts  # noqa: F401
    except ImportError:
        return False
    return True


def _compiled_refusal(neg_scores: Tensor, rel_scores: Tensor) -> Exception | None:
    """The error of ``counting="compiled"`` on these scores, None when the numba kernel can count them."""
    if neg_scores.device.type != "cpu" or rel_scores.device.type != "cpu":
        return ValueError(f"counting='compiled' runs on CPU tensors; neg_scores are on {neg_scores.device}")
    if not {neg_scores.dtype, rel_scores.dtype} <= {torch.float32, torch.float64}:
        return ValueError(
            f"counting='compiled' needs float32/float64 scores; got {neg_scores.dtype} and {rel_scores.dtype}"
        )
    if not _compiled_available():
        return ImportError("counting='compiled' needs numba: pip install 'pml-suprank[fast]'")
    return None


def _count_negatives_histogram(
    neg_scores: Tensor, rs: Tensor, vs: Tensor, num_bins: int | None, workspace: dict | None
) -> Tensor:
    """``(C, P)`` int64 ``neg_ge[c, k] = #{j : neg_scores[c, j] >= r_k}`` (arbitrary on padding) by histogram.

    ``rs`` ``(C, P)``: relevant scores in ranked (descending) order, ``-inf`` on padding (``vs`` False). Uniform bins
    over each row's relevant range (monotone bin(): only negatives sharing a relevant item's bin are compared).
    """
    C, N = neg_scores.shape
    P = rs.shape[1]
    device = neg_scores.device
    arange_p = torch.arange(P, device=device)
    n_rel = vs.sum(1)
    B = max(int(num_bins) if num_bins is not None else min(N, 64 * P), 1)
    nb_total = B + 4
    big = torch.finfo(rs.dtype).max
    lo = torch.where(vs, rs, torch.full_like(rs, big)).amin(1)
    hi = torch.where(vs, rs, torch.full_like(rs, -big)).amax(1)
    width = hi - lo
    ok = (n_rel > 0) & torch.isfinite(width) & (width > 0)
    scale = torch.where(ok, B / width.clamp_min(torch.finfo(rs.dtype).tiny), torch.ones_like(width))
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    lo = torch.where(n_rel > 0, lo, torch.zeros_like(lo))
    # a finite origin keeps bin() monotone (near -finfo.max it would be -inf: inf - inf = NaN bins)
    lo2 = (lo - 2.0 / scale).clamp_min(-big)[:, None]
    scale = scale[:, None]

    x = _workspace(workspace, "x", (C, N), neg_scores.dtype, device)
    torch.sub(neg_scores, lo2, out=x)
    x.mul_(scale).clamp_(0, nb_total - 1)
    nb = _workspace(workspace, "nb", (C, N), torch.long, device)
    nb.copy_(x)  # truncation = floor on non-negative values
    y = torch.sub(rs, lo2)
    rb = y.mul_(scale).clamp_(0, nb_total - 1).long()  # (C, P), non-increasing along the sorted order
    rb = torch.where(vs, rb, torch.zeros_like(rb))

    # float32 counts are exact below 2**24 items per row
    count_dtype = torch.float32 if N < 2**24 else torch.float64
    hist = _workspace(workspace, "hist", (C, nb_total), count_dtype, device).zero_()
    hist.scatter_add_(1, nb, torch.ones(1, 1, dtype=count_dtype, device=device).expand(C, N))
    cum = torch.cumsum(hist, 1, out=_workspace(workspace, "cum", (C, nb_total), count_dtype, device))
    neg_ge = (cum[:, -1:] - cum.gather(1, rb)).long()  # negatives in bins > bin(r_k): all score > r_k
    del cum

    relcount = _workspace(workspace, "relcount", (C, nb_total), torch.int32, device).zero_()
    relcount.scatter_add_(1, rb, vs.int())
    cand = _workspace(workspace, "cand", (C, N), torch.bool, device)
    torch.gather(relcount > 0, 1, nb, out=cand)  # negatives sharing a bin with some relevant item
    flat = cand.view(-1).nonzero().squeeze(1)  # flat indexing: much faster than 2-D advanced indexing
    if flat.numel():
        ci = torch.div(flat, N, rounding_mode="floor")
        cs = neg_scores.reshape(-1)[flat]
        cb = nb.view(-1)[flat]
        first_slot = _workspace(workspace, "first_slot", (C, nb_total), torch.int32, device).fill_(P)
        first_slot.scatter_reduce_(1, rb, torch.where(vs, arange_p.int().expand(C, P), P), "amin")
        fk = ci * nb_total + cb
        first = first_slot.view(-1)[fk].long()  # sorted index of the first (highest) relevant item of that bin
        count = relcount.view(-1)[fk]
        row_base = ci * P
        rs_flat = rs.reshape(-1)
        neg_ge_flat = neg_ge.reshape(-1).clone()
        # common case: one relevant item in the bin -> the candidate counts for it iff r <= s
        one = count == 1
        idx = row_base + first
        neg_ge_flat.index_add_(0, idx, ((rs_flat[idx] <= cs) & one).long())
        many = ~one
        if bool(many.any()):
            many = many.nonzero().squeeze(1)
            ci, cs, first, count, row_base = ci[many], cs[many], first[many], count[many].long(), row_base[many]
            max_count = int(count.max())
            if max_count <= 16:
                above = torch.zeros_like(first)
                for t in range(max_count):
                    r_t = rs_flat[row_base + (first + t).clamp_max(P - 1)]
                    above += ((t < count) & (r_t > cs)).long()
            else:  # many exactly tied relevant scores: one batched binary search instead
                seq = (-rs).masked_fill(~vs, float("inf")).contiguous()  # #{k : -r_k < -s} = #{k : r_k > s}
                above = _search_rows(seq, ci, -cs, float("inf")) - first
            # +1 to the relevant items of the bin with r <= s: sorted slots [first + above, first + count)
            diff = torch.zeros(C * (P + 1), dtype=torch.int64, device=device)
            base = ci * (P + 1)
            diff.index_add_(0, base + first + above, torch.ones_like(first))
            diff.index_add_(0, base + first + count, -torch.ones_like(first))
            neg_ge_flat += diff.view(C, P + 1).cumsum(1)[:, :P].reshape(-1)
        neg_ge = neg_ge_flat.view(C, P)
    return neg_ge


def _count_negatives_search(
    neg_scores: Tensor, lo: Tensor, seq: Tensor, pad: float | int, to_seq, workspace: dict | None
) -> Tensor:
    """Fresh ``(C, P)`` int64 ``neg_ge[c, k] = #{j : neg_scores[c, j] >= r_k}`` (relevant items in ranked order).

    Only the ``M`` negatives scoring at least ``lo`` (the row's lowest relevant score) are kept; each is
    binary-searched in ``seq`` (see :func:`_search_sequence`) and the start of its slot range ``k >= #{r_k > s}`` is
    scattered into a difference array and prefix-summed. ``O(C·N + M log P)``; exact.
    """
    C, N = neg_scores.shape
    P = seq.shape[1]
    device = neg_scores.device
    keep = _workspace(workspace, "keep", (C, N), torch.bool, device)
    torch.ge(neg_scores, lo[:, None], out=keep)
    flat = keep.view(-1).nonzero().squeeze(1)
    neg_ge = torch.zeros(C, P, dtype=torch.long, device=device)
    if flat.numel():
        rows = torch.div(flat, N, rounding_mode="floor")
        # #{k : seq_k < query} < #relevant of the row, because the query scores at least the lowest relevant item
        above = _search_rows(seq, rows, to_seq(neg_scores.reshape(-1)[flat]), pad)
        neg_ge.view(-1).index_add_(0, rows * P + above, torch.ones_like(above))
    return neg_ge.cumsum_(1)


def _search_rows(seq: Tensor, rows: Tensor, values: Tensor, pad: float | int) -> Tensor:
    """``searchsorted(seq[row], value)`` for flattened ``(row, value)`` pairs, ``rows`` non-decreasing: the values
    of each row padded with ``pad`` into one ``(C, M)`` batched search."""
    C = seq.shape[0]
    per_row = torch.bincount(rows, minlength=C)
    slot = torch.arange(rows.numel(), device=seq.device) - (torch.cumsum(per_row, 0) - per_row)[rows]
    padded = torch.full((C, int(per_row.max())), pad, dtype=seq.dtype, device=seq.device)
    padded[rows, slot] = values
    return torch.searchsorted(seq, padded)[rows, slot]


def compact_rows(selected: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The ``True`` entries of ``selected`` ``(Q, N)`` packed to the left of ``(Q, P)`` rows (``P``: most per row):
    ``(rows, cols, slot)`` of each entry and the ``(Q, P)`` bool of the filled slots."""
    n = selected.sum(1)
    P = int(n.max()) if selected.numel() else 0
    rows, cols = selected.nonzero(as_tuple=True)
    slot = selected.long().cumsum(1)[rows, cols] - 1
    return rows, cols, slot, torch.arange(P, device=selected.device) < n[:, None]


def retrieval_ranks(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    num_bins: int | None = None,
    counting: str = "auto",
) -> RetrievalRanks:
    """Positions of every relevant item (level ``>= 1``) in the pessimistic ranking of each query.

    Args:
        scores: ``(Q, N)`` similarities.
        levels: ``(Q, N)`` levels in ``{0..L}`` (int) or binary relevance (bool).
        mask: optional ``(Q, N)`` bool; ``False`` removes the item from that query's gallery.
        num_levels: ``L``; default ``max(levels)`` (pass it when some level may be absent from the data).
        num_bins: histogram resolution of the counting kernel (speed only).
        counting: one of :data:`COUNTING_METHODS` (speed only; see :func:`rank_relevant_items`).

    Returns:
        :class:`RetrievalRanks` from which every metric of this module is computed.
    """
    check_positive_int("num_bins", num_bins, allow_none=True)
    scores = check_scores(scores)
    levels, L = _check_levels(levels, scores, num_levels)
    return rank_levels(scores, levels, L, check_mask(mask, scores), num_bins=num_bins, counting=counting)


def rank_levels(
    scores: Tensor, levels: Tensor, num_levels: int, mask: Tensor | None = None, *, num_bins=None, counting="auto"
) -> RetrievalRanks:
    """:func:`retrieval_ranks` of checked inputs (no read-back to the host to check them): ``scores`` without NaN or
    ``±inf``, int64 ``levels`` in ``[0, num_levels]``, ``mask`` None or bool, all ``(Q, N)``."""
    keep = torch.ones_like(levels, dtype=torch.bool) if mask is None else mask
    rows, cols, slot, slot_valid = compact_rows((levels > 0) & keep)
    rel_idx = torch.zeros(slot_valid.shape, dtype=torch.long, device=scores.device)
    rel_idx[rows, slot] = cols
    rel_scores = scores.gather(1, rel_idx)
    rel_levels = torch.where(slot_valid, levels.gather(1, rel_idx), torch.zeros_like(rel_idx))
    neg_scores = scores.masked_fill(~(keep & (levels == 0)), float("-inf"))
    lv, pos = rank_relevant_items(neg_scores, rel_scores, rel_levels, num_bins=num_bins, counting=counting)
    return RetrievalRanks(lv, pos, level_counts(levels, num_levels, keep), num_levels)
