"""Deep nearest-neighbour distance (Sun et al., ICML 2022); higher = more OOD."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_bool, check_positive
from ..hub.schema import TensorSpec
from .base import Detector, check_features

__all__ = ["KNN"]


class KNN(Detector):
    """Deep nearest neighbours (Sun et al. 2022): ``(N,)`` squared L2 distance to the ``k``-th nearest training
    feature, exact (chunked matrix products). Equals HEAT's ``KNNScorer`` and OpenOOD's ``−conf``; pytorch-ood
    returns the unsquared distance (same ranking).

    Args:
        k: Neighbour rank (50 for CIFAR-10, 200 for CIFAR-100, 1000 for ImageNet in HEAT's evaluation).
        normalize: L2-normalise train and test features (the paper, OpenOOD and HEAT).
        chunk_size: Test rows per chunk (memory ``chunk_size × N_train``).
    """

    _state_names = ("bank",)

    def __init__(self, k: int = 50, normalize: bool = True, chunk_size: int = 1024) -> None:
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer; got {k!r}")
        self.k, self.normalize = k, check_bool("normalize", normalize)
        self.chunk_size = int(check_positive("chunk_size", chunk_size))

    def _state_spec(self) -> dict[str, TensorSpec]:
        return {"bank": TensorSpec(("N", "D"), nonzero=True, min_sizes=(("N", self.k),))}

    def _hub_check_state(self, state, source, config) -> None:
        super()._hub_check_state(state, source, config)
        if self.normalize:
            norms = torch.linalg.vector_norm(state["bank"].to(torch.float64), dim=-1)
            bad = torch.nonzero((norms - 1.0).abs() > 1e-2).flatten()
            if bad.numel():
                raise ValueError(
                    f"{source}: tensor 'bank' must hold L2-normalised rows (normalize=True); row {int(bad[0])} has "
                    f"norm {float(norms[bad[0]]):.4g}"
                )

    def _prep(self, z: Tensor) -> Tensor:
        return F.normalize(z, dim=-1, eps=1e-12) if self.normalize else z

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = check_features("features", features)
        if z.shape[0] < self.k:
            raise ValueError(f"KNN needs at least k={self.k} training features; got {z.shape[0]}")
        self.bank = self._prep(z.detach())

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = check_features("features", features, dim=self.bank.shape[1])
        bank = self.bank.to(device=z.device, dtype=z.dtype)
        bank_sq = (bank * bank).sum(-1)
        outs = []
        for part in self._prep(z).split(self.chunk_size):
            dist = (part * part).sum(-1, keepdim=True) + bank_sq - 2.0 * part @ bank.T
            outs.append(dist.topk(self.k, dim=-1, largest=False).values[:, -1].clamp_min(0.0))
        return torch.cat(outs)
