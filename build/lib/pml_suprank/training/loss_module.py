"""The module that goes through ``accelerator.prepare``: model + loss (+ memory), returning the loss of a batch."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import distributed as dist_utils

__all__ = ["LossModule"]


class LossModule(nn.Module):
    """``model`` + ``loss`` (+ ``memory``) as one module: ``forward(images, labels, indices) -> loss``.

    Wrapping them together lets ``accelerator.prepare`` put the loss parameters (proxies) under the same DDP as the
    network. With ``num_processes > 1`` the embeddings, labels and indices of the global batch are gathered (the
    embeddings with gradients) and the loss of the global batch is computed on every process: after DDP averages
    the gradients this is exactly the single-process gradient of the loss on the concatenated batch.

    Args:
        model: Maps ``(B, 3, H, W)`` images to ``(B, D)`` embeddings.
        loss: A PML-style loss ``loss(embeddings, labels)``.
        memory: Optional ``RankingMemory`` wrapping ``loss``: ``memory(embeddings, labels, indices)``.
        hierarchical_labels: Pass labels ``(B, L)`` to the loss; otherwise the fine column ``(B,)``.
        distributed: Gather the global batch across processes (``torch.distributed`` must be initialised).
    """

    def __init__(
        self,
        model: nn.Module,
        loss: nn.Module,
        memory: nn.Module | None = None,
        hierarchical_labels: bool = True,
        distributed: bool = False,
    ) -> None:
        super().__init__()
        self.model = model
        # the memory holds the loss as a submodule: registering it twice would duplicate its tensors in state_dict
        self.loss = loss if memory is None else None
        self.memory = memory
        self.hierarchical_labels = bool(hierarchical_labels)
        self.distributed = bool(distributed)

    def forward(self, images: Tensor, labels: Tensor, indices: Tensor | None = None) -> Tensor:
        embeddings = self.model(images).float()
        labels = labels if self.hierarchical_labels else labels[:, 0]
        # mixed precision applies to the network; the rank loss runs in float32 (sigmoids of score differences / τ)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            if self.memory is not None:  # RankingMemory gathers the global batch itself under torch.distributed
                return self.memory(embeddings, labels, indices)
            if self.distributed:
                embeddings = dist_utils.all_gather_with_grad(embeddings)
                labels = dist_utils.all_gather(labels)
            return self.loss(embeddings, labels)
