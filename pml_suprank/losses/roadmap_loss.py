"""ROADMAP (SupRank paper Eq. 12): ``(1 − λ)·SupAP + λ·L_DG`` (calibration) or ``λ·L_DG*`` (proxies, ROADMAP++)."""

from __future__ import annotations

from .calibration_loss import CalibrationLoss
from .combined_rank_loss import CombinedRankLoss
from .registry import SUPRANK_PAPER, register_loss
from .sup_ap_loss import SupAPLoss

__all__ = ["ROADMAPLoss"]


@register_loss(
    "ROADMAP", hierarchical=False, multilabel=False, paper=SUPRANK_PAPER,
    options=("decomposability", "decomposability_weight", "tau", "rho", "delta", "start", "offset", "kernel"),
)  # fmt: skip
class ROADMAPLoss(CombinedRankLoss):
    """ROADMAP loss (Ramzi et al., NeurIPS 2021; SupRank TPAMI 2025 Eq. 12).

    ``L = (1 − λ)·L_SupAP + λ·L_dec`` with ``L_dec`` = :class:`CalibrationLoss` (L_DG, Eq. 7,
    ``decomposability="calibration"``) or :class:`ClusterLoss` (L_DG*, Eq. 8, ``"proxy"``, owning the proxies).
    Loss dict: ``"rank_loss"``, ``"decomposability_loss"``.

    Args:
        decomposability: ``"calibration"`` (default), ``"proxy"``, or an ``nn.Module`` loss.
        decomposability_weight: ``λ`` (0.1).
        num_classes, embedding_size: for ``"proxy"``.
        multilabel: ``None`` or ``"per_label"``: ``(B, M)`` label sets padded with ``-1``; per-label SupAP
            (:class:`SupAPLoss`) and a calibration term whose positives share any label; ``"proxy"`` and custom
            modules get column 0.
        **suprank_kwargs: :class:`SupAPLoss` arguments (``tau``/``temperature``, ``rho``, ``delta``, ``start``,
            ``offset``, ``include_self``, ``distance``) and the combined loss's PML options (``reducer``, ...).

    Shapes: as :class:`SupAPLoss`. With ``ref_emb`` the calibration term also uses the reference set; L_DG* the queries.
    """

    def __init__(
        self,
        decomposability="calibration",
        decomposability_weight: float = 0.1,
        num_classes: int | None = None,
        embedding_size: int | None = None,
        multilabel: str | None = None,
        **suprank_kwargs,
    ):
        if multilabel == "per_label" and isinstance(decomposability, str) and decomposability == "calibration":
            decomposability = CalibrationLoss(include_self=suprank_kwargs.get("include_self", False), multilabel=True)
        sizes = {"num_classes": num_classes, "embedding_size": embedding_size}
        self.init_preset(
            SupAPLoss, {"multilabel": multilabel}, decomposability, decomposability_weight, suprank_kwargs, **sizes
        )
