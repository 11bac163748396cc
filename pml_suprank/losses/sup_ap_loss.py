"""SupAP (SupRank paper Eq. 9-11): a smooth upper bound of 1 − AP, as a PML loss."""

from __future__ import annotations

from torch import Tensor

from ..ranking import SupRankStep, dense_query_ranks, heaviside_positive_count, masked_query_mean, suprank_negative_sum
from ._inputs import RankInputs
from ._suprank_step import SupRankStepMixin, resolve_tau
from .base_rank_loss import BaseRankLoss

__all__ = ["SupAPLoss", "dense_suprank_query_ranks", "suprank_pair_ranks"]


def suprank_pair_ranks(inputs: RankInputs, step: SupRankStep) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """SupRank ranks of every (query, positive) pair.

    ``rank⁺(i) = 1 + Σ_{j∈P_q, j≠i} H(s_j − s_i)`` (no gradient) and ``rank(i) = rank⁺(i) + Σ_{j∈N_q} H⁻(s_j − s_i)``
    (SupRank Eq. 9-10), where ``P_q``/``N_q`` are the valid positives/negatives of query ``q``.

    Args:
        inputs: the loss inputs (``(B, N)`` scores, validity mask, 1-D labels).
        step: the ``H⁻`` step.

    Returns:
        ``(query_idx, item_idx, rank_plus, rank)``, each ``(K,)`` with ``K = Σ_q |P_q|``, pairs grouped by query.
    """
    positives = inputs.positives()
    negatives = inputs.valid & ~positives
    q, i = inputs.positive_pairs(positives)
    rank_plus = 1.0 + heaviside_positive_count(inputs.scores, q, i, positives)
    rank = rank_plus + suprank_negative_sum(inputs.scores, q, i, negatives, step)
    return q, i, rank_plus, rank


def dense_suprank_query_ranks(inputs: RankInputs, step: SupRankStep) -> tuple[Tensor, Tensor, Tensor]:
    """SupRank ranks of every (query, reference) pair by the dense kernel (SupRank Eq. 9-10).

    Returns:
        ``(positives (B, N) float mask, rank_plus (B, N), rank (B, N))``; only the entries where the mask is 1 are
        (query, positive) ranks, the rest are finite and must be weighted by 0. No host synchronisation.
    """
    positives = inputs.positives()
    negatives = (inputs.valid & ~positives).to(inputs.scores.dtype)
    pos = positives.to(inputs.scores.dtype)
    rank_plus, rank = dense_query_ranks("suprank", inputs.scores, pos, negatives, step)
    return pos, rank_plus, rank


class SupAPLoss(SupRankStepMixin, BaseRankLoss):
    """SupAP loss (Ramzi et al., SupRank, TPAMI 2025, Eq. 11; ROADMAP, NeurIPS 2021).

    ``L = mean_q [1 − (1/|P_q|) Σ_{i∈P_q} rank⁺(i) / rank(i)]`` with ``rank⁺`` counted with the Heaviside step among
    positives and the negatives' contribution to ``rank`` smoothed by SupRank's ``H⁻`` (Eq. 4), so only
    (positive, negative) pairs carry gradient: positives' scores are pushed up and violating negatives down.
    Because ``H⁻ >= H`` (defaults), SupAP ``>= 1 − AP``.

    Cost: ``O(Σ_q |P_q| · N)`` time and ``O(B · N)`` extra memory per call (chunked custom autograd kernel).

    Args:
        tau: sigmoid temperature ``τ`` of ``H⁻`` (``None``: 0.01, or ``temperature`` when that is given).
        rho: slope ``ρ`` of the linear branch (``t > δ``).
        delta: margin ``δ``.
        start: jump on ``(0, δ]``.
        offset: value at ``t = δ⁺``; ``None`` → ``σ_τ(δ) + start`` (continuous; reference SOP configs use 1.44,
            iNat configs ``start=0, offset=1``).
        include_self: keep the query as its own positive when the reference set is the batch (reference code).
        kernel: ``"auto"`` (default), ``"dense"`` or ``"sorted"`` (see :class:`BaseRankLoss`).
        temperature: alias of ``tau`` (the name the package's other sigmoid losses use); giving both with different
            values raises ``ValueError``.
        **kwargs: ``BaseRankLoss`` / PML options (``distance``, ``reducer``, ...).

    Shapes: ``embeddings (B, D)``, ``labels (B,)``, optional ``ref_emb (N, D)``, ``ref_labels (N,)``; returns a scalar.
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
        **kwargs,
    ):
        tau = resolve_tau(tau, temperature, type(self).__name__)
        super().__init__(include_self=include_self, **kwargs)
        self.init_step(tau=tau, rho=rho, delta=delta, start=start, offset=offset)

    def query_ap(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        """Surrogate AP ``(Q,)`` of the queries with at least one positive, and their rows ``(Q,)``."""
        if self.resolved_kernel(inputs) == "dense":
            pos, rank_plus, rank = dense_suprank_query_ranks(inputs, self.constant_step())
            return self.kept_queries(*masked_query_mean(rank_plus / rank, pos))
        q, _, rank_plus, rank = suprank_pair_ranks(inputs, self.step)
        return self.segment_mean(rank_plus / rank, q, inputs.scores.shape[0])

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        ap, kept = self.query_ap(inputs)
        return 1.0 - ap, kept
