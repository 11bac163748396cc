"""Score-sorted level sets of the hierarchical rank kernel (SupRank, Ramzi et al., TPAMI 2025, Eq. 21).

:class:`SortedLevels` holds, for every query, each ``A_l = {valid j : T_j < l}`` (``l = 1..L+1``) sorted by score
with counts and float64 prefix sums: counts and score sums above ``x`` by one ``searchsorted`` and one ``gather``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["SortedLevels", "sort_levels"]


class SortedLevels(NamedTuple):
    """The sets ``A_l``, ``l = 1..L+1``, of every query sorted by score; lists indexed by ``l − 1``.

    Attributes:
        keys: ``L + 1`` tensors ``(B, N)``: member scores sorted ascending (detached, dtype of the scores), ``+inf``
            past the ``|A_l|`` members.
        counts: ``L + 1`` tensors ``(B, 1)`` long: ``|A_l|``.
        prefix_sums: ``L + 1`` tensors ``(B, N + 1)`` float64: sum of the first ``p`` sorted member scores
            (differentiable w.r.t. the scores).
        member_prefix: ``L + 1`` tensors ``(B, N + 1)`` long: members of ``A_l`` among the first ``p`` items of
            ``A_{L+1}``'s sorted order.
    """

    keys: list[Tensor]
    counts: list[Tensor]
    prefix_sums: list[Tensor]
    member_prefix: list[Tensor]

    @property
    def num_levels(self) -> int:
        """``L``."""
        return len(self.keys) - 1

    def search(self, x: Tensor, right: bool) -> Tensor:
        """Positions ``(B, N)`` of the thresholds ``x`` ``(B, N)`` in the sorted list of all valid items
        ``A_{L+1}``: the number of its items ``< x`` (``<= x`` when ``right``). One search serves every level
        (:meth:`members_before`)."""
        return torch.searchsorted(self.keys[-1], x.contiguous(), right=right)

    def members_before(self, level: int, position: Tensor) -> Tensor:
        """``(B, N)`` number of items of ``A_level`` before ``position`` (from :meth:`search`) in ``A_{L+1}``: the
        position of ``x`` in sorted ``A_level`` itself."""
        return torch.gather(self.member_prefix[level - 1], 1, position)

    def count_and_sum(self, level: int, lo: Tensor | None, hi: Tensor | None) -> tuple[Tensor, Tensor]:
        """Count and float64 score sum of the members of sorted ``A_level`` at positions ``[lo, hi)`` (``(B, N)``
        each; ``None``: the start / the end of the members); an empty range when ``hi < lo``."""
        ref = self.counts[level - 1]
        lo_i = torch.zeros_like(hi if hi is not None else lo) if lo is None else lo
        hi_i = ref.expand_as(lo_i) if hi is None else hi
        hi_i = torch.maximum(hi_i, lo_i)
        table = self.prefix_sums[level - 1]
        return (hi_i - lo_i).to(torch.float64), torch.gather(table, 1, hi_i) - torch.gather(table, 1, lo_i)


def sort_levels(
    scores: Tensor, levels: Tensor, valid: Tensor, num_levels: int, s64: Tensor | None = None
) -> SortedLevels:
    """Sort ``A_l = {valid j : T_j < l}`` (``l = 1..L+1``) of every query by score: ``scores`` (differentiable
    through the prefix sums), ``levels`` (long, ``{0..L}``) and ``valid`` (bool) ``(B, N)``; ``s64``: the scores in
    float64 if the caller has them. Cost ``O(L · B · N log N)``, memory ``O(L · B · N)``."""
    bsz = scores.shape[0]
    acc = torch.float64
    s_det = scores.detach()
    s64 = scores.to(acc) if s64 is None else s64
    inf = torch.tensor(float("inf"), dtype=scores.dtype, device=scores.device)
    zero64 = torch.zeros(bsz, 1, dtype=acc, device=scores.device)
    keys, counts, prefix_sums = [], [], []
    for l in range(1, num_levels + 2):
        member = valid & (levels < l)
        key, perm = torch.sort(torch.where(member, s_det, inf), dim=1)  # invalid / excluded items last as +inf
        member_sorted = torch.gather(member, 1, perm)
        s64_sorted = torch.gather(s64, 1, perm)
        keys.append(key)
        counts.append(member.sum(1, keepdim=True))
        vals = torch.where(member_sorted, s64_sorted, 0.0)
        prefix_sums.append(torch.cat([zero64, torch.cumsum(vals, 1)], 1))  # (B, N + 1)
    # #{j ∈ A_l : key_j < x} = number of A_l members among the items of A_{L+1} scored below x (same comparisons)
    levels_sorted, valid_sorted = torch.gather(levels, 1, perm), torch.gather(valid, 1, perm)
    zero_col = torch.zeros(bsz, 1, dtype=torch.long, device=scores.device)
    member_prefix = [
        torch.cat([zero_col, torch.cumsum((valid_sorted & (levels_sorted < l)).long(), 1)], 1)
        for l in range(1, num_levels + 2)
    ]
    return SortedLevels(keys, counts, prefix_sums, member_prefix)
