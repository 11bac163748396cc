"""The module that goes through ``accelerator.prepare``: model + loss (+ memory), returning the loss of a batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..collectives import gather_batch
from ..losses.distributed_rank_loss import is_multilabel_loss
from .cached_backward import cached_backward
from .nonfinite import finite_or_zero, nan_unless

__all__ = ["LossModule", "backward_step"]


class LossModule(nn.Module):
    """``model`` + ``loss`` (+ ``memory``) as one module (the proxies under the network's DDP):
    ``forward(images, labels, indices) -> loss``. With ``distributed`` the global batch is gathered with gradients
    and its loss computed on every process: after DDP's averaging, the single-process gradient.

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
        return self.embedding_loss(self.model(images), labels, indices)

    def embedding_loss(self, embeddings: Tensor, labels: Tensor, indices: Tensor | None = None) -> Tensor:
        """The loss of the batch's ``(B, D)`` embeddings; NaN when some are not finite (the step is skipped)."""
        embeddings, finite = finite_or_zero(embeddings.float(), self.distributed)
        labels = labels if self.hierarchical_labels else labels[:, 0]
        # mixed precision applies to the network; the rank loss runs in float32 (sigmoids of score differences / τ)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            if self.memory is not None:  # RankingMemory gathers the global batch itself under torch.distributed
                loss = self.memory(embeddings, labels, indices)
            else:
                if self.distributed:  # the one gather of the package (also the memory's and DistributedRankLoss's)
                    batch = gather_batch(embeddings, labels, multilabel=is_multilabel_loss(self.loss))
                    embeddings, labels = batch.embeddings, batch.labels
                loss = self.loss(embeddings, labels)
        return nan_unless(finite, loss)

    def cached_backward(
        self, images: Tensor, labels: Tensor, indices: Tensor | None, chunk_size: int, backward: Callable
    ) -> Tensor:
        """Back-propagate ``forward(images, labels, indices)`` by :func:`.cached_backward` (``backward``:
        ``accelerator.backward``); called on the unwrapped module, it averages the gradients over the processes
        itself. Returns the detached loss."""
        loss = cached_backward(
            self.model, self.embedding_loss, images, labels, chunk_size=chunk_size, backward=backward, indices=indices
        )
        if self.distributed:
            params = [p for p in self.parameters() if p.requires_grad]
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            torch.distributed.all_reduce(flat)
            for p, g in zip(params, flat.div_(torch.distributed.get_world_size()).split([p.numel() for p in params])):
                p.grad = g.view_as(p).clone()
        return loss


def backward_step(
    accelerator: Any, loss_module: nn.Module, images: Tensor, labels: Tensor, indices: Tensor, chunk_size: int | None
) -> Tensor:
    """The loss of a training batch, back-propagated under autocast (with ``chunk_size``:
    :meth:`LossModule.cached_backward`, the same gradient)."""
    with accelerator.autocast():
        if chunk_size is not None:
            return accelerator.unwrap_model(loss_module).cached_backward(
                images, labels, indices, chunk_size, accelerator.backward
            )
        loss = loss_module(images, labels, indices)
    accelerator.backward(loss)
    return loss
