"""ROADMAP (SupRank paper Eq. 12): ``(1 − λ)·SupAP + λ·L_DG`` (calibration) or ``λ·L_DG*`` (proxies, ROADMAP++)."""

from __future__ import annotations

from .combined_rank_loss import CombinedRankLoss, combination_options
from .sup_ap_loss import SupAPLoss

__all__ = ["ROADMAPLoss"]


class ROADMAPLoss(CombinedRankLoss):
    """ROADMAP loss (Ramzi et al., NeurIPS 2021; SupRank TPAMI 2025 Eq. 12).

    ``L = (1 − λ)·L_SupAP + λ·L_dec`` with ``L_dec`` = :class:`CalibrationLoss` (L_DG, Eq. 7,
    ``decomposability="calibration"``) or :class:`ClusterLoss` (L_DG*, Eq. 8, ``decomposability="proxy"``, which
    needs ``num_classes`` and ``embedding_size`` and owns the proxies as parameters). The loss dict holds the two
    weighted terms ``"rank_loss"`` and ``"decomposability_loss"``; the inner modules are ``self.rank_loss`` (a
    :class:`SupAPLoss`) and ``self.decomposability_loss``.

    Args:
        decomposability: ``"calibration"`` (default), ``"proxy"``, or an ``nn.Module`` loss.
        decomposability_weight: ``λ`` (0.1).
        num_classes, embedding_size: for ``"proxy"``.
        **suprank_kwargs: :class:`SupAPLoss` arguments (``tau`` or its alias ``temperature``, ``rho``, ``delta``,
            ``start``, ``offset``, ``include_self``, ``distance``) and the PML options of the combined loss
            (``reducer``, ``embedding_regularizer``, ...).

    Shapes: ``embeddings (B, D)``, ``labels (B,)``, optional ``ref_emb (N, D)``, ``ref_labels (N,)``; returns a scalar.
    With ``ref_emb`` the calibration term also uses the reference set (as the reference code); L_DG* uses the queries.
    """

    def __init__(
        self,
        decomposability="calibration",
        decomposability_weight: float = 0.1,
        num_classes: int | None = None,
        embedding_size: int | None = None,
        **suprank_kwargs,
    ):
        weight, rank_kwargs, combination_kwargs = combination_options(
            "ROADMAPLoss", decomposability, decomposability_weight, suprank_kwargs
        )
        super().__init__(
            SupAPLoss(**rank_kwargs),
            decomposability,
            weight,
            num_classes=num_classes,
            embedding_size=embedding_size,
            **combination_kwargs,
        )
