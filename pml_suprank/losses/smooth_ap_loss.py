"""Smooth-AP (Brown et al., ECCV 2020, Eq. 5), correct for any class composition, as a PML loss."""

from __future__ import annotations

from torch import Tensor

from ..ranking import SigmoidStep
from ..ranking.dense import dense_query_ap
from ..ranking.flat import positive_pair_groups, sigmoid_rank_sums
from ._inputs import RankInputs
from .base_rank_loss import BaseRankLoss
from .registry import register_loss

__all__ = ["SmoothAPLoss"]


@register_loss(
    "Smooth-AP", hierarchical=False, options=("kernel",),
    paper=("Smooth-AP: Smoothing the Path Towards Large-Scale Image Retrieval (Brown et al., ECCV 2020)",
           "https://arxiv.org/abs/2007.12163"),
)  # fmt: skip
class SmoothAPLoss(BaseRankLoss):
    """Smooth-AP loss: ``L = mean_q [1 − (1/|P_q|) Σ_{i∈P_q} (1 + Σ_{j∈P_q, j≠i} σ_τ(s_j − s_i))
    / (1 + Σ_{j∈V_q, j≠i} σ_τ(s_j − s_i))]`` (Smooth-AP paper Eq. 5; SupRank paper §3.1).

    The sigmoid replaces the Heaviside step on every pair. Unlike PML 2.9's ``SmoothAPLoss`` any batch layout,
    ``ref_emb`` and ``indices_tuple`` work. Cost: ``O(Σ_q |P_q| · N)`` (``"sorted"``), ``O(B · N²)`` (``"dense"``).

    Args:
        temperature: sigmoid temperature ``τ`` (0.01 in the paper).
        include_self: keep the query as its own positive when the reference set is the batch. **The default,
            ``False``, differs from PML's** ``SmoothAPLoss`` **and the authors' code** (a lower AP, another loss
            value); ``include_self=True`` matches them (and the authors' golden vectors).
        **kwargs: ``BaseRankLoss`` / PML options (``kernel="auto" | "dense" | "sorted"``, ``distance``, ...).

    Shapes: ``embeddings (B, D)``, ``labels (B,)``, optional ``ref_emb (N, D)``, ``ref_labels (N,)``; returns a scalar.
    """

    kernels = ("auto", "dense", "sorted")

    def __init__(self, temperature: float = 0.01, include_self: bool = False, **kwargs):
        super().__init__(include_self=include_self, **kwargs)
        self.step = SigmoidStep(temperature)
        self.temperature = self.step.tau

    def query_ap(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        """Smooth AP: ``(ap (Q,), rows (Q,) long)`` (sorted kernel) or ``(ap (B,), kept (B,) bool)`` (dense)."""
        positives = inputs.positives()
        if self.resolved_kernel(inputs) == "dense":
            pos = positives.to(inputs.scores.dtype)
            valid = inputs.valid.to(inputs.scores.dtype)
            return self.kept_queries(*dense_query_ap("smooth_ap", inputs.scores, pos, valid, self.temperature))
        q, i, groups = positive_pair_groups(positives)
        pos_sum, all_sum = sigmoid_rank_sums(inputs.scores, q, i, inputs.valid, self.temperature, groups=groups)
        rank_plus, rank = 1.0 + pos_sum, 1.0 + all_sum
        return self.segment_mean(rank_plus / rank, q, inputs.scores.shape[0], groups=groups)

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        ap, kept = self.query_ap(inputs)
        return 1.0 - ap, kept
