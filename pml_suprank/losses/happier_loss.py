"""HAPPIER / HAPPIER_F (HAPPIER ECCV 2022; SupRank paper Eq. 22): Sup-H-AP plus the proxy decomposability loss."""

from __future__ import annotations

from torch import Tensor

from ..relevance import Hierarchy
from .combined_rank_loss import CombinedRankLoss
from .registry import HAPPIER_PAPER, register_loss
from .sup_hap_loss import SupHAPLoss

__all__ = ["HAPPIERLoss"]


@register_loss(
    "HAPPIER", hierarchical=True, multilabel=True, paper=HAPPIER_PAPER,
    options=("decomposability_weight", "tau", "rho", "delta", "start", "offset", "kernel", "alpha"),
)  # fmt: skip
class HAPPIERLoss(CombinedRankLoss):
    """HAPPIER loss ``(1 − λ) · L_Sup-H-AP + λ · L_DG*`` (SupRank paper Eq. 22).

    ``L_DG*`` is :class:`~pml_suprank.losses.ClusterLoss` (Eq. 8) on the finest labels; its proxies are this loss's
    parameters (give them an optimizer; the reference uses Adam with lr 10). ``alpha > 1`` gives HAPPIER_F (paper:
    α = 5 on SOP, 3 on iNat). Loss dict: ``"rank_loss"``, ``"decomposability_loss"``.

    Args:
        num_classes: number of fine classes (proxies).
        embedding_size: embedding dimension ``D``.
        alpha: ``α`` of the H-AP relevance (Eq. 20).
        decomposability_weight: ``λ`` (0.1 in the paper and every reference config).
        hierarchy: fine → ancestors table for 1-D fine labels and multi-label sets.
        relevance: ``"levels"`` (default) or ``"multilabel"`` (``(B, M)`` sets padded with ``-1``, see
            :class:`~pml_suprank.losses.SupHAPLoss`; the proxy term sees column 0, so ``num_classes`` must exceed
            every fine label).
        **suprank_kwargs: :class:`~pml_suprank.losses.SupHAPLoss` options (``tau``/``temperature``, ``rho``,
            ``with_hrank``, ``include_self``, ``distance``, ...; shapes as there) and PML options (``reducer``).
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        alpha: float = 1.0,
        decomposability_weight: float = 0.1,
        hierarchy: Hierarchy | Tensor | None = None,
        relevance: str = "levels",
        **suprank_kwargs,
    ):
        rank_args = {"hierarchy": hierarchy, "alpha": alpha, "relevance": relevance}
        sizes = {"num_classes": num_classes, "embedding_size": embedding_size}
        self.init_preset(
            SupHAPLoss, rank_args, "proxy", decomposability_weight, suprank_kwargs, proxy_only=True, **sizes
        )
