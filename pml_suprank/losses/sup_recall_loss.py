"""Sup-R@k (SupRank paper Eq. 15-16): a smooth recall@k surrogate built on SupRank ranks."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_positive
from ..ranking.steps import tau_sigmoid
from ._inputs import RankInputs
from ._suprank_step import STEP_OPTIONS, SupRankStepMixin, pop_step_options
from .base_rank_loss import BaseRankLoss
from .registry import SUPRANK_PAPER, register_loss
from .sup_ap_loss import dense_suprank_query_ranks, grouped_suprank_pair_ranks

__all__ = ["SupRecallLoss"]


def _check_k(k) -> tuple[int, ...]:
    ks = (k,) if isinstance(k, int) and not isinstance(k, bool) else tuple(k) if isinstance(k, (list, tuple)) else None
    if not ks or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in ks):
        raise ValueError(f"k must be a positive int or a non-empty sequence of positive ints; got {k!r}")
    return ks


@register_loss("Sup-R@k", hierarchical=False, paper=SUPRANK_PAPER, options=(*STEP_OPTIONS, "kernel"))
class SupRecallLoss(SupRankStepMixin, BaseRankLoss):
    """Sup-R@k loss (SupRank paper Eq. 15-16).

    ``R@k_q = Σ_{i∈P_q} σ_{τ*}(k − rank(i)) / min(|P_q|, k)`` with SupRank's ``rank`` (Eq. 10, ``H⁻`` on negatives),
    ``L = mean_q [1 − (1/|K|) Σ_{k∈K} R@k_q]``; queries may have different numbers of positives. ``temperature=``
    is the outer ``τ*`` of Eq. 16, *not* an alias of ``tau=`` (the ``τ`` of ``H⁻``, Eq. 4).

    Args:
        k: the cut-offs ``K`` ((1, 2, 4, 8, 16)).
        temperature: ``τ*`` of the outer sigmoid (1.0).
        **suprank_kwargs: ``tau`` (0.01), ``rho``, ``delta``, ``start``, ``offset`` of ``H⁻`` (:class:`SupAPLoss`),
            ``include_self``, ``kernel`` and ``BaseRankLoss``/PML options.

    Shapes: ``embeddings (B, D)``, ``labels (B,)``, optional ``ref_emb (N, D)``, ``ref_labels (N,)``; returns a scalar.
    """

    kernels = ("auto", "dense", "sorted")

    def __init__(self, k=(1, 2, 4, 8, 16), temperature: float = 1.0, **suprank_kwargs):
        step_kwargs = pop_step_options(type(self).__name__, suprank_kwargs, temperature_is_tau=False)
        super().__init__(**suprank_kwargs)
        self.k = _check_k(k)
        # the cut-offs as a tensor, built once: moved with the loss (.to / .cuda), copied once per other device
        self.register_buffer("k_values", torch.tensor(self.k, dtype=torch.float32), persistent=False)
        self._k_copies: dict[torch.device, Tensor] = {}
        self.temperature = check_positive("temperature", temperature)
        self.init_step(**step_kwargs)

    def k_tensor(self, like: Tensor) -> Tensor:
        """The cut-offs ``(|K|,)`` on ``like``'s device in its dtype, copied to a device at most once."""
        ks = self.k_values
        if ks.device != like.device:  # the loss was not moved to the scores' device
            ks = self._k_copies.get(like.device)
            if ks is None:
                ks = self._k_copies[like.device] = self.k_values.to(like.device)
        return ks.to(like.dtype)

    def query_recall(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        """Surrogate recall ``(Q,)`` averaged over ``k`` for the queries with a positive, and their rows ``(Q,)``."""
        if self.resolved_kernel(inputs) == "dense":
            return self._dense_recall(inputs)
        q, _, _, rank, groups = grouped_suprank_pair_ranks(inputs, self.constant_step())
        num_queries = inputs.scores.shape[0]
        ks = self.k_tensor(rank)
        hits = tau_sigmoid(ks.unsqueeze(0) - rank.unsqueeze(1), self.temperature)  # (K_pairs, |K|)
        sums = hits.new_zeros(num_queries, len(self.k)).index_add(0, q, hits)
        counts, kept = groups.counts, groups.kept_rows()  # no host synchronisation (one read in the pairs' groups)
        denom = torch.minimum(counts[kept].to(rank.dtype).unsqueeze(1), ks.unsqueeze(0))
        return (sums[kept] / denom).mean(1), kept

    def _dense_recall(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        # Eq. 16 on the dense ranks: hits (B, N, |K|) weighted by the positives mask, no host synchronisation
        pos, _, rank = dense_suprank_query_ranks(inputs, self.constant_step())
        ks = self.k_tensor(rank)
        hits = tau_sigmoid(ks - rank.unsqueeze(2), self.temperature)
        sums = torch.einsum("bik,bi->bk", hits, pos)
        counts = pos.sum(1)
        denom = torch.minimum(counts.unsqueeze(1), ks).clamp(min=1.0)
        return self.kept_queries((sums / denom).mean(1), counts)

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        recall, kept = self.query_recall(inputs)
        return 1.0 - recall, kept
