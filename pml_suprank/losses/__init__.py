"""Rank losses as pytorch-metric-learning losses: ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)``."""

from .base_rank_loss import BaseRankLoss, RankInputs
from .calibration_loss import CalibrationLoss
from .cluster_loss import ClusterLoss
from .combined_rank_loss import CombinedRankLoss
from .cross_batch_memory import CrossBatchMemory
from .csl_loss import CSLLoss
from .happier_loss import HAPPIERLoss
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
    "CrossBatchMemory",
    "HAPPIERLoss",
    "ROADMAPLoss",
    "RODNDCGLoss",
    "RODRecallLoss",
    "RankInputs",
    "SmoothAPLoss",
    "SupAPLoss",
    "SupHAPLoss",
    "SupNDCGLoss",
    "SupRecallLoss",
]
