"""ROD-NDCG (SupRank paper Eq. 25): Sup-NDCG plus the proxy decomposability loss."""

from __future__ import annotations

from torch import Tensor

from ..relevance import Hierarchy
from .combined_rank_loss import CombinedRankLoss
from .registry import SUPRANK_PAPER, register_loss
from .sup_ndcg_loss import SupNDCGLoss

__all__ = ["RODNDCGLoss"]


@register_loss(
    "ROD-NDCG", hierarchical=True, multilabel=False, paper=SUPRANK_PAPER,
    options=("decomposability_weight", "tau", "rho", "delta", "start", "offset", "kernel"),
)  # fmt: skip
class RODNDCGLoss(CombinedRankLoss):
    """ROD-NDCG loss ``(1 − λ) · L_Sup-NDCG + λ · L_DG*`` (SupRank paper Eq. 25; reference configs ``roadndcg_*``).

    ``L_DG*`` is :class:`~pml_suprank.losses.ClusterLoss` on the finest labels (its proxies are this loss's
    parameters). Loss dict: ``"rank_loss"``, ``"decomposability_loss"``.

    Args:
        num_classes: number of fine classes (proxies).
        embedding_size: embedding dimension ``D``.
        decomposability_weight: ``λ`` (0.1).
        hierarchy: fine → ancestors table for 1-D fine labels.
        relevance: ``"levels"`` (default) or ``"multilabel"`` (``(B, M)`` sets, see
            :class:`~pml_suprank.losses.SupNDCGLoss`; the proxy term uses column 0).
        **suprank_kwargs: :class:`~pml_suprank.losses.SupNDCGLoss` options (``tau`` or its alias ``temperature``,
            ...) and the PML options of the combined loss.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        decomposability_weight: float = 0.1,
        hierarchy: Hierarchy | Tensor | None = None,
        relevance: str = "levels",
        **suprank_kwargs,
    ):
        rank_args = {"hierarchy": hierarchy, "relevance": relevance}
        sizes = {"num_classes": num_classes, "embedding_size": embedding_size}
        self.init_preset(
            SupNDCGLoss, rank_args, "proxy", decomposability_weight, suprank_kwargs, proxy_only=True, **sizes
        )
