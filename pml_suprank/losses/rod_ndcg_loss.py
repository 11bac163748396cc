"""ROD-NDCG (SupRank paper Eq. 25): Sup-NDCG plus the proxy decomposability loss."""

from __future__ import annotations

from torch import Tensor

from ..relevance import Hierarchy
from .sup_ndcg_loss import SupNDCGLoss

__all__ = ["RODNDCGLoss"]


class RODNDCGLoss(SupNDCGLoss):
    """ROD-NDCG loss ``(1 − λ) · L_Sup-NDCG + λ · L_DG*`` (SupRank paper Eq. 25; reference configs ``roadndcg_*``).

    ``L_DG*`` is :class:`~pml_suprank.losses.ClusterLoss` on the finest labels (its proxies are this loss's
    parameters). The loss dict has ``"rank_loss"`` and ``"decomposability_loss"``.

    Args:
        num_classes: number of fine classes (proxies).
        embedding_size: embedding dimension ``D``.
        decomposability_weight: ``λ`` (0.1).
        hierarchy: fine → ancestors table for 1-D fine labels.
        **suprank_kwargs: :class:`~pml_suprank.losses.SupNDCGLoss` options and PML options.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        decomposability_weight: float = 0.1,
        hierarchy: Hierarchy | Tensor | None = None,
        **suprank_kwargs,
    ):
        for key in ("decomposability", "num_classes", "embedding_size"):
            if key in suprank_kwargs:
                raise TypeError(f"RODNDCGLoss sets {key} itself; got an extra {key}= argument")
        super().__init__(
            hierarchy=hierarchy,
            decomposability="proxy",
            decomposability_weight=decomposability_weight,
            num_classes=num_classes,
            embedding_size=embedding_size,
            **suprank_kwargs,
        )
