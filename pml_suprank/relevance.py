"""Label hierarchies, the level matrix and the relevances built on it.

Hierarchical labels are ``(N, L)``, column 0 finest (PML's ``HierarchicalSampler`` order), or 1-D fine labels
expanded through a ``(num_fine, L)`` fine → ancestors table (row ``f`` = ``[f, parent(f), ..., coarsest]``); the
hierarchy must be a tree. The level of a reference for a query (HAPPIER Sec. 3 / SupRank Eq. 18) is the number of
levels at which they agree, from the coarsest (``L`` = same fine class, ``0`` = negative). Built on it: the H-AP
"pop" relevance, Property-1 weights, NDCG gains, and the multi-label relevance (:func:`multilabel_relevance`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._async_check import check_async, check_value
from ._validation import check_labels, check_positive_int

__all__ = [
    "Hierarchy",
    "ideal_dcg",
    "as_hierarchy",
    "check_tree",
    "hierarchical_label_pair",
    "level_counts",
    "level_matrix",
    "multilabel_relevance",
    "pop_relevance",
    "property1_relevance",
]


PAIRWISE_TREE_CHECK = 2**24  # N² · L up to which check_tree compares all pairs (one fused op) instead of sorting


def tree_consistent(labels: Tensor, name: str = "labels") -> Tensor:
    """0-d bool tensor, True iff ``labels`` ``(N, L)`` are tree-consistent (rows agreeing in column ``c`` agree in
    column ``c + 1``), without host synchronisation. ``TypeError`` / ``ValueError``: not a 2-D integer tensor."""
    if (
        not isinstance(labels, Tensor)
        or labels.is_floating_point()
        or labels.is_complex()
        or labels.dtype == torch.bool
    ):
        raise TypeError(
            f"{name} must be an integer torch.Tensor of shape (N, L); got {getattr(labels, 'dtype', labels)}"
        )
    if labels.dim() != 2:
        raise ValueError(f"{name} must have shape (N, L); got shape {tuple(labels.shape)}")
    num, width = labels.shape
    if width < 2 or num < 2:
        return torch.ones((), dtype=torch.bool, device=labels.device)
    if num * num * width <= PAIRWISE_TREE_CHECK:
        agree = labels.unsqueeze(1) == labels.unsqueeze(0)  # (N, N, L)
        return (agree[:, :, :-1] <= agree[:, :, 1:]).all()  # agreeing in column c implies agreeing in c + 1
    bad = torch.zeros((), dtype=torch.bool, device=labels.device)
    for c in range(width - 1):
        child, parent = labels[:, c], labels[:, c + 1]
        order = torch.argsort(parent, stable=True)
        order = order[torch.argsort(child[order], stable=True)]  # by (child, parent)
        child, parent = child[order], parent[order]
        bad = bad | ((child[1:] == child[:-1]) & (parent[1:] != parent[:-1])).any()
    return ~bad


def check_tree(labels: Tensor, name: str = "labels") -> None:
    """Raise ``ValueError`` (naming the label with several parents) if ``labels`` ``(N, L)`` are not a tree
    (:func:`pml_suprank._async_check.check_async`: a device-side assertion on accelerators)."""
    check_async(
        tree_consistent(labels, name),
        lambda: _tree_error(labels, name),
        f"{name} is not a tree: a label has several parents (pml_suprank.relevance.check_tree)",
    )


def _tree_error(labels: Tensor, name: str) -> ValueError:
    """The ``ValueError`` naming the first label with several parents (failure path only: reads the data)."""
    for c in range(labels.shape[1] - 1):
        pairs = torch.unique(labels[:, c : c + 2], dim=0)
        child, counts = torch.unique(pairs[:, 0], return_counts=True)
        if bool((counts > 1).any()):
            bad = int(child[counts > 1][0])
            parents = pairs[pairs[:, 0] == bad, 1].tolist()
            return ValueError(
                f"{name} is not a tree: label {bad} of level {c} (column {c}) has several parents "
                f"{parents} in column {c + 1}; every label must have exactly one ancestor per level"
            )
    return ValueError(f"{name} is not a tree")


class Hierarchy:
    """A label tree stored as a fine -> ancestors table.

    Args:
        table: Integer tensor ``(num_fine, L)``; row ``f`` is ``[f, ancestor at level 1, ..., coarsest ancestor]``.
            Rows of unused fine labels may be filled with ``-1``.
    """

    def __init__(self, table: Tensor) -> None:
        table = torch.as_tensor(table)
        check_labels("hierarchy", table, table.shape[0] if table.dim() else 0, allow_2d=True, n_name="num_fine")
        if table.dim() == 1:
            table = table[:, None]
        used, idx = table[:, 0] >= 0, torch.arange(table.shape[0], device=table.device)
        wrong = used & (table[:, 0] != idx)
        if bool(wrong.any()):
            f = int(idx[wrong][0])
            raise ValueError(
                f"hierarchy row f must start with the fine label f itself; row {f} starts with {int(table[f, 0])}"
            )
        if bool((table[used] < 0).any()):
            f = int(idx[used & (table < 0).any(1)][0])
            raise ValueError(f"hierarchy row {f} has a negative ancestor: {table[f].tolist()}")
        check_tree(table[used], name="hierarchy")
        self.table = table.long()

    @property
    def num_levels(self) -> int:
        """Number of label columns ``L`` (fine level included)."""
        return int(self.table.shape[1])

    @classmethod
    def from_labels(cls, labels: Tensor) -> Hierarchy:
        """Build the table from tree-consistent non-negative 2-D labels ``(N, L)``."""
        labels = check_labels("labels", labels, labels.shape[0] if isinstance(labels, Tensor) else -1)
        if labels.dim() != 2:
            raise ValueError(f"labels must have shape (N, L) to build a hierarchy; got shape {tuple(labels.shape)}")
        if bool((labels < 0).any()):
            raise ValueError("labels must be non-negative to build a hierarchy table")
        check_tree(labels)
        rows = torch.unique(labels, dim=0).long()
        table = torch.full((int(rows[:, 0].max()) + 1, labels.shape[1]), -1, dtype=torch.long, device=labels.device)
        table[rows[:, 0]] = rows
        return cls(table)

    def expand(self, fine: Tensor, name: str = "labels") -> Tensor:
        """Map 1-D fine labels ``(N,)`` to ``(N, L)``; ``ValueError`` naming a label outside the table
        (:func:`~pml_suprank._async_check.check_value`: in-graph while ``torch.compile`` traces)."""
        table = self.table.to(fine.device)
        idx = fine.long()
        num_fine = table.shape[0]
        known = (idx >= 0) & (idx < num_fine)
        if num_fine:
            known = known & (table[idx.clamp(0, num_fine - 1), 0] >= 0)

        def error() -> ValueError:
            v = int(fine[~known][0])
            return ValueError(f"{name} contains fine label {v}, which is not in the hierarchy (num_fine={num_fine})")

        check_value(known.all(), error, f"{name} contains a fine label that is not in the hierarchy")
        return table[idx]

    def to(self, device: torch.device | str) -> Hierarchy:
        return Hierarchy(self.table.to(device))

    def __repr__(self) -> str:
        return f"Hierarchy(num_fine={self.table.shape[0]}, num_levels={self.num_levels})"


def as_hierarchy(hierarchy: Hierarchy | Tensor | None, name: str = "hierarchy") -> Hierarchy | None:
    """Return ``hierarchy`` as a :class:`Hierarchy` (None stays None; a ``(num_fine, L)`` table is wrapped)."""
    if hierarchy is None or isinstance(hierarchy, Hierarchy):
        return hierarchy
    if not isinstance(hierarchy, Tensor):
        raise TypeError(
            f"{name} must be None, a pml_suprank.relevance.Hierarchy or a (num_fine, L) integer tensor; "
            f"got {type(hierarchy).__name__}"
        )
    return Hierarchy(hierarchy)


def as_hierarchical_labels(
    labels: Tensor, hierarchy: Hierarchy | Tensor | None = None, name: str = "labels", check: bool = True
) -> Tensor:
    """``labels`` as ``(N, L)`` long: ``(N, L)`` as given (agreeing with ``hierarchy`` if one is given), ``(N,)`` fine
    labels expanded through ``hierarchy`` (a :class:`Hierarchy` or ``(num_fine, L)`` table), else ``(N, 1)``."""
    labels = check_labels(name, labels, labels.shape[0] if isinstance(labels, Tensor) and labels.dim() else -1)
    hierarchy = as_hierarchy(hierarchy)
    if labels.dim() == 1:
        return hierarchy.expand(labels, name=name) if hierarchy is not None else labels.long()[:, None]
    if hierarchy is not None:
        if labels.shape[1] != hierarchy.num_levels:
            raise ValueError(f"{name} has {labels.shape[1]} levels but the hierarchy has {hierarchy.num_levels}")
        if not torch.equal(hierarchy.expand(labels[:, 0], name=name), labels.long()):
            raise ValueError(f"{name} (N, L) disagree with the given hierarchy table")
    elif check:
        check_tree(labels, name=name)
    return labels.long()


def hierarchical_label_pair(
    query_labels: Tensor,
    ref_labels: Tensor,
    hierarchy: Hierarchy | Tensor | None = None,
    *,
    names: tuple[str, str] = ("query_labels", "ref_labels"),
    same_source: bool = False,
    check_jointly: bool = False,
) -> tuple[Tensor, Tensor]:
    """Query and reference labels as levels ``(Q, L)`` and ``(N, L)`` (:func:`as_hierarchical_labels`).

    ``names``: the arguments' names for messages; ``same_source``: the references are the queries; ``check_jointly``:
    without ``hierarchy``, both sets must form *one* tree. ``ValueError``: different level counts, or not a tree.
    """
    q_name, r_name = names
    levels = as_hierarchical_labels(query_labels, hierarchy, name=q_name, check=not check_jointly)
    ref_levels = levels if same_source else as_hierarchical_labels(ref_labels, hierarchy, name=r_name,
                                                                   check=not check_jointly)  # fmt: skip
    if ref_levels.shape[1] != levels.shape[1]:
        raise ValueError(
            f"{q_name} and {r_name} must have the same number of levels; got {levels.shape[1]} and "
            f"{ref_levels.shape[1]}"
        )
    if check_jointly and hierarchy is None and levels.shape[1] > 1:
        both = levels if ref_levels is levels else torch.cat([levels, ref_levels])
        check_tree(both, name=f"{q_name} (queries and references together)")
    return levels, ref_levels


def level_matrix(query_labels: Tensor, ref_labels: Tensor, *, tree: bool = False) -> Tensor:
    """``(Q, N)`` int64 level in ``{0, ..., L}`` of every reference for every query: the consecutive agreeing columns
    of ``query_labels`` ``(Q, L)`` and ``ref_labels`` ``(N, L)`` from the coarsest (HAPPIER Sec. 3; ``tree=True``:
    known to be one tree, so the equal columns)."""
    if query_labels.dim() != 2 or ref_labels.dim() != 2 or query_labels.shape[1] != ref_labels.shape[1]:
        raise ValueError(
            "query_labels and ref_labels must have shapes (Q, L) and (N, L) with the same L; "
            f"got {tuple(query_labels.shape)} and {tuple(ref_labels.shape)}"
        )
    agree = query_labels.unsqueeze(1) == ref_labels.unsqueeze(0)  # (Q, N, L)
    if agree.shape[2] > 1 and not tree:
        agree = agree.flip(2).cummin(2).values  # agreeing so far, from the coarsest column
    return agree.sum(2)


def level_counts(levels: Tensor, num_levels: int, mask: Tensor | None = None) -> Tensor:
    """``(Q, L + 1)`` int64 counts ``|Ω^(l)|`` of the ``(Q, N)`` ``levels`` in ``{0..num_levels}`` where ``mask``."""
    one = torch.ones_like(levels) if mask is None else mask.long()
    out = torch.zeros(levels.shape[0], num_levels + 1, dtype=torch.long, device=levels.device)
    return out.scatter_add(1, levels, one)


def pop_relevance(counts: Tensor, alpha: float = 1.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """``(Q, L + 1)`` H-AP relevance table of SupRank Eq. 20, ``rel(l) = (l / L)^alpha / |Ω^(l)|`` (``rel(0) = 0``,
    empty levels 0), from ``counts`` ``(Q, L + 1)``; ``alpha >= 0`` (1: H-AP, > 1: HAPPIER_F)."""
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0; got {alpha}")
    num_levels = counts.shape[1] - 1
    lv = torch.arange(num_levels + 1, device=counts.device, dtype=dtype) / num_levels
    w = (lv > 0).to(dtype) if alpha == 0 else lv**alpha  # 0^0 would be 1: level 0 is never relevant
    c = counts.to(dtype)
    return torch.where(c > 0, w / c, 0.0)


def property1_relevance(counts: Tensor, weights: Tensor | list[float], dtype: torch.dtype = torch.float32) -> Tensor:
    """``(Q, L + 1)`` relevance of SupRank Property 1 (supplementary Eq. 44), for which H-AP equals ΣwAP =
    Σ_l w_l·AP^(l): ``rel(l) = Σ_{p=1..l} w_p / |Ω^{+,p}|`` (``Ω^{+,p}``: items at level ``>= p``; ``rel(0) = 0``),
    from ``counts`` ``(Q, L + 1)`` and ``L`` non-negative ``weights`` ``w_1..w_L`` (``w_L`` = finest level)."""
    num_levels = counts.shape[1] - 1
    w = torch.as_tensor(weights, dtype=dtype, device=counts.device)
    if w.shape != (num_levels,):
        raise ValueError(f"weights must have {num_levels} entries (one per level 1..L); got shape {tuple(w.shape)}")
    check_value(
        (w >= 0).all(),
        lambda: ValueError(f"weights must be non-negative; got {w.tolist()}"),
        "property1_relevance: weights must be non-negative",
    )
    at_least = counts.flip(1).cumsum(1).flip(1)[:, 1:].to(dtype)  # (Q, L): |Ω^{+,p}| for p = 1..L
    per_level = torch.where(at_least > 0, w / at_least.clamp_min(1), torch.zeros_like(at_least))
    rel = per_level.cumsum(1)
    return torch.cat([torch.zeros_like(rel[:, :1]), rel], dim=1)


def ideal_dcg(counts: Tensor, gains: Tensor, num_items: int | None = None) -> Tensor:
    """``(B,)`` ideal DCG of SupRank Eq. 23, ``Σ_p gain(p-th best item) / log2(1 + p)`` (items by decreasing level),
    from ``counts`` ``(B, L + 1)`` and ``gains`` ``(L + 1,)`` / ``(B, L + 1)`` (``2^l − 1``). ``num_items``: an upper
    bound of ``counts.sum(1)`` (a fixed-length discount table, no host read); ``None``: the largest row total."""
    if num_items is None:
        num_items = int(counts.sum(1).max()) if counts.numel() else 0
    steps = 1.0 / torch.log2(torch.arange(2, num_items + 2, dtype=gains.dtype, device=counts.device))
    disc = torch.cat([steps.new_zeros(1), torch.cumsum(steps, 0)])  # disc[p] = Σ_{i <= p} 1 / log2(1 + i)
    c_desc = counts.flip(1)  # decreasing level: positions [end - count, end)
    end = torch.cumsum(c_desc, 1)
    return ((disc[end] - disc[end - c_desc]) * gains.expand(counts.shape).flip(1)).sum(1)


# hierarchical multi-label relevance (Ramzi, PhD thesis, Sec. 4.2.2.2 "trademark logo retrieval", Algorithm 1)

MULTILABEL_BLOCK = 2**22  # elements of the (C, R, M_q, M_r) work tensor of one block of multilabel_relevance


def check_multilabel(name: str, labels: object) -> Tensor:
    """``labels`` as an ``(N, M)`` long tensor of label sets (``-1`` = padding; every row has a label)."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor of shape (N, M); got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype (e.g. torch.long); got dtype {labels.dtype}")
    if labels.dim() == 1:
        labels = labels[:, None]
    if labels.dim() != 2 or labels.shape[1] == 0:
        raise ValueError(f"{name} must have shape (N,) or (N, M) with M >= 1; got shape {tuple(labels.shape)}")
    labels = labels.long()
    if labels.numel() and bool((labels < -1).any()):
        row = int((labels < -1).any(1).nonzero()[0, 0])
        raise ValueError(
            f"{name} row {row} holds {labels[row].tolist()}: {name} must hold labels >= 0 and -1 for padding; "
            f"got the value {int(labels.min())}"
        )
    empty = (labels < 0).all(1)
    if bool(empty.any()):
        row = int(empty.nonzero()[0, 0])
        raise ValueError(f"{name} row {row} has no label (only -1 padding); every item needs at least one label")
    return labels


def dedupe_label_sets(labels: Tensor) -> Tensor:
    """Sort each row and turn repeated labels into padding: a row is a *set* of labels."""
    s = labels.sort(dim=1).values
    dup = torch.zeros_like(s, dtype=torch.bool)
    dup[:, 1:] = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    return s.masked_fill(dup, -1)


def label_ancestors(labels: Tensor, table: Tensor | None, name: str) -> Tensor:
    """``(N, M, L)`` ancestors of every label (``-1`` rows for padding) through the ``(num_fine, L)`` table."""
    if table is None:
        return labels[:, :, None]
    used = labels >= 0
    bad = used & (labels >= table.shape[0])
    if not bool(bad.any()):
        bad = used & (table[labels.clamp_min(0).clamp_max(table.shape[0] - 1), 0] < 0)
    if bool(bad.any()):
        v = int(labels[bad][0])
        raise ValueError(f"{name} contains fine label {v}, which is not in the hierarchy (num_fine={len(table)})")
    anc = table[labels.clamp_min(0)]
    return anc.masked_fill(~used[:, :, None], -1)


def multilabel_relevance(
    query_labels: Tensor,
    ref_labels: Tensor,
    hierarchy: Hierarchy | Tensor | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    block_elements: int = MULTILABEL_BLOCK,
) -> Tensor:
    """``(Q, R)`` hierarchical multi-label relevance in ``[0, 1]`` of every reference item for every query (E. Ramzi's
    PhD thesis, Algorithm 1, Sec. 4.2.2.2; multi-label HAPPIER: Sec. 6.2.1), on ``query_labels``' device. For a query
    with the label set ``{y_q^1..y_q^n}`` and an item with ``{y_k^1..y_k^m}``::

        l*_i = L − min_j LCA(y_q^i, y_k^j)          rel(q, k) = Σ_i l*_i / (n · L)

    ``LCA(a, b)``: the first level (column, 0 = finest) at which the ancestors of ``a`` and ``b`` agree (``L`` when
    none); with ``L = 1``, the fraction of the query's labels the item has. H-AP with it:
    :func:`pml_suprank.metrics.functional.graded_average_precision`.

    Args:
        query_labels, ref_labels: ``(Q, M_q)`` / ``(R, M_r)`` (or 1-D) integer fine-label sets, ``-1`` = padding.
        hierarchy: :class:`Hierarchy` or ``(num_fine, L)`` table; ``None`` = flat labels (``L = 1``).
        dtype: floating dtype of the result (computed in float64: equal fractions tie exactly).
        block_elements: most elements of the ``(C, R_c, M_q, M_r)`` label-pair tensor of one block.

    Raises:
        TypeError: non-integer labels, a hierarchy of another type, a non-floating ``dtype``.
        ValueError: a label below ``-1``, a row without labels, a label missing from the hierarchy, a hierarchy that
            is not a tree, a non-positive ``block_elements``.
    """
    q = dedupe_label_sets(check_multilabel("query_labels", query_labels))
    r = check_multilabel("ref_labels", ref_labels).to(q.device)
    hierarchy = as_hierarchy(hierarchy)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype; got {dtype!r}")
    check_positive_int("block_elements", block_elements)
    table = None if hierarchy is None else hierarchy.table.to(q.device)
    L = 1 if table is None else int(table.shape[1])
    qa = label_ancestors(q, table, "query_labels")  # (Q, M_q, L)
    ra = label_ancestors(r, table, "ref_labels")  # (R, M_r, L)
    q_used, r_used = q >= 0, r >= 0
    denom = q_used.sum(1, dtype=torch.float64) * L  # n_q · L
    Q, Mq = q.shape
    R, Mr = r.shape
    pair = Mq * Mr
    ref_block = max(1, min(R, block_elements // pair)) if R else 1
    query_block = max(1, block_elements // (pair * ref_block))
    out = torch.empty(Q, R, dtype=dtype, device=q.device)
    for i in range(0, Q, query_block):
        for j in range(0, R, ref_block):
            qi, rj = slice(i, i + query_block), slice(j, j + ref_block)
            num = _lca_block_sum(qa[qi], q_used[qi], ra[rj], r_used[rj])
            out[qi, rj] = (num / denom[qi, None]).to(dtype)
    return out


def _lca_block_sum(qa: Tensor, q_used: Tensor, ra: Tensor, r_used: Tensor) -> Tensor:
    """``Σ_i (L − min_j LCA(y_q^i, y_k^j))`` ``(C, R_c)`` float64 for ancestors ``qa`` ``(C, M_q, L)``, ``ra``
    ``(R_c, M_r, L)``: ``L − LCA`` = agreeing columns from the coarsest; padding pairs count 0."""
    L = qa.shape[2]
    small = torch.uint8 if L < 256 else torch.long
    agree = None
    depth = None
    for c in range(L - 1, -1, -1):
        eq = qa[:, None, :, None, c] == ra[None, :, None, :, c]
        agree = eq if agree is None else agree.logical_and_(eq)
        depth = agree.to(small) if depth is None else depth.add_(agree)
    valid = q_used[:, None, :, None] & r_used[None, :, None, :]
    best = depth.masked_fill(~valid, 0).amax(3)  # (C, R_c, M_q): L − min_j LCA
    return best.sum(2, dtype=torch.float64)
