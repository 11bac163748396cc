"""PML's ``CrossBatchMemory`` that also accepts this package's rank losses."""

from __future__ import annotations

import torch
from pytorch_metric_learning.losses import CrossBatchMemory as _PMLCrossBatchMemory

from .base_rank_loss import BaseRankLoss
from .combined_rank_loss import CombinedRankLoss

__all__ = ["CrossBatchMemory"]


def _pad(labels, width: int):
    if labels.shape[1] == width:
        return labels
    return torch.cat([labels, labels.new_full((labels.shape[0], width - labels.shape[1]), -1)], dim=1)


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

    Multi-label losses (``relevance="multilabel"``: ``SupHAPLoss`` / ``HAPPIERLoss``; decided by that attribute of
    the wrapped loss, never by the labels' shape) take ``(B, W)`` fine-label sets padded with ``-1``: the label memory
    becomes ``(memory_size, W)``; a narrower batch is padded with ``-1``, a wider one grows the memory with ``-1``
    columns (the stored sets are unchanged). The pairs (and a miner) see column 0 of the sets; the rank losses only
    use their union, i.e. every memory row except the query's own copy.

    Args:
        loss: the loss to wrap.
        embedding_size: embedding dimension.
        memory_size: number of stored embeddings (1024).
        miner: optional PML miner.
    """

    @property
    def multilabel(self) -> bool:
        """True when the wrapped loss takes multi-label label sets (its ``relevance == "multilabel"``)."""
        return getattr(self.loss, "relevance", None) == "multilabel"

    def _fit_label_width(self, labels):
        """Multi-label mode: ``labels`` padded to the memory's width, the memory grown to the batch's."""
        labels = labels.unsqueeze(1) if labels.dim() == 1 else labels
        memory = self.label_memory
        if memory.dim() == 1:
            memory = memory.unsqueeze(1)
        width = max(memory.shape[1], labels.shape[1])
        self.label_memory = _pad(memory, width)
        return _pad(labels, width)

    def forward(self, embeddings, labels, indices_tuple=None, enqueue_mask=None):
        """PML's ``forward``; multi-label sets ``(B, W)`` are reconciled with the memory's width first."""
        if self.multilabel and isinstance(labels, torch.Tensor):
            labels = self._fit_label_width(labels.to(self.label_memory.device))
        return super().forward(embeddings, labels, indices_tuple, enqueue_mask)

    def create_indices_tuple(self, embeddings, labels, E_mem, L_mem, input_indices_tuple, do_remove_self_comparisons):
        """PML's pairs, built from column 0 of multi-label sets (the rank losses use their union)."""
        if self.multilabel and labels.dim() == 2:
            labels, L_mem = labels[:, 0], L_mem[:, 0]
        return super().create_indices_tuple(
            embeddings, labels, E_mem, L_mem, input_indices_tuple, do_remove_self_comparisons
        )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "label_memory"
        if key in state_dict and state_dict[key].shape != self.label_memory.shape:  # a multi-label (M, W) memory
            self.label_memory = torch.zeros_like(state_dict[key], device=self.label_memory.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def supported_losses():
        ours = (
            ["CalibrationLoss", "CombinedRankLoss"] + _subclass_names(BaseRankLoss) + _subclass_names(CombinedRankLoss)
        )
        return _PMLCrossBatchMemory.supported_losses() + ours
