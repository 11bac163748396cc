"""SupAP (SupRank paper Eq. 9-11): a smooth upper bound of 1 − AP, as a PML loss."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_choice
from ..ranking import SupRankStep
from ..ranking.dense import dense_query_ap, dense_query_ranks
from ..ranking.flat import heaviside_positive_count, positive_pair_groups, suprank_negative_sum
from ._inputs import RankInputs
from ._multilabel import per_label_rows
from ._suprank_step import STEP_OPTIONS, SupRankStepMixin, resolve_tau
from .base_rank_loss import BaseRankLoss
from .registry import SUPRANK_PAPER, register_loss

__all__ = [
    "MULTILABEL_MODES",
    "SupAPLoss",
    "dense_suprank_query_ranks",
    "grouped_suprank_pair_ranks",
]

MULTILABEL_MODES = (None, "per_label")  # the multilabel= choices of SupAPLoss / ROADMAPLoss


def grouped_suprank_pair_ranks(inputs: RankInputs, step: SupRankStep):
    """SupRank ranks ``rank⁺`` (no gradient) and ``rank`` (Eq. 9-10) of every (query, positive) pair, by the sorted
    kernels (formulas: :func:`pml_suprank.ranking.dense.dense_query_ranks`).

    Args:
        inputs: the loss inputs (``(B, N)`` scores, validity mask, 1-D labels).
        step: the ``H⁻`` step.

    Returns:
        ``(query_idx, item_idx, rank_plus, rank, groups)``: the first four ``(K,)`` with ``K = Σ_q |P_q|``, pairs
        grouped by query; ``groups`` their :class:`~pml_suprank.ranking.flat.PairGroups`.
    """
    positives = inputs.positives()
    negatives = inputs.valid & ~positives
    q, i, groups = positive_pair_groups(positives)
    rank_plus = 1.0 + heaviside_positive_count(inputs.scores, q, i)
    rank = rank_plus + suprank_negative_sum(inputs.scores, q, i, negatives, step, groups=groups)
    return q, i, rank_plus, rank, groups


def dense_suprank_query_ranks(inputs: RankInputs, step: SupRankStep) -> tuple[Tensor, Tensor, Tensor]:
    """SupRank ranks of every (query, reference) pair by the dense kernel (SupRank Eq. 9-10).

    Returns:
        ``(positives (B, N) float mask, rank_plus (B, N), rank (B, N))``; only the entries where the mask is 1 are
        (query, positive) ranks, the rest are finite and must be weighted by 0. No host synchronisation.
    """
    pos, negatives = _dense_masks(inputs)
    rank_plus, rank = dense_query_ranks("suprank", inputs.scores, pos, negatives, step)
    return pos, rank_plus, rank


def _dense_masks(inputs: RankInputs) -> tuple[Tensor, Tensor]:
    """``(positives, negatives)`` ``(B, N)`` float masks in the dtype of the scores (the dense kernels' masks)."""
    positives = inputs.positives()
    return positives.to(inputs.scores.dtype), (inputs.valid & ~positives).to(inputs.scores.dtype)


@register_loss("SupAP", hierarchical=False, paper=SUPRANK_PAPER, options=(*STEP_OPTIONS, "kernel"))
class SupAPLoss(SupRankStepMixin, BaseRankLoss):
    """SupAP loss (Ramzi et al., SupRank, TPAMI 2025, Eq. 11; ROADMAP, NeurIPS 2021).

    ``L = mean_q [1 − (1/|P_q|) Σ_{i∈P_q} rank⁺(i) / rank(i)]`` with ``rank⁺`` counted with the Heaviside step among
    positives and the negatives' contribution to ``rank`` smoothed by SupRank's ``H⁻`` (Eq. 4): only (positive,
    negative) pairs carry gradient. Because ``H⁻ >= H`` (defaults), SupAP ``>= 1 − AP``. Cost: ``O(Σ_q |P_q| · N)``
    time, ``O(B · N)`` extra memory.

    Args:
        tau: sigmoid temperature ``τ`` of ``H⁻`` (``None``: 0.01, or ``temperature`` when that is given).
        rho: slope ``ρ`` of the linear branch (``t > δ``).
        delta: margin ``δ``.
        start: jump on ``(0, δ]``.
        offset: value at ``t = δ⁺``; ``None`` → ``σ_τ(δ) + start`` (reference: 1.44 on SOP, ``start=0, offset=1`` iNat).
        include_self: keep the query as its own positive when the reference set is the batch (reference code).
        kernel: ``"auto"`` (default), ``"dense"`` or ``"sorted"`` (see :class:`BaseRankLoss`).
        temperature: alias of ``tau``; giving both with different values raises ``ValueError``.
        multilabel: ``None`` (default) or ``"per_label"``: ``(B, M)`` label sets padded with ``-1`` (column 0 a
            label; ``ref_labels`` ``(N, M)`` likewise); the per-query score is the mean, over the query's distinct
            labels with a positive, of the SupAP of that label as a binary problem (Ramzi PhD thesis Sec. 6.2.1).
            Upper bound of ``1 −``
            :func:`pml_suprank.metrics.graded.mean_label_average_precision`. ``RankingMemory`` and
            ``DistributedRankLoss`` pad the sets; ``memory.CrossBatchMemory`` does not support it.
        **kwargs: ``BaseRankLoss`` / PML options (``distance``, ``reducer``, ...).

    Shapes: ``embeddings (B, D)``, ``labels (B,)`` (or ``(B, M)``), optional ``ref_emb (N, D)``, ``ref_labels``.
    """

    kernels = ("auto", "dense", "sorted")

    def __init__(
        self,
        tau: float | None = None,
        rho: float = 100.0,
        delta: float = 0.05,
        start: float = 0.5,
        offset: float | None = None,
        include_self: bool = False,
        *,
        temperature: float | None = None,
        multilabel: str | None = None,
        **kwargs,
    ):
        tau = resolve_tau(tau, temperature, type(self).__name__)
        check_choice("multilabel", multilabel, MULTILABEL_MODES)
        super().__init__(include_self=include_self, **kwargs)
        self.init_step(tau=tau, rho=rho, delta=delta, start=start, offset=offset)
        self.multilabel = multilabel

    @property
    def allow_2d_labels(self) -> bool:
        """``(B, M)`` label sets are accepted with ``multilabel="per_label"``."""
        return self.multilabel == "per_label"

    def query_ap(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        """Surrogate AP: ``(ap (Q,), rows (Q,) long)`` (sorted kernel) or ``(ap (B,), kept (B,) bool)`` (dense)."""
        if self.resolved_kernel(inputs) == "dense":
            pos, negatives = _dense_masks(inputs)
            return self.kept_queries(*dense_query_ap("suprank", inputs.scores, pos, negatives, self.constant_step()))
        q, _, rank_plus, rank, groups = grouped_suprank_pair_ranks(inputs, self.constant_step())
        return self.segment_mean(rank_plus / rank, q, inputs.scores.shape[0], groups=groups)

    def per_label_query_ap(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        """Mean per-label surrogate AP ``(Q,)`` of the queries with a label that has a positive, and their rows."""
        owner, positives = per_label_rows(inputs.labels, inputs.ref_labels, inputs.valid)
        scores, valid = inputs.scores[owner], inputs.valid[owner]
        pseudo = RankInputs(scores, valid, owner, inputs.ref_labels, inputs.same_source, positive_mask=positives)
        ap, rows = self.query_ap(pseudo)
        if rows.dtype == torch.bool:  # the dense kernel's kept mask
            rows = torch.nonzero(rows, as_tuple=True)[0]
            ap = ap[rows]
        if len(rows) == 0:
            return ap, torch.zeros(0, dtype=torch.long, device=inputs.scores.device)
        return self.segment_mean(ap, owner[rows], inputs.scores.shape[0])

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        if self.multilabel == "per_label":
            ap, kept = self.per_label_query_ap(inputs)
        else:
            ap, kept = self.query_ap(inputs)
        return 1.0 - ap, kept
