"""Shared plumbing of the hierarchical rank losses (Sup-H-AP / HAPPIER, Sup-NDCG / ROD-NDCG).

Labels (DESIGN.md §2): ``(N, L)`` integer labels with column 0 the finest and column ``L − 1`` the coarsest, or
``(N,)`` fine labels together with ``hierarchy=`` (a :class:`pml_suprank.relevance.Hierarchy` or a
``(num_fine, L)`` fine → ancestors table). Both give identical results; the 1-D path is the one that works inside
PML's ``CrossBatchMemory``, ``DistributedLossWrapper`` and trainers (PML only passes 1-D labels around). 1-D labels
without a hierarchy are a one-level hierarchy (the losses then reduce to their flat counterparts).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..hierarchical_ranking import _CHUNK
from ..ranking import SupRankStep
from ..relevance import Hierarchy, as_hierarchical_labels, as_hierarchy, check_tree, level_matrix
from .base_rank_loss import BaseRankLoss, RankInputs

__all__ = ["HierarchicalRankLoss"]


class HierarchicalRankLoss(BaseRankLoss):
    """Base class of the hierarchical SupRank losses: resolves the labels into levels and calls a per-query score.

    Subclasses implement :meth:`query_scores` ``(scores, levels, valid, num_levels) -> (score (B,), has_pos (B,))``;
    the per-query loss is ``1 − score`` over the queries with at least one relevant item.

    Args:
        hierarchy: ``None``, a :class:`~pml_suprank.relevance.Hierarchy` or a ``(num_fine, L)`` integer table
            (row ``f`` = ``[f, parent, ..., root]``); required to use 1-D fine labels with ``L > 1`` levels.
        tau, rho, delta, start, offset: the SupRank step ``H⁻`` (SupRank Eq. 4,
            :class:`~pml_suprank.ranking.SupRankStep`).
        include_self: keep the query as its own (finest-level) item when the reference set is the batch.
        chunk_size: window elements enumerated at once by the rank kernel (memory/speed only).
        **kwargs: :class:`~pml_suprank.losses.BaseRankLoss` / PML options.
    """

    allow_2d_labels = True

    def __init__(
        self,
        hierarchy: Hierarchy | Tensor | None = None,
        tau: float = 0.01,
        rho: float = 100.0,
        delta: float = 0.05,
        start: float = 0.5,
        offset: float | None = None,
        include_self: bool = False,
        chunk_size: int = _CHUNK,
        **kwargs,
    ):
        super().__init__(include_self=include_self, **kwargs)
        self.hierarchy = hierarchy = as_hierarchy(hierarchy)
        self.step = SupRankStep(tau=tau, rho=rho, delta=delta, start=start, offset=offset)
        self.tau, self.rho, self.delta, self.start = self.step.tau, self.step.rho, self.step.delta, self.step.start
        self.offset = self.step.resolved_offset
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
        self.chunk_size = chunk_size

    def hierarchical_labels(self, inputs: RankInputs) -> tuple[Tensor, Tensor, int]:
        """``(B, L)`` query labels, ``(N, L)`` reference labels and ``L`` (checked to form one tree together)."""
        labels = as_hierarchical_labels(inputs.labels, self.hierarchy, name="labels", check=False)
        if inputs.same_source or inputs.ref_labels is inputs.labels:
            ref_labels = labels
        else:
            ref_labels = as_hierarchical_labels(inputs.ref_labels, self.hierarchy, name="ref_labels", check=False)
        if ref_labels.shape[1] != labels.shape[1]:
            raise ValueError(
                f"labels and ref_labels must have the same number of levels; got {labels.shape[1]} and "
                f"{ref_labels.shape[1]}"
            )
        if self.hierarchy is None and labels.shape[1] > 1:
            both = labels if ref_labels is labels else torch.cat([labels, ref_labels])
            check_tree(both, name="labels (queries and references together)")
        return labels, ref_labels, int(labels.shape[1])

    def query_scores(self, scores: Tensor, levels: Tensor, valid: Tensor, num_levels: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        labels, ref_labels, num_levels = self.hierarchical_labels(inputs)
        levels = level_matrix(labels, ref_labels)
        score, has_pos = self.query_scores(inputs.scores, levels, inputs.valid, num_levels)
        kept = torch.nonzero(has_pos, as_tuple=True)[0]
        return 1.0 - score[kept], kept
