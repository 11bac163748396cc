"""Shared plumbing of the hierarchical rank losses (Sup-H-AP / HAPPIER, Sup-NDCG / ROD-NDCG).

Labels: ``(N, L)`` integers (column 0 finest), or ``(N,)`` fine labels with ``hierarchy=`` (identical results);
1-D labels without a hierarchy raise ``ValueError`` (a deliberate single level is ``labels[:, None]``).
"""

from __future__ import annotations

from torch import Tensor

from .._validation import check_choice, check_positive_int
from ..relevance import Hierarchy, as_hierarchy, hierarchical_label_pair, level_matrix
from ._inputs import RankInputs, require_hierarchy
from ._multilabel import multilabel_levels
from ._suprank_step import SupRankStepMixin, pop_step_options
from .base_rank_loss import BaseRankLoss

__all__ = ["RELEVANCES", "HierarchicalRankLoss"]

RELEVANCES = ("levels", "multilabel")  # the relevance= choices of the hierarchical losses


class HierarchicalRankLoss(SupRankStepMixin, BaseRankLoss):
    """Base class of the hierarchical SupRank losses: resolves the labels into levels (or per-query levels and their
    relevance ``rel (B, K + 1)``, :func:`~pml_suprank.losses._multilabel.multilabel_levels`). Subclasses implement
    :meth:`query_scores` ``(scores, levels, valid, num_levels, rel, dense) -> (score (B,), has_pos (B,))`` (``rel``
    ``None`` for ``"levels"``); the per-query loss is ``1 − score`` over the queries with at least one relevant item.

    Args:
        hierarchy: ``None``, a :class:`~pml_suprank.relevance.Hierarchy` or a ``(num_fine, L)`` integer table
            (row ``f`` = ``[f, parent, ..., root]``); required to use 1-D fine labels with ``L > 1`` levels.
        relevance: ``"levels"`` (default) or ``"multilabel"`` (``(B, M)`` fine-label sets padded with ``-1``).
        include_self: keep the query as its own (finest-level) item when the reference set is the batch.
        chunk_size: window elements enumerated at once by the sorted kernel (memory/speed only; ``None``: the
            device's default, :data:`~pml_suprank.ranking.hierarchical.WINDOW_CHUNK_ELEMENTS` on the CPU).
        **kwargs: the SupRank step ``H⁻`` (SupRank Eq. 4, :class:`~pml_suprank.ranking.SupRankStep`): ``tau``
            (0.01; alias ``temperature``), ``rho``, ``delta``, ``start``, ``offset``; ``kernel`` and the
            :class:`~pml_suprank.losses.BaseRankLoss` / PML options.
    """

    allow_2d_labels = True
    kernels = ("auto", "dense", "sorted")

    def __init__(
        self,
        hierarchy: Hierarchy | Tensor | None = None,
        include_self: bool = False,
        chunk_size: int | None = None,
        relevance: str = "levels",
        **kwargs,
    ):
        step_options = pop_step_options(type(self).__name__, kwargs)
        relevance = check_choice("relevance", relevance, RELEVANCES)
        super().__init__(include_self=include_self, **kwargs)
        self.relevance = relevance
        self.hierarchy = as_hierarchy(hierarchy)
        self.init_step(**step_options)
        self.chunk_size = check_positive_int("chunk_size", chunk_size, allow_none=True)

    def hierarchical_labels(self, inputs: RankInputs) -> tuple[Tensor, Tensor, int]:
        """``(B, L)`` query labels, ``(N, L)`` reference labels and ``L``, checked to form one tree together.

        Raises:
            ValueError: 1-D labels without ``hierarchy`` (:func:`~pml_suprank.losses._inputs.require_hierarchy`),
                different numbers of levels, or (without ``hierarchy``) not one tree.
        """
        labels, ref_labels = inputs.labels, inputs.ref_labels
        require_hierarchy(type(self).__name__, labels, self.hierarchy)  # ref_labels have the shape of labels
        same_source = inputs.same_source or ref_labels is labels
        levels, ref_levels = hierarchical_label_pair(
            labels,
            ref_labels,
            self.hierarchy,
            names=("labels", "ref_labels"),
            same_source=same_source,
            check_jointly=True,
        )
        return levels, ref_levels, int(levels.shape[1])

    def query_scores(
        self, scores: Tensor, levels: Tensor, valid: Tensor, num_levels: int, rel: Tensor | None, dense: bool
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        if self.relevance == "multilabel":
            levels, rel, num_levels = multilabel_levels(inputs.labels, inputs.ref_labels, self.hierarchy, inputs.valid)
        else:
            labels, ref_labels, num_levels = self.hierarchical_labels(inputs)
            levels, rel = level_matrix(labels, ref_labels, tree=True), None  # hierarchical_labels checked the tree
        dense = self.resolved_kernel(inputs, levels=max(num_levels, 1)) == "dense"
        score, has_pos = self.query_scores(inputs.scores, levels, inputs.valid, num_levels, rel, dense)
        return 1.0 - score, has_pos  # all rows and the kept mask: the base reduces without nonzero
