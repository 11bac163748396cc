"""Rank losses as pytorch-metric-learning losses: ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)``."""

from .base_rank_loss import BaseRankLoss, RankInputs
from .smooth_ap_loss import SmoothAPLoss
from .sup_ap_loss import SupAPLoss
