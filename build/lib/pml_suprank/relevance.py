"""Label hierarchies and the level matrix.

Conventions:
    * Hierarchical labels have shape ``(N, L)``: column 0 is the finest level, column ``L - 1`` the coarsest
      (the order of PML's ``HierarchicalSampler``).
    * A hierarchy may also be given as a fine -> ancestors table of shape ``(num_fine, L)`` whose row ``f``
      is ``[f, parent(f), ..., root-level ancestor(f)]``; 1-D fine labels are expanded through it.
    * The hierarchy must be a tree: a fine label has exactly one ancestor per level.
    * The level of a reference item ``j`` for a query ``q`` (HAPPIER, Sec. 3 / SupRank Eq. 18) is the number of
      levels at which they agree, counted from the coarsest: ``L`` = same fine class, ``0`` = negative.

Relevance functions built on the level matrix (H-AP "pop" relevance, Property-1 weights, NDCG gains) live
further down in this module.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import check_labels

__all__ = [
    "Hierarchy",
    "ideal_dcg",
    "as_hierarchical_labels",
    "as_hierarchy",
    "check_tree",
    "level_counts",
    "level_matrix",
    "ndcg_gain",
    "pop_relevance",
    "property1_relevance",
]


def check_tree(labels: Tensor, name: str = "labels") -> None:
    """Raise ``ValueError`` if 2-D ``labels`` ``(N, L)`` are not tree-consistent.

    Every value of column ``c`` (``c < L - 1``) must map to exactly one value of column ``c + 1``;
    by induction every fine label then has exactly one ancestor per level.
    """
    if labels.dim() != 2:
        raise ValueError(f"{name} must have shape (N, L); got shape {tuple(labels.shape)}")
    for c in range(labels.shape[1] - 1):
        pairs = _unique_pairs(labels[:, c : c + 2].long())
        child, counts = torch.unique(pairs[:, 0], return_counts=True)
        if bool((counts > 1).any()):
            bad = int(child[counts > 1][0])
            parents = pairs[pairs[:, 0] == bad, 1].tolist()
            raise ValueError(
                f"{name} is not a tree: label {bad} of level {c} (column {c}) has several parents "
                f"{parents} in column {c + 1}; every label must have exactly one ancestor per level"
            )


def _unique_pairs(pairs: Tensor) -> Tensor:
    """Distinct rows of an ``(N, 2)`` integer tensor (sorted), through a 1-D key when it fits in int64."""
    if pairs.shape[0] == 0:
        return pairs
    lo = pairs.min(dim=0).values
    shifted = pairs - lo
    span = int(shifted[:, 1].max()) + 1
    if (int(shifted[:, 0].max()) + 1) * span >= 2**62:  # keys would overflow: fall back to row-wise unique
        return torch.unique(pairs, dim=0)
    keys = torch.unique(shifted[:, 0] * span + shifted[:, 1])
    return torch.stack([keys // span, keys % span], dim=1) + lo


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
        used = table[:, 0] >= 0
        if bool(used.any()):
            idx = torch.arange(table.shape[0], device=table.device)
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
        """Map 1-D fine labels ``(N,)`` to hierarchical labels ``(N, L)``."""
        table = self.table.to(fine.device)
        bad = (fine < 0) | (fine >= table.shape[0])
        if not bool(bad.any()):
            bad = table[fine.long(), 0] < 0
        if bool(bad.any()):
            v = int(fine[bad][0])
            raise ValueError(f"{name} contains fine label {v}, which is not in the hierarchy (num_fine={len(table)})")
        return table[fine.long()]

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
    """Return labels as a ``(N, L)`` long tensor.

    ``labels`` is either ``(N, L)`` (then ``hierarchy`` must be None or agree with it) or ``(N,)`` fine labels,
    expanded through ``hierarchy`` (a :class:`Hierarchy` or a ``(num_fine, L)`` table). Without a hierarchy,
    1-D labels are a one-level hierarchy ``(N, 1)``.
    """
    labels = check_labels(name, labels, labels.shape[0] if isinstance(labels, Tensor) and labels.dim() else -1)
    hierarchy = as_hierarchy(hierarchy)
    if labels.dim() == 1:
        return hierarchy.expand(labels, name=name) if hierarchy is not None else labels.long()[:, None]
    if hierarchy is not None:
        if labels.shape[1] != hierarchy.num_levels:
            raise ValueError(
                f"{name} has {labels.shape[1]} levels but the hierarchy has {hierarchy.num_levels}"
            )
        if not torch.equal(hierarchy.expand(labels[:, 0], name=name), labels.long()):
            raise ValueError(f"{name} (N, L) disagree with the given hierarchy table")
    elif check:
        check_tree(labels, name=name)
    return labels.long()


def level_matrix(query_labels: Tensor, ref_labels: Tensor) -> Tensor:
    """Level of every reference item for every query.

    Args:
        query_labels: ``(Q, L)`` hierarchical labels (column 0 finest).
        ref_labels: ``(N, L)`` hierarchical labels.

    Returns:
        ``(Q, N)`` int64 tensor with values in ``{0, ..., L}``: the number of consecutive agreeing levels counted
        from the coarsest. For tree-consistent labels this equals the number of equal columns.
    """
    if query_labels.dim() != 2 or ref_labels.dim() != 2 or query_labels.shape[1] != ref_labels.shape[1]:
        raise ValueError(
            "query_labels and ref_labels must have shapes (Q, L) and (N, L) with the same L; "
            f"got {tuple(query_labels.shape)} and {tuple(ref_labels.shape)}"
        )
    levels = torch.zeros(query_labels.shape[0], ref_labels.shape[0], dtype=torch.long, device=query_labels.device)
    agree = torch.ones_like(levels, dtype=torch.bool)
    for c in range(query_labels.shape[1] - 1, -1, -1):
        agree = agree & (query_labels[:, c, None] == ref_labels[None, :, c])
        levels = levels + agree.long()
    return levels


def level_counts(levels: Tensor, num_levels: int, mask: Tensor | None = None) -> Tensor:
    """Number of reference items at each level for every query.

    Args:
        levels: ``(Q, N)`` level matrix (values in ``{0..L}``).
        num_levels: ``L``.
        mask: optional ``(Q, N)`` bool, True for the reference items that count (e.g. the query itself excluded).

    Returns:
        ``(Q, L + 1)`` int64 counts ``|Ω^(l)|``.
    """
    one = torch.ones_like(levels) if mask is None else mask.long()
    out = torch.zeros(levels.shape[0], num_levels + 1, dtype=torch.long, device=levels.device)
    return out.scatter_add(1, levels, one)


def pop_relevance(counts: Tensor, alpha: float = 1.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """H-AP relevance table of SupRank Eq. 20: ``rel(l) = (l / L)^alpha / |Ω^(l)|``, ``rel(0) = 0``.

    Args:
        counts: ``(Q, L + 1)`` level counts over the reference set actually used (see :func:`level_counts`).
        alpha: ``α >= 0``; 1 for HAPPIER / H-AP, > 1 for HAPPIER_F.
        dtype: floating dtype of the result.

    Returns:
        ``(Q, L + 1)`` table; entries of empty levels are 0.
    """
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0; got {alpha}")
    num_levels = counts.shape[1] - 1
    lv = torch.arange(num_levels + 1, device=counts.device, dtype=dtype)
    w = (lv / num_levels) ** alpha
    w = torch.where(lv == 0, torch.zeros_like(w), w)
    c = counts.to(dtype)
    return torch.where(c > 0, w / c.clamp_min(1), torch.zeros_like(c))


def property1_relevance(counts: Tensor, weights: Tensor | list[float], dtype: torch.dtype = torch.float32) -> Tensor:
    """Relevance of SupRank Property 1 (supplementary Eq. 44) for which H-AP equals ΣwAP = Σ_l w_l·AP^(l).

    ``rel(l) = Σ_{p=1..l} w_p / |Ω^{+,p}|`` where ``Ω^{+,p}`` are the items at level ``>= p``.

    Args:
        counts: ``(Q, L + 1)`` level counts over the reference set.
        weights: ``L`` non-negative level weights ``w_1..w_L`` (``w_L`` = finest level).
        dtype: floating dtype of the result.

    Returns:
        ``(Q, L + 1)`` table (``rel(0) = 0``).
    """
    num_levels = counts.shape[1] - 1
    w = torch.as_tensor(weights, dtype=dtype, device=counts.device)
    if w.shape != (num_levels,):
        raise ValueError(f"weights must have {num_levels} entries (one per level 1..L); got shape {tuple(w.shape)}")
    if bool((w < 0).any()):
        raise ValueError(f"weights must be non-negative; got {w.tolist()}")
    at_least = counts.flip(1).cumsum(1).flip(1)[:, 1:].to(dtype)  # (Q, L): |Ω^{+,p}| for p = 1..L
    per_level = torch.where(at_least > 0, w / at_least.clamp_min(1), torch.zeros_like(at_least))
    rel = per_level.cumsum(1)
    return torch.cat([torch.zeros_like(rel[:, :1]), rel], dim=1)


def ndcg_gain(levels: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """NDCG gain ``2^l − 1`` of SupRank Eq. 23 for a level tensor of any shape."""
    return torch.pow(2.0, levels.to(dtype)) - 1.0


def ideal_dcg(counts: Tensor, gains: Tensor) -> Tensor:
    """Ideal DCG of SupRank Eq. 23 from per-level counts.

    Args:
        counts: ``(B, L + 1)`` number of reference items per level.
        gains: ``(L + 1,)`` or ``(B, L + 1)`` gain of each level (``2^l − 1``).

    Returns:
        ``(B,)`` ``Σ_p gain(p-th best item) / log2(1 + p)`` with the items ordered by decreasing level.
    """
    bsz, lp1 = counts.shape
    n = int(counts.sum(1).max()) if counts.numel() else 0
    dtype = gains.dtype
    disc = torch.cat(
        [
            torch.zeros(1, dtype=dtype, device=counts.device),
            torch.cumsum(1.0 / torch.log2(torch.arange(2, n + 2, dtype=dtype, device=counts.device)), 0),
        ]
    )
    gains = gains.expand(bsz, lp1)
    # decreasing level: positions [start_l, start_l + c_l) with start_L = 0
    c_desc = counts.flip(1)
    end = torch.cumsum(c_desc, 1)
    begin = end - c_desc
    per_level = disc[end] - disc[begin]
    return (per_level * gains.flip(1)).sum(1)
