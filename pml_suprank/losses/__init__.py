"""Rank losses as pytorch-metric-learning losses: ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)``.

Layout: one loss per module; :class:`BaseRankLoss` is the base of the rank surrogates (Smooth-AP, SupAP, Sup-R@k,
Sup-H-AP, Sup-NDCG), :class:`CombinedRankLoss` adds a decomposability term to any of them (SupRank Eq. 12:
ROADMAP, ROD-R@k, HAPPIER and ROD-NDCG are its subclasses), ``_inputs`` holds the input validation shared by all;
:class:`DistributedRankLoss` makes any of them exact across processes. The :func:`register_loss` decorator
(``registry``) makes a loss trainable by the recipes by name; every loss above is registered, and
:func:`resolve_loss` also reads ``pml:ClassName``, ``package.module:ClassName`` and installed plugins.
A new rank loss is a :class:`BaseRankLoss` subclass implementing ``compute_query_losses``; its combined variant is
``CombinedRankLoss(MyLoss(), "calibration" | "proxy" | module, weight)``.

Temperatures: ``temperature=`` names a loss's sigmoid temperature everywhere (Smooth-AP's τ, ClusterLoss's η);
in the losses built on SupRank's ``H⁻`` (SupAP, ROADMAP, Sup-H-AP, HAPPIER, Sup-NDCG, ROD-NDCG) ``temperature=``
and ``tau=`` are aliases for its τ (Eq. 4). Sup-R@k and ROD-R@k have two: ``temperature=`` is the outer τ*
(Eq. 16) and ``tau=`` the τ of ``H⁻``.
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
