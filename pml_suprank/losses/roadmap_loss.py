"""ROADMAP (SupRank paper Eq. 12): ``(1 − λ)·SupAP + λ·L_DG`` (calibration) or ``λ·L_DG*`` (proxies, ROADMAP++)."""

from __future__ import annotations

from .calibration_loss import CalibrationLoss
from .combined_rank_loss import CombinedRankLoss, combination_options
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
        weight, rank_kwargs, combination_kwargs = combination_options(
            "ROADMAPLoss", decomposability, decomposability_weight, suprank_kwargs
        )
        if multilabel == "per_label" and isinstance(decomposability, str) and decomposability == "calibration":
            decomposability = CalibrationLoss(include_self=rank_kwargs.get("include_self", False), multilabel=True)
        super().__init__(
            SupAPLoss(multilabel=multilabel, **rank_kwargs),
            decomposability,
            weight,
            num_classes=num_classes,
            embedding_size=embedding_size,
            **combination_kwargs,
        )

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        if getattr(self.decomposability_loss, "multilabel", False) is not True:
            return super().compute_loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        # per-label ROADMAP: the calibration term sees the whole label sets (pairs sharing any label are positive)
        rank_entry = self.rank_entry(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        args = (embeddings, labels, indices_tuple)
        if ref_emb is not embeddings:
            args = (*args, ref_emb, ref_labels)
        value = self.decomposability_loss(*args)
        return {
            "rank_loss": rank_entry,
            "decomposability_loss": {
                "losses": self.weight * value,
                "indices": None,
                "reduction_type": "already_reduced",
            },
        }
