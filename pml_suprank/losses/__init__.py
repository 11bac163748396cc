"""Rank losses as pytorch-metric-learning losses: ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)``.

One loss per module: :class:`BaseRankLoss` is the base of the rank surrogates (Smooth-AP, SupAP, Sup-R@k, Sup-H-AP,
Sup-NDCG; a new one implements ``compute_query_losses``), :class:`CombinedRankLoss` adds a decomposability term
(SupRank Eq. 12; ROADMAP, ROD-R@k, HAPPIER, ROD-NDCG), :class:`DistributedRankLoss` makes any of them exact across
processes, and :func:`register_loss` / :func:`resolve_loss` name them for the recipes (also ``pml:ClassName``,
``package.module:ClassName`` and installed plugins).

Temperatures: ``temperature=`` is a loss's sigmoid temperature (Smooth-AP's τ, ClusterLoss's η) and, in the losses
built on ``H⁻``, an alias of ``tau=`` (Eq. 4); in Sup-R@k and ROD-R@k it is the outer τ* (Eq. 16).
"""

from ._inputs import RankInputs
from .base_rank_loss import BaseRankLoss
from .calibration_loss import CalibrationLoss
from .cluster_loss import ClusterLoss
from .combined_rank_loss import CombinedRankLoss
from .compile_guard import CompiledLossMismatchError, check_compiled_loss, compile_loss
from .csl_loss import CSLLoss
from .distributed_rank_loss import DistributedRankLoss, reference_loss
from .happier_loss import HAPPIERLoss
from .registry import loss_entry, register_loss, registered_losses, resolve_loss
from .roadmap_loss import ROADMAPLoss
from .rod_ndcg_loss import RODNDCGLoss
from .rod_recall_loss import RODRecallLoss
from .smooth_ap_loss import SmoothAPLoss
from .sup_ap_loss import SupAPLoss
from .sup_hap_loss import SupHAPLoss
from .sup_ndcg_loss import SupNDCGLoss
from .sup_recall_loss import SupRecallLoss

__all__ = [
    "BaseRankLoss",
    "CSLLoss",
    "CalibrationLoss",
    "ClusterLoss",
    "CombinedRankLoss",
    "CompiledLossMismatchError",
    "DistributedRankLoss",
    "HAPPIERLoss",
    "ROADMAPLoss",
    "RODNDCGLoss",
    "RODRecallLoss",
    "SmoothAPLoss",
    "SupAPLoss",
    "SupHAPLoss",
    "SupNDCGLoss",
    "SupRecallLoss",
    "check_compiled_loss",
    "compile_loss",
    "loss_entry",
    "register_loss",
    "reference_loss",
    "registered_losses",
    "resolve_loss",
]
