"""Exact per-query retrieval metrics from scores and levels, without sorting whole rows.

Conventions (DESIGN.md §2):
    * ``scores`` ``(Q, N)``: similarity of every gallery item to every query (higher = closer).
    * ``levels`` ``(Q, N)``: level of every gallery item for every query, in ``{0, ..., L}``; ``L`` = same fine
      class, ``0`` = negative (see :func:`pml_suprank.relevance.level_matrix`). A bool tensor is a binary
      (one-level) relevance.
    * ``mask`` ``(Q, N)`` bool, optional: ``False`` removes an item from the gallery of that query (e.g. the query
      itself when the gallery is the query set; PML convention).
    * **Ties are resolved pessimistically**: among items with exactly equal scores the less relevant ones (lower
      level) are ranked first, then by index. Every metric is the value of this worst-case order, so no result
      depends on the input order and tied items of equal relevance never penalise each other.
    * Binary metrics take ``min_level``: positives are the items at level ``>= min_level`` (default ``L``, i.e. the
      same fine class). "AP at hierarchy level ``h``" (column ``h`` of ``(N, L)`` labels, 0 = finest) is
      ``min_level = L - h``.
    * Queries without any positive get ``NaN`` (they are excluded from means, never scored 0).

Algorithm (DESIGN.md §3). Only the *relevant* items of a query (level ``>= 1``, ``P`` of them) are sorted, with one
int64 key per item (order-preserving integer image of the score, level in the low bits). Negatives are only *counted*
(:func:`rank_relevant_items`, ``counting=``): negatives scoring below the lowest relevant item of their query rank
after every relevant item and never change a metric, so one comparison pass prunes them and each remaining negative
is binary-searched among the sorted keys (``"search"``, ``O(N + M log P)`` for ``M`` kept negatives); when most
negatives overlap the relevant range, a uniform histogram of the row (bins spanning the relevant scores' range,
``O(N)``) plus an exact correction for the negatives that share a bin with a relevant item is used instead
(``"histogram"``). Both are exact. Every metric is then computed from the ``(Q, P)`` positions of the relevant items
with shared per-level prefix sums (:func:`metrics_from_ranks`).

References:
    Ramzi et al., "Optimization of Rank Losses for Image Retrieval" (SupRank, TPAMI): H-AP Eqs. 18-20, NDCG Eq. 23,
    ASI App. C-A1, ΣwAP supplementary Sec. B-B3 (Property 1).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._validation import check_positive
from ..relevance import level_counts, pop_relevance, property1_relevance

__all__ = [
    "COUNTING_METHODS",
    "RetrievalRanks",
    "asi",
    "average_precision",
    "hierarchical_average_precision",
    "map_at_k",
    "map_at_r",
    "metrics_from_ranks",
    "ndcg",
    "precision_at_k",
    "r_precision",
    "rank_relevant_items",
    "recall_at_k",
    "retrieval_ranks",
    "true_recall_at_k",
    "weighted_sum_ap",
]


#: ways of counting the negatives ranked before each relevant item (speed only; every one is exact)
COUNTING_METHODS = ("auto", "search", "histogram")


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


# ----------------------------------------------------------------------------------------------------------------
# input checks


def _check_scores(scores: Tensor) -> Tensor:
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor of shape (Q, N); got {type(scores).__name__}")
    if scores.dim() != 2:
        raise ValueError(f"scores must have shape (Q, N); got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor; got dtype {scores.dtype}")
    if bool(torch.isnan(scores).any()):
        raise ValueError("scores contains NaN values")
    return scores.detach()


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


def _check_mask(mask: Tensor | None, scores: Tensor) -> Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool torch.Tensor; got {getattr(mask, 'dtype', type(mask).__name__)}")
    if mask.shape != scores.shape:
        raise ValueError(f"mask must have the shape of scores {tuple(scores.shape)}; got shape {tuple(mask.shape)}")
    return mask


def _check_min_level(min_level: int | None, num_levels: int) -> int:
    if min_level is None:
        return num_levels
    if isinstance(min_level, bool) or not isinstance(min_level, int) or not 1 <= min_level <= num_levels:
        raise ValueError(f"min_level must be an int in [1, num_levels={num_levels}]; got {min_level!r}")
    return min_level


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int; got {k!r}")
    return k


# ----------------------------------------------------------------------------------------------------------------
# ranks


_KEY_PAD = (2**63 - 1) & ~63  # larger than every key; its level bits are 0


def _descending_key(scores: Tensor) -> Tensor:
    """int64 ``-m(s)`` for float32 ``scores``, with ``m`` the order-preserving int32 image of the float: keys increase
    as scores decrease, and equal scores (``-0.0 == 0.0``) get equal keys."""
    bits = (scores + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).long().neg_()


def _pessimistic_keys(scores: Tensor, levels: Tensor) -> Tensor | None:
    """int64 sort keys ``(C, P)``: score descending, then level ascending, padding (level 0) last with key bits
    ``level = key & 63`` (0 for padding); None when the one-key encoding does not apply (float64, levels >= 64)."""
    if scores.dtype != torch.float32 or (levels.numel() and int(levels.max()) >= 64):
        return None
    key = _descending_key(scores).mul_(64).add_(levels)
    return key.masked_fill_(levels == 0, _KEY_PAD)


def _decode_key(keys: Tensor) -> Tensor:
    """float32 scores of int64 keys from :func:`_pessimistic_keys` (inverse of the order-preserving int32 image)."""
    m = -(keys >> 6)  # key = -m·64 + level with 0 < level < 64
    return (m ^ ((m >> 31) & 0x7FFFFFFF)).to(torch.int32).view(torch.float32)


def _sort_rows(keys: Tensor) -> Tensor:
    """Sort each row of an int64 tensor (values only). On the CPU, numpy's in-place sort (SIMD-accelerated where the
    CPU allows) is several times faster than ``torch.sort``, which also builds the permutation."""
    if keys.device.type == "cpu" and keys.is_contiguous():
        keys.numpy().sort(axis=1)  # shares memory with keys
        return keys
    return torch.sort(keys, dim=1).values


def _pessimistic_order(scores: Tensor, levels: Tensor, valid: Tensor) -> Tensor:
    """Argsort ``(C, P)`` by score descending, then level ascending (padding last)."""
    if scores.dtype == torch.float32 and (levels.numel() == 0 or int(levels.max()) < 64):
        # one int64 sort: order-preserving int32 image of the float, negated, then the level in the low bits
        s = scores + 0.0  # turns -0.0 into +0.0 so that equal floats get equal keys
        bits = s.view(torch.int32).long()
        mapped = torch.where(bits >= 0, bits, -(bits & 0x7FFFFFFF) - 1)
        key = (-mapped) * 64 + levels
        key = key.masked_fill(~valid, torch.iinfo(torch.int64).max)
        return torch.sort(key, dim=1).indices
    # generic: stable sort by level, then stable sort by score descending
    lev = levels.masked_fill(~valid, 0)
    first = torch.sort(lev, dim=1, stable=True).indices
    s = scores.masked_fill(~valid, float("-inf")).gather(1, first)
    second = torch.sort(s, dim=1, descending=True, stable=True).indices
    return first.gather(1, second)


def _workspace(ws: dict | None, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A reusable buffer (avoids re-allocating and page-faulting ``(C, N)`` tensors for every chunk)."""
    n = 1
    for d in shape:
        n *= d
    if ws is None:
        return torch.empty(shape, dtype=dtype, device=device)
    b = ws.get(name)
    if b is None or b.numel() < n or b.dtype != dtype or b.device != device:
        b = torch.empty(n, dtype=dtype, device=device)
        ws[name] = b
    return b[:n].view(shape)


def rank_relevant_items(
    neg_scores: Tensor,
    rel_scores: Tensor,
    rel_levels: Tensor,
    num_bins: int | None = None,
    workspace: dict | None = None,
    counting: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Sort the relevant items of each query and find their positions in the full pessimistic ranking.

    Low-level kernel shared by :func:`retrieval_ranks` and :class:`~pml_suprank.metrics.RetrievalEvaluator`.

    Args:
        neg_scores: ``(C, N)`` scores of the negatives (level 0) of each query; every other entry (relevant items,
            removed items) must be ``-inf``. Not modified.
        rel_scores: ``(C, P)`` scores of the relevant items (finite); padding slots arbitrary.
        rel_levels: ``(C, P)`` int64 levels ``>= 1`` of the relevant items; ``0`` marks a padding slot.
        num_bins: histogram resolution (default ``min(N, 64 P)``); affects speed only, never the result.
        workspace: optional dict in which ``(C, N)`` buffers are kept between calls.
        counting: how negatives are counted (speed only, never the result; see :data:`COUNTING_METHODS`):
            ``"search"`` keeps only the negatives scoring at least the lowest relevant score of their row (the others
            rank after every relevant item and never change a metric) and binary-searches each of them among the
            sorted relevant scores, ``O(N + M log P)`` for ``M`` such negatives; ``"histogram"`` bins whole rows,
            ``O(N)`` plus an exact comparison for the negatives sharing a bin with a relevant item; ``"auto"`` picks
            ``"search"`` when a strided sample of the row block puts fewer than 5 % of the negatives in range (the
            measured break-even on a 2-core CPU lies between 1 % and 11 %).

    Returns:
        ``(levels, positions)``, both ``(C, P)`` int64, in ranked order: the levels of the relevant items (``0`` =
        padding, always last) and their 1-based positions among the negatives and relevant items (``0`` for padding).
    """
    C, N = neg_scores.shape
    P = rel_scores.shape[1]
    device = neg_scores.device
    if P == 0:
        empty = torch.zeros(C, 0, dtype=torch.long, device=device)
        return empty, empty.clone()
    if counting not in COUNTING_METHODS:
        raise ValueError(f"counting must be one of {COUNTING_METHODS}; got {counting!r}")
    arange_p = torch.arange(P, device=device)
    keys = _pessimistic_keys(rel_scores, rel_levels) if neg_scores.dtype == rel_scores.dtype else None
    order = None
    if keys is not None:  # one int64 key per item carries the score and the level: no permutation needed
        keys = _sort_rows(keys)
        rl = keys & 63  # levels in ranked order, 0 on padding (always last)
    else:
        valid = rel_levels > 0
        order = _pessimistic_order(rel_scores, rel_levels, valid)
        rl = rel_levels.gather(1, order).masked_fill_(~valid.gather(1, order), 0)
    vs = rl > 0
    n_rel = vs.sum(1)
    # lowest relevant score of each row (+inf without relevant items: then no negative matters)
    last = (n_rel - 1).clamp_min(0)[:, None]
    lo = (_decode_key(keys.gather(1, last)) if order is None else rel_scores.gather(1, order.gather(1, last)))[:, 0]
    lo = torch.where(n_rel > 0, lo, torch.full_like(lo, float("inf")))
    if counting == "auto":
        counting = "search" if _in_range_fraction(neg_scores, lo) < 0.05 else "histogram"
    if counting == "search":
        if keys is not None:  # the sorted keys are the search sequence: #{k : r_k > s} = #{k : key_k < key(s)}
            neg_ge = _count_negatives_search(
                neg_scores, lo, keys, _KEY_PAD, lambda v: _descending_key(v) * 64, workspace
            )
        else:  # ascending -r (padding +inf): #{k : r_k > s} = #{k : -r_k < -s}
            dt = torch.promote_types(neg_scores.dtype, rel_scores.dtype)  # exact comparisons across dtypes
            seq = rel_scores.gather(1, order).to(dt).neg_().masked_fill_(~vs, float("inf"))
            neg_ge = _count_negatives_search(neg_scores, lo, seq, float("inf"), lambda v: -v.to(dt), workspace)
        positions = neg_ge.add_(arange_p + 1).masked_fill_(~vs, 0)
        return rl, positions

    # descending relevant scores, padding (-inf) last
    rs = (_decode_key(keys) if order is None else rel_scores.gather(1, order)).masked_fill_(~vs, float("-inf"))
    # Uniform bins over each row's relevant range: bin() is monotone because it is a chain of correctly rounded
    # elementwise ops (sub, mul, clamp, trunc) applied identically to every score, so an item in a higher bin than a
    # relevant item scores strictly higher, and only the items sharing a bin need an exact comparison.
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
    lo2 = (lo - 2.0 / scale)[:, None]
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
                above = _count_greater(rs, vs, ci, cs) - first
            # +1 to the relevant items of the bin with r <= s: sorted slots [first + above, first + count)
            diff = torch.zeros(C * (P + 1), dtype=torch.int64, device=device)
            base = ci * (P + 1)
            diff.index_add_(0, base + first + above, torch.ones_like(first))
            diff.index_add_(0, base + first + count, -torch.ones_like(first))
            neg_ge_flat += diff.view(C, P + 1).cumsum(1)[:, :P].reshape(-1)
        neg_ge = neg_ge_flat.view(C, P)
    positions = torch.where(vs, neg_ge + arange_p + 1, torch.zeros_like(neg_ge))
    return torch.where(vs, rl, torch.zeros_like(rl)), positions


def _in_range_fraction(neg_scores: Tensor, lo: Tensor, samples: int = 256) -> float:
    """Share of the entries of ``neg_scores`` ``(C, N)`` with ``score >= lo`` (per row), from strided columns."""
    C, N = neg_scores.shape
    if C == 0 or N == 0:
        return 0.0
    step = max(N // samples, 1)
    return float((neg_scores[:, ::step] >= lo[:, None]).float().mean())


def _count_negatives_search(
    neg_scores: Tensor, lo: Tensor, seq: Tensor, pad: float | int, to_seq, workspace: dict | None
) -> Tensor:
    """``neg_ge[c, k] = #{j : neg_scores[c, j] >= r_k}`` for the relevant items ``r_k`` of row ``c``, ranked order.

    One comparison pass keeps the ``M`` negatives scoring at least ``lo`` (the lowest relevant score of the row; the
    others are below every relevant item). Each one is binary-searched in ``seq`` ``(C, P)``, an ascending image of
    the ranked relevant items (``to_seq(s)`` lands after exactly the ``k`` with ``r_k > s``; padding sorts last): it
    ranks before (pessimistic ties: at or above) the slots ``k >= #{r_k > s}``, a range whose start is scattered
    into a difference array and prefix-summed. ``O(C·N + M log P)``; exact (no arithmetic on the scores).

    Returns:
        ``(C, P)`` int64 (a fresh tensor, safe to modify in place).
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
        queries_flat = to_seq(neg_scores.reshape(-1)[flat])
        per_row = torch.bincount(rows, minlength=C)
        width = int(per_row.max())
        first = torch.cumsum(per_row, 0) - per_row
        slot = rows * width + (torch.arange(flat.numel(), device=device) - first[rows])
        queries = torch.full((C * width,), pad, dtype=seq.dtype, device=device)
        queries[slot] = queries_flat
        # #{k : seq_k < query} < #relevant of the row, because the query scores at least the lowest relevant item
        above = torch.searchsorted(seq, queries.view(C, width)).view(-1)[slot]
        neg_ge.view(-1).index_add_(0, rows * P + above, torch.ones_like(above))
    return neg_ge.cumsum_(1)


def _count_greater(rs: Tensor, vs: Tensor, rows: Tensor, values: Tensor) -> Tensor:
    """``#{k : rs[row, k] > value}`` for flattened (row, value) pairs; ``rs`` descending per row."""
    C, P = rs.shape
    counts = torch.bincount(rows, minlength=C)
    M = int(counts.max())
    start = torch.cumsum(counts, 0) - counts
    slot = torch.arange(rows.numel(), device=rs.device) - start[rows]
    padded = torch.full((C, M), float("inf"), dtype=rs.dtype, device=rs.device)
    padded[rows, slot] = -values
    seq = (-rs).masked_fill(~vs, float("inf")).contiguous()
    found = torch.searchsorted(seq, padded, right=False)  # #{k : -r_k < -v} = #{k : r_k > v}
    return found[rows, slot]


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
        counting: ``"auto"``, ``"search"`` or ``"histogram"`` (speed only; see :func:`rank_relevant_items`).

    Returns:
        :class:`RetrievalRanks` from which every metric of this module is computed.
    """
    scores = _check_scores(scores)
    levels, L = _check_levels(levels, scores, num_levels)
    mask = _check_mask(mask, scores)
    Q, N = scores.shape
    keep = torch.ones_like(levels, dtype=torch.bool) if mask is None else mask
    relevant = (levels > 0) & keep
    n_rel = relevant.sum(1)
    P = int(n_rel.max()) if Q else 0
    rows, cols = relevant.nonzero(as_tuple=True)
    slot = relevant.long().cumsum(1)[rows, cols] - 1
    rel_idx = torch.zeros(Q, P, dtype=torch.long, device=scores.device)
    rel_idx[rows, slot] = cols
    slot_valid = torch.arange(P, device=scores.device) < n_rel[:, None]
    rel_scores = scores.gather(1, rel_idx)
    rel_levels = torch.where(slot_valid, levels.gather(1, rel_idx), torch.zeros_like(rel_idx))
    neg_scores = scores.masked_fill(~(keep & (levels == 0)), float("-inf"))
    lv, pos = rank_relevant_items(neg_scores, rel_scores, rel_levels, num_bins=num_bins, counting=counting)
    counts = level_counts(levels, L, keep)
    return RetrievalRanks(lv, pos, counts, L)


# ----------------------------------------------------------------------------------------------------------------
# metrics from ranks (float64)


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


def _binary_parts(ranks: RetrievalRanks, min_level: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """positives mask, rank⁺ (cumulative positives), positions (float64, padding = inf), #positives."""
    pos_mask = ranks.levels >= min_level
    rank_plus = pos_mask.long().cumsum(1)
    position = torch.where(pos_mask, _f64(ranks.positions), torch.full_like(_f64(ranks.positions), float("inf")))
    n_pos = ranks.counts[:, min_level:].sum(1)
    return pos_mask, rank_plus, position, n_pos


def _nan_where_empty(value: Tensor, n: Tensor) -> Tensor:
    return torch.where(n > 0, value, torch.full_like(value, float("nan")))


def ap_from_ranks(ranks: RetrievalRanks, min_level: int | None = None) -> Tensor:
    """Average precision ``(Q,)`` (positives: level ``>= min_level``, default ``L``); NaN without positives."""
    m = _check_min_level(min_level, ranks.num_levels)
    pos_mask, rank_plus, position, n_pos = _binary_parts(ranks, m)
    total = (pos_mask * rank_plus / position).sum(1)
    return _nan_where_empty(total / n_pos.clamp_min(1), n_pos)


def map_at_r_from_ranks(ranks: RetrievalRanks, min_level: int | None = None) -> Tensor:
    """mAP@R ``(Q,)`` (Musgrave et al.): precision summed over positives within the first ``R = #positives``
    positions, divided by ``R``."""
    m = _check_min_level(min_level, ranks.num_levels)
    pos_mask, rank_plus, position, n_pos = _binary_parts(ranks, m)
    within = pos_mask & (position <= n_pos[:, None])
    total = (within * rank_plus / position).sum(1)
    return _nan_where_empty(total / n_pos.clamp_min(1), n_pos)


def map_at_k_from_ranks(ranks: RetrievalRanks, k: int, min_level: int | None = None) -> Tensor:
    """mAP@k ``(Q,)``: precision summed over positives in the top ``k``, divided by ``min(#positives, k)``."""
    k = _check_k(k)
    m = _check_min_level(min_level, ranks.num_levels)
    pos_mask, rank_plus, position, n_pos = _binary_parts(ranks, m)
    within = pos_mask & (position <= k)
    total = (within * rank_plus / position).sum(1)
    return _nan_where_empty(total / n_pos.clamp(1, k), n_pos)


def _hits_at_k(ranks: RetrievalRanks, k: int, min_level: int) -> tuple[Tensor, Tensor]:
    pos_mask = (ranks.levels >= min_level) & (ranks.positions <= k) & (ranks.positions > 0)
    return _f64(pos_mask.sum(1)), ranks.counts[:, min_level:].sum(1)


def recall_at_k_from_ranks(ranks: RetrievalRanks, k: int, min_level: int | None = None) -> Tensor:
    """R@k as used in image retrieval ``(Q,)``: 1 if a positive is among the top ``k`` (hit rate)."""
    k, m = _check_k(k), _check_min_level(min_level, ranks.num_levels)
    hits, n_pos = _hits_at_k(ranks, k, m)
    return _nan_where_empty((hits > 0).to(torch.float64), n_pos)


def true_recall_at_k_from_ranks(ranks: RetrievalRanks, k: int, min_level: int | None = None) -> Tensor:
    """True recall@k ``(Q,)``: positives in the top ``k`` divided by ``min(#positives, k)``."""
    k, m = _check_k(k), _check_min_level(min_level, ranks.num_levels)
    hits, n_pos = _hits_at_k(ranks, k, m)
    return _nan_where_empty(hits / n_pos.clamp(1, k), n_pos)


def precision_at_k_from_ranks(ranks: RetrievalRanks, k: int, min_level: int | None = None) -> Tensor:
    """P@k ``(Q,)``: positives in the top ``k`` divided by ``k``."""
    k, m = _check_k(k), _check_min_level(min_level, ranks.num_levels)
    hits, n_pos = _hits_at_k(ranks, k, m)
    return _nan_where_empty(hits / k, n_pos)


def r_precision_from_ranks(ranks: RetrievalRanks, min_level: int | None = None) -> Tensor:
    """R-precision ``(Q,)``: positives within the first ``R = #positives`` positions, divided by ``R``."""
    m = _check_min_level(min_level, ranks.num_levels)
    pos_mask, _, position, n_pos = _binary_parts(ranks, m)
    hits = _f64((pos_mask & (position <= n_pos[:, None])).sum(1))
    return _nan_where_empty(hits / n_pos.clamp_min(1), n_pos)


def _check_relevance_table(relevance: Tensor, ranks: RetrievalRanks) -> Tensor:
    Q = ranks.counts.shape[0]
    L = ranks.num_levels
    if not isinstance(relevance, Tensor) or not relevance.is_floating_point():
        raise TypeError(f"relevance must be a floating-point torch.Tensor of shape (Q, L + 1); got {relevance!r}")
    if relevance.dim() == 1:
        relevance = relevance.expand(Q, -1)
    if relevance.shape != (Q, L + 1):
        raise ValueError(f"relevance must have shape (Q, L + 1) = {(Q, L + 1)}; got shape {tuple(relevance.shape)}")
    if not bool(torch.isfinite(relevance).all()) or bool((relevance < 0).any()):
        raise ValueError("relevance must be finite and non-negative")
    return _f64(relevance).to(ranks.levels.device)


def hap_from_ranks(ranks: RetrievalRanks, relevance: Tensor | None = None, alpha: float = 1.0) -> Tensor:
    """Hierarchical AP (SupRank Eqs. 18-19) ``(Q,)``.

    ``H-rank⁺(k) = Σ_{j ranked at or before k} min(rel(k), rel(j))`` (the pessimistic order replaces the Heaviside
    of Eq. 18), ``H-AP = Σ_k H-rank⁺(k) / rank(k) / Σ_k rel(k)`` over the relevant items ``k``. Levels are
    identified by their integer level, never by float equality of relevances (the reference double-counts).

    Args:
        ranks: from :func:`retrieval_ranks`.
        relevance: ``(Q, L + 1)`` or ``(L + 1,)`` table ``rel(l)`` (column 0 ignored). Default: the pop relevance
            of Eq. 20, ``(l / L)^α / |Ω^(l)|``, counted on the gallery actually searched.
        alpha: ``α`` of Eq. 20 (used only for the default table).
    """
    if relevance is None:
        check_positive("alpha", alpha, strict=False)
        table = pop_relevance(ranks.counts, alpha=alpha, dtype=torch.float64)
    else:
        table = _check_relevance_table(relevance, ranks)
    return _hap_with_table(ranks, table)


def ndcg_from_ranks(ranks: RetrievalRanks) -> Tensor:
    """NDCG (SupRank Eq. 23) ``(Q,)`` with gains ``2^l − 1`` and the ideal DCG of the same gallery; NaN without
    relevant items."""
    L = ranks.num_levels
    lv = ranks.levels
    P = lv.shape[1]
    device = lv.device
    gain = torch.pow(2.0, _f64(lv)) - 1.0
    disc = 1.0 / torch.log2(1.0 + _f64(ranks.positions).clamp_min(1))
    dcg = (gain * disc * (lv > 0)).sum(1)
    # ideal: levels in decreasing order, positions 1..n_rel; D[p] = Σ_{i<=p} 1 / log2(1 + i)
    n_rel = ranks.counts[:, 1:].sum(1)
    ideal_disc = 1.0 / torch.log2(torch.arange(2, P + 2, device=device, dtype=torch.float64))
    D = torch.cat([torch.zeros(1, device=device, dtype=torch.float64), ideal_disc.cumsum(0)])
    idcg = torch.zeros_like(dcg)
    start = torch.zeros_like(n_rel)
    for lvl in range(L, 0, -1):
        n_l = ranks.counts[:, lvl]
        idcg += (2.0**lvl - 1.0) * (D[(start + n_l).clamp_max(P)] - D[start.clamp_max(P)])
        start = start + n_l
    return _nan_where_empty(dcg / torch.where(idcg > 0, idcg, torch.ones_like(idcg)), n_rel)


def asi_from_ranks(ranks: RetrievalRanks) -> Tensor:
    """Average Set Intersection (SupRank App. C-A1) ``(Q,)``.

    With ``N⁺`` relevant items, ``ASI = (1/N⁺) Σ_{n=1}^{N⁺} Σ_l min(c_l(n), c*_l(n)) / n`` where ``c_l(n)`` counts the
    level-``l`` items in the top ``n`` of the ranking and ``c*_l(n)`` in the ideal ranking. NaN without relevant items.
    """
    L = ranks.num_levels
    lv, pos = ranks.levels, ranks.positions
    P = lv.shape[1]
    device = lv.device
    n_plus = ranks.counts[:, 1:].sum(1)
    if P == 0:
        return torch.full(n_plus.shape, float("nan"), dtype=torch.float64, device=device)
    n = torch.arange(1, P + 1, device=device)
    inside = (lv > 0) & (pos <= n_plus[:, None])  # only positions <= N⁺ <= P matter
    slot = torch.where(inside, pos - 1, torch.full_like(pos, P))
    total = torch.zeros(lv.shape[0], P, dtype=torch.float64, device=device)
    above = torch.zeros_like(n_plus)  # relevant items of higher level (ranked first in the ideal order)
    for lvl in range(L, 0, -1):
        hit = torch.zeros(lv.shape[0], P + 1, dtype=torch.int64, device=device)
        hit.scatter_add_(1, slot, (inside & (lv == lvl)).long())
        c = hit[:, :P].cumsum(1)
        n_l = ranks.counts[:, lvl]
        c_star = (n[None, :] - above[:, None]).clamp_min(0).minimum(n_l[:, None])
        total += _f64(torch.minimum(c, c_star))
        above = above + n_l
    total = (total / _f64(n)[None, :]) * (n[None, :] <= n_plus[:, None])
    return _nan_where_empty(total.sum(1) / n_plus.clamp_min(1), n_plus)


def weighted_sum_ap_from_ranks(ranks: RetrievalRanks, weights: Tensor | list[float] | None = None) -> Tensor:
    """ΣwAP ``(Q,)`` = ``Σ_l w_l·AP^(l) / Σ_l w_l`` over the levels ``l`` that have positives for the query, where
    ``AP^(l)`` takes the items at level ``>= l`` as positives (SupRank Sec. V-A1 and supplementary B-B3).

    With weights summing to 1 and every level populated this is the paper's ``Σ_l w_l·AP^(l)``; it equals H-AP
    with the Property-1 relevance (:func:`pml_suprank.relevance.property1_relevance`). Default: uniform weights.
    """
    L = ranks.num_levels
    w = _check_weights(weights, L, ranks.levels.device)
    num = torch.zeros(ranks.counts.shape[0], dtype=torch.float64, device=w.device)
    den = torch.zeros_like(num)
    for lvl in range(1, L + 1):
        ap = ap_from_ranks(ranks, lvl)
        has = ~torch.isnan(ap)
        num += torch.where(has, w[lvl - 1] * ap, torch.zeros_like(ap))
        den += torch.where(has, w[lvl - 1], torch.zeros_like(ap))
    return _nan_where_empty(num / torch.where(den > 0, den, torch.ones_like(den)), den)


class _Threshold(NamedTuple):
    cum: Tensor  # (C, P) float64: positives ranked at or before each slot (inclusive)
    cprec: Tensor  # (C, P) float64: cumulative Σ rank⁺/rank over the positives (inclusive)
    n_pos: Tensor  # (C,)


def _at(arr: Tensor, i: Tensor) -> Tensor:
    """``arr[c, i[c] - 1]`` (0 where ``i[c] == 0``): inclusive prefix sums ``(C, P)``, slot counts ``i`` ``(C, 1)``."""
    return torch.where(i > 0, arr.gather(1, (i - 1).clamp_min(0)), 0.0)[:, 0]


def metrics_from_ranks(
    ranks: RetrievalRanks,
    *,
    k_values: tuple[int, ...] = (1,),
    groups: tuple[str, ...] | set[str] = (),
    alpha: float = 1.0,
    level_weights: Tensor | list[float] | None = None,
) -> dict[str, Tensor]:
    """Every requested metric from one :class:`RetrievalRanks` with shared prefix sums (used by the evaluator).

    For each positive threshold the precisions ``rank⁺/rank`` are prefix-summed once; because positions increase
    along the ranked order, ``mAP@R``, ``mAP@k``, ``R@k``, ``P@k`` and R-precision are then single gathers. H-AP,
    NDCG and ASI reuse the same per-level cumulative counts (the ``(Q, P)`` arrays of the coarsest level are the
    bulk of the evaluator's post-matmul work, so every pass over them is shared).

    Args:
        ranks: from :func:`retrieval_ranks` or the evaluator.
        k_values: the ``k`` of the top-k metrics.
        groups: names from :data:`pml_suprank.metrics.METRIC_GROUPS`.
        alpha: H-AP relevance exponent.
        level_weights: ΣwAP weights ``w_1..w_L``.

    Returns:
        ``{key: (Q,) float64}`` with the evaluator's key names (NaN where undefined).
    """
    L = ranks.num_levels
    lv, positions, counts = ranks.levels, ranks.positions, ranks.counts
    C, P = lv.shape
    device = lv.device
    if P == 0:  # one padding slot keeps every gather well defined
        lv = torch.zeros(C, 1, dtype=lv.dtype, device=device)
        positions = torch.zeros_like(lv)
        P = 1
    want = set(groups)
    valid = lv > 0
    pos_f = _f64(positions).masked_fill_(~valid, float("inf"))  # increasing along the slots, padding last
    inv = pos_f.reciprocal()  # 0 on padding
    cache: dict[int, _Threshold] = {}
    level_ge: dict[int, Tensor] = {}

    def ge(m: int) -> Tensor:
        if m not in level_ge:
            level_ge[m] = valid if m == 1 else lv >= m
        return level_ge[m]

    def threshold(m: int) -> _Threshold:
        if m not in cache:
            cum = torch.cumsum(ge(m), 1, dtype=torch.float64)
            prec = cum * inv  # inv is 0 on padding, so only levels 1..m-1 need masking
            if m > 1:
                prec.masked_fill_(lv < m, 0.0)
            cache[m] = _Threshold(cum, prec.cumsum_(1), counts[:, m:].sum(1))
        return cache[m]

    upto_k: dict[int, Tensor] = {}

    def upto(t: Tensor) -> Tensor:  # (C, 1) number of slots with position <= t
        return torch.searchsorted(pos_f, _f64(t).reshape(-1, 1).expand(C, 1).contiguous(), right=True)

    def upto_const(k: int) -> Tensor:
        if k not in upto_k:
            upto_k[k] = upto(torch.full((C,), k, dtype=torch.float64, device=device))
        return upto_k[k]

    def nan_empty(v: Tensor, n: Tensor) -> Tensor:
        return torch.where(n > 0, v, torch.full_like(v, float("nan")))

    out: dict[str, Tensor] = {}

    def binary(suffix: str, m: int, fine: bool) -> None:
        th = threshold(m)
        n = th.n_pos
        nf = _f64(n).clamp_min(1)
        if ("ap" in want and fine) or ("ap_level" in want and not fine):
            out[f"ap{suffix}"] = nan_empty(th.cprec[:, -1] / nf, n)
        if ("map_at_r" in want and fine) or ("map_at_r_level" in want and not fine) or "r_precision" in want:
            iR = upto(n)
            if ("map_at_r" in want and fine) or ("map_at_r_level" in want and not fine):
                out[f"map_at_r{suffix}"] = nan_empty(_at(th.cprec, iR) / nf, n)
            if fine and "r_precision" in want:
                out["r_precision"] = nan_empty(_at(th.cum, iR) / nf, n)
        ks = set(k_values) | ({1} if fine and "precision_at_1" in want else set())
        for k in sorted(ks):
            ik = upto_const(k)
            hits = _at(th.cum, ik)
            if fine:
                if "precision_at_1" in want and k == 1:
                    out["precision_at_1"] = nan_empty(hits, n)
                if k not in k_values:
                    continue
                if "recall_at_k" in want:
                    out[f"recall_at_{k}"] = nan_empty((hits > 0).double(), n)
                if "precision_at_k" in want:
                    out[f"precision_at_{k}"] = nan_empty(hits / k, n)
                if "true_recall_at_k" in want:
                    out[f"true_recall_at_{k}"] = nan_empty(hits / _f64(n).clamp(1, k), n)
                if "map_at_k" in want:
                    out[f"map_at_{k}"] = nan_empty(_at(th.cprec, ik) / _f64(n).clamp(1, k), n)
            elif "recall_at_k_level" in want:
                out[f"recall_at_{k}{suffix}"] = nan_empty((hits > 0).double(), n)

    binary("", L, True)
    if want & {"ap_level", "map_at_r_level", "recall_at_k_level"}:
        for h in range(L):
            binary(f"_level{h}", L - h, False)
    if "h_ap" in want:
        # H-rank⁺(k) = Σ_l c_l(k)·min(rel(k), rel(l)), c_l(k) = items of level exactly l at or before slot k.
        # Summed by parts over the cumulative counts A_l = c_l + ... + c_L (the cached thresholds):
        # H-rank⁺(k) = Σ_l A_l(k)·(min(rel(k), rel(l)) - min(rel(k), rel(l - 1))), with the term of l - 1 = 0 zero;
        # the (Q, L + 1, L + 1) table of those differences is tiny, so each level costs one gather and one fma.
        table = pop_relevance(counts, alpha=alpha, dtype=torch.float64)  # (C, L + 1), rel(0) = 0
        pair_min = torch.minimum(table[:, :, None], table[:, None, :])  # [c, λ, l] = min(rel(λ), rel(l))
        steps = pair_min[:, :, 1:] - torch.cat([torch.zeros_like(pair_min[:, :, :1]), pair_min[:, :, 1:-1]], 2)
        rel_k = table.gather(1, lv)  # 0 on padding
        h_rank = None
        for lvl in range(1, L + 1):
            coef = steps[:, :, lvl - 1].gather(1, lv)
            cum_ge = threshold(lvl).cum  # cached: never modified in place
            h_rank = coef.mul_(cum_ge) if h_rank is None else h_rank.addcmul_(cum_ge, coef)
        num = h_rank.mul_(inv).sum(1)
        den = rel_k.sum(1)
        out["h_ap"] = _nan_where_empty(num / torch.where(den > 0, den, torch.ones_like(den)), den)
    if "sum_w_ap" in want:
        w = _check_weights(level_weights, L, device)
        num = torch.zeros(C, dtype=torch.float64, device=device)
        den = torch.zeros_like(num)
        for m in range(1, L + 1):
            th = threshold(m)
            has = th.n_pos > 0
            num += torch.where(has, w[m - 1] * th.cprec[:, -1] / _f64(th.n_pos).clamp_min(1), torch.zeros_like(num))
            den += torch.where(has, w[m - 1], torch.zeros_like(den))
        out["sum_w_ap"] = nan_empty(num / torch.where(den > 0, den, torch.ones_like(den)), den)
    if "ndcg" in want:
        # lookup tables instead of per-slot pow / log2: gains 2^l - 1 (0 on padding), discounts 1 / log2(1 + p)
        gain = (2.0 ** torch.arange(L + 1, device=device, dtype=torch.float64) - 1.0).take(lv)
        ranks_p = torch.arange(int(positions.max()) + 1, device=device, dtype=torch.float64)
        disc = (1.0 / torch.log2(1.0 + ranks_p.clamp_min(1))).take(positions)
        dcg = gain.mul_(disc).sum(1)
        out["ndcg"] = _ndcg_from_dcg(dcg, counts, L, P)
    if "asi" in want:
        out["asi"] = _asi_fused(lv, positions, counts, L)
    return out


def _ndcg_from_dcg(dcg: Tensor, counts: Tensor, L: int, P: int) -> Tensor:
    """NDCG from the DCG of the ranking and the ideal DCG of the level counts (levels in decreasing order)."""
    device = dcg.device
    n_rel = counts[:, 1:].sum(1)
    ideal_disc = 1.0 / torch.log2(torch.arange(2, P + 2, device=device, dtype=torch.float64))
    D = torch.cat([torch.zeros(1, device=device, dtype=torch.float64), ideal_disc.cumsum(0)])
    idcg = torch.zeros_like(dcg)
    start = torch.zeros_like(n_rel)
    for lvl in range(L, 0, -1):
        n_l = counts[:, lvl]
        idcg += (2.0**lvl - 1.0) * (D[(start + n_l).clamp_max(P)] - D[start.clamp_max(P)])
        start = start + n_l
    return _nan_where_empty(dcg / torch.where(idcg > 0, idcg, torch.ones_like(idcg)), n_rel)


def _asi_fused(lv: Tensor, positions: Tensor, counts: Tensor, L: int) -> Tensor:
    """ASI (see :func:`asi_from_ranks`) from one ``(Q, P + 1)`` map position -> level and int32 prefix sums.

    ``c_{>=l}(n)``, the items of level ``>= l`` within the first ``n`` positions, is a prefix sum over positions; the
    finest level needs no ``min`` with the ideal count (``c_L(n) <= min(n, |Ω^(L)|)`` always).
    """
    C, P = lv.shape
    device = lv.device
    n_plus = counts[:, 1:].sum(1)
    inside = (lv > 0) & (positions <= n_plus[:, None])  # only positions <= N⁺ <= P matter
    # level of the relevant item at each position 1..P (positions are distinct; column P collects the rest)
    level_at = torch.zeros(C, P + 1, dtype=torch.int8, device=device)
    level_at.scatter_(1, (positions - 1).masked_fill_(~inside, P), lv.to(torch.int8).masked_fill_(~inside, 0))
    level_at = level_at[:, :P]
    n = torch.arange(1, P + 1, device=device, dtype=torch.int32)
    total = None
    above = torch.zeros_like(n_plus)  # relevant items of higher level (ranked first in the ideal order)
    prev = None
    for lvl in range(L, 0, -1):
        cum_ge = (level_at >= lvl).cumsum(1, dtype=torch.int32)  # items of level >= lvl within the first n
        c = cum_ge if prev is None else cum_ge - prev
        prev = cum_ge
        n_l = counts[:, lvl]
        if lvl == L:
            total = c.clone()
        else:
            c_star = (n[None, :] - above[:, None].int()).clamp_min_(0)
            total += torch.minimum(c, torch.minimum(c_star, n_l[:, None].int(), out=c_star))
        above = above + n_l
    ratio = _f64(total).div_(_f64(n)[None, :]).masked_fill_(n[None, :] > n_plus[:, None], 0.0)
    return _nan_where_empty(ratio.sum(1) / n_plus.clamp_min(1), n_plus)


def _check_weights(weights: Tensor | list[float] | None, L: int, device: torch.device) -> Tensor:
    w = (
        torch.full((L,), 1.0 / L, dtype=torch.float64)
        if weights is None
        else torch.as_tensor(weights, dtype=torch.float64)
    )
    w = w.to(dtype=torch.float64, device=device)
    if w.shape != (L,) or bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError(f"weights must be {L} finite non-negative numbers (w_1..w_L, w_L = finest); got {w.tolist()}")
    return w


def _hap_with_table(ranks: RetrievalRanks, table: Tensor, threshold=None) -> Tensor:
    """H-AP from a ``(Q, L + 1)`` float64 relevance table (column 0 ignored)."""
    L = ranks.num_levels
    lv = ranks.levels
    table = torch.cat([torch.zeros_like(table[:, :1]), table[:, 1:]], 1)
    rel_k = table.gather(1, lv)
    h_rank = torch.zeros_like(rel_k)
    prev = None
    for lvl in range(L, 0, -1):
        if threshold is not None:
            cum_ge = threshold(lvl).cum[:, 1:]
        else:
            cum_ge = _f64((lv >= lvl).long().cumsum(1))
        cum = cum_ge if prev is None else cum_ge - prev  # items of level exactly lvl ranked at or before
        prev = cum_ge
        h_rank += cum * torch.minimum(rel_k, table[:, lvl : lvl + 1])
    valid = lv > 0
    position = torch.where(valid, _f64(ranks.positions), torch.full_like(rel_k, float("inf")))
    num = (torch.where(valid, h_rank, torch.zeros_like(h_rank)) / position).sum(1)
    den = (rel_k * valid).sum(1)
    return _nan_where_empty(num / torch.where(den > 0, den, torch.ones_like(den)), den)


# ----------------------------------------------------------------------------------------------------------------
# public one-call functions


def average_precision(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """Average precision per query ``(Q,)``; positives are the items at level ``>= min_level`` (default ``L``).

    ``AP = (1/|Ω⁺|) Σ_{k∈Ω⁺} rank⁺(k) / rank(k)`` in the pessimistic order; NaN for queries without positives.
    """
    return ap_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), min_level)


def map_at_r(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """mAP@R per query ``(Q,)`` (Musgrave et al., "A Metric Learning Reality Check"); NaN without positives."""
    return map_at_r_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), min_level)


def map_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """mAP@k per query ``(Q,)`` (sum of precisions at the positives within the top ``k``, over ``min(R, k)``)."""
    return map_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def recall_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """R@k per query ``(Q,)``: 1.0 if a positive is in the top ``k`` (the retrieval "recall" / hit rate)."""
    return recall_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def true_recall_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """True recall@k per query ``(Q,)``: positives in the top ``k`` / ``min(#positives, k)``."""
    return true_recall_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def precision_at_k(
    scores: Tensor,
    levels: Tensor,
    k: int,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """P@k per query ``(Q,)``: positives in the top ``k`` / ``k``."""
    return precision_at_k_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), k, min_level)


def r_precision(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    min_level: int | None = None,
) -> Tensor:
    """R-precision per query ``(Q,)``."""
    return r_precision_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), min_level)


def hierarchical_average_precision(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    relevance: Tensor | None = None,
    alpha: float = 1.0,
) -> Tensor:
    """H-AP per query ``(Q,)`` (SupRank Eq. 19); see :func:`hap_from_ranks` for ``relevance`` / ``alpha``.

    The default relevance counts ``|Ω^(l)|`` over the items kept by ``mask``; pass an explicit ``(Q, L + 1)`` table to
    use another convention (e.g. the reference code's counts, which include the query itself).
    """
    ranks = retrieval_ranks(scores, levels, mask, num_levels=num_levels)
    return hap_from_ranks(ranks, relevance=relevance, alpha=alpha)


def ndcg(scores: Tensor, levels: Tensor, mask: Tensor | None = None, *, num_levels: int | None = None) -> Tensor:
    """NDCG per query ``(Q,)`` (SupRank Eq. 23, gains ``2^l − 1``, ideal DCG from the same gallery)."""
    return ndcg_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels))


def asi(scores: Tensor, levels: Tensor, mask: Tensor | None = None, *, num_levels: int | None = None) -> Tensor:
    """Average Set Intersection per query ``(Q,)`` (SupRank App. C-A1)."""
    return asi_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels))


def weighted_sum_ap(
    scores: Tensor,
    levels: Tensor,
    mask: Tensor | None = None,
    *,
    num_levels: int | None = None,
    weights: Tensor | list[float] | None = None,
) -> Tensor:
    """ΣwAP per query ``(Q,)``; see :func:`weighted_sum_ap_from_ranks`."""
    return weighted_sum_ap_from_ranks(retrieval_ranks(scores, levels, mask, num_levels=num_levels), weights)


def property1_hap(ranks: RetrievalRanks, weights: Tensor | list[float]) -> Tensor:
    """H-AP with the Property-1 relevance of ``weights`` (equals :func:`weighted_sum_ap_from_ranks`)."""
    return hap_from_ranks(ranks, relevance=property1_relevance(ranks.counts, weights, dtype=torch.float64))
