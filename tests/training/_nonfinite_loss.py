"""Losses for ``--loss _nonfinite_loss:<class>`` in the command-line tests of non-finite steps: Smooth-AP of finite
embeddings whose value becomes NaN from the second training call on (as a custom loss that overflows)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pml_suprank.losses import SmoothAPLoss


class NaNAfterFirstStepLoss(nn.Module):
    """``SmoothAPLoss`` of the fine labels on the first call, ``NaN`` (with NaN gradients) on every later call."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = SmoothAPLoss()
        self.calls = 0

    def forward(self, embeddings: Tensor, labels: Tensor, *args, **kwargs) -> Tensor:
        self.calls += 1
        loss = self.inner(embeddings, labels[:, 0] if labels.ndim == 2 else labels)
        return loss if self.calls == 1 else loss * float("nan")


class NaNOnRankOneLoss(NaNAfterFirstStepLoss):
    """Like :class:`NaNAfterFirstStepLoss`, but NaN on process 1 only: the other processes compute a finite loss and
    receive NaN gradients through DDP's all-reduce."""

    def forward(self, embeddings: Tensor, labels: Tensor, *args, **kwargs) -> Tensor:
        loss = super().forward(embeddings, labels, *args, **kwargs)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return loss if rank == 1 else self.inner(embeddings, labels[:, 0] if labels.ndim == 2 else labels)
