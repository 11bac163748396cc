"""PML's ``CrossBatchMemory`` that also accepts this package's rank losses."""

from __future__ import annotations

from pytorch_metric_learning.losses import CrossBatchMemory as _PMLCrossBatchMemory

from .base_rank_loss import BaseRankLoss
from .combined_rank_loss import CombinedRankLoss

__all__ = ["CrossBatchMemory"]


def _subclass_names(cls) -> list[str]:
    names = []
    for sub in cls.__subclasses__():
        names.append(sub.__name__)
        names.extend(_subclass_names(sub))
    return names


class CrossBatchMemory(_PMLCrossBatchMemory):
    """Drop-in for ``pytorch_metric_learning.losses.CrossBatchMemory`` (XBM, Wang et al. CVPR 2020).

    PML checks the wrapped loss by class name against a fixed list; this subclass extends the list with every
    :class:`BaseRankLoss` subclass (flat and hierarchical rank losses), :class:`CombinedRankLoss` and its subclasses
    (ROADMAP, ROD-R@k, HAPPIER, ROD-NDCG) and :class:`CalibrationLoss`.
    Behaviour is PML's: the batch is enqueued (detached) first, then the loss is called as
    ``loss(embeddings, labels, pairs, memory_embeddings, memory_labels)`` where ``pairs`` omits each query's own copy
    — the rank losses rank only over those pairs, so the query is not its own positive. Memory rows carry no gradient.

    Args:
        loss: the loss to wrap.
        embedding_size: embedding dimension.
        memory_size: number of stored embeddings (1024).
        miner: optional PML miner.
    """

    @staticmethod
    def supported_losses():
        ours = (
            ["CalibrationLoss", "CombinedRankLoss"] + _subclass_names(BaseRankLoss) + _subclass_names(CombinedRankLoss)
        )
        return _PMLCrossBatchMemory.supported_losses() + ours
