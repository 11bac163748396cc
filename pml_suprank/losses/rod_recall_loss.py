"""ROD-R@k (SupRank paper Eq. 17): ``(1 − λ)·Sup-R@k + λ·L_DG`` (or ``L_DG*``)."""

from __future__ import annotations

from ._suprank_step import STEP_OPTIONS
from .combined_rank_loss import CombinedRankLoss
from .registry import SUPRANK_PAPER, register_loss
from .sup_recall_loss import SupRecallLoss

__all__ = ["RODRecallLoss"]


@register_loss(
    "ROD-R@k", hierarchical=False, paper=SUPRANK_PAPER,
    options=("decomposability", "decomposability_weight", *STEP_OPTIONS, "kernel"),
)  # fmt: skip
class RODRecallLoss(CombinedRankLoss):
    """ROD-R@k loss (SupRank paper Eq. 17): Sup-R@k plus a decomposability term.

    ``L = (1 − λ)·L_Sup-R@k + λ·L_dec`` with ``L_dec`` = :class:`CalibrationLoss` (``"calibration"``) or
    :class:`ClusterLoss` (``"proxy"``, needs ``num_classes``/``embedding_size``); the reference ROD-R@k configs use
    ``decomposability_weight=0.5``. ``temperature`` is the outer ``τ*`` (Eq. 16), ``tau`` the ``τ`` of ``H⁻``.

    Args:
        k, temperature: see :class:`SupRecallLoss`.
        decomposability, decomposability_weight, num_classes, embedding_size: see :class:`ROADMAPLoss`.
        **suprank_kwargs: ``H⁻`` arguments (``tau``, ``rho``, ``delta``, ``start``, ``offset``), ``include_self``,
            ``distance`` and the PML options of the combined loss.
    """

    def __init__(
        self,
        k=(1, 2, 4, 8, 16),
        temperature: float = 1.0,
        decomposability="calibration",
        decomposability_weight: float = 0.1,
        num_classes: int | None = None,
        embedding_size: int | None = None,
        **suprank_kwargs,
    ):
        rank_args = {"k": k, "temperature": temperature}
        sizes = {"num_classes": num_classes, "embedding_size": embedding_size}
        self.init_preset(SupRecallLoss, rank_args, decomposability, decomposability_weight, suprank_kwargs, **sizes)
