"""NNGuide: nearest-neighbour guidance of a classifier score (Park et al., ICCV 2023); higher = more OOD."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_positive, check_positive_int, check_probability
from ..hub.schema import TensorSpec
from .base import Detector, check_features

__all__ = ["NNGuide"]


class NNGuide(Detector):
    """Energy guided by the k-NN similarity to a bank of confidence-scaled training features (Park et al. 2023).

    Bank: ``g_i = ẑ_i · E_i`` for a random subset of ``n = max(k, ⌈α·N⌉)`` training samples, ``ẑ = z/‖z‖``,
    ``E = logsumexp(logits)``. Score (Eqs. 6-7) ``(N,)``: ``−E(x) · (1/k) Σ_{top-k} ⟨ẑ(x), g_j⟩`` (exact search). With
    the same bank it agrees with OpenOOD v1.5 (``K = 100``, ``alpha = 0.01``, a slightly larger bank) to ~1e-9.

    Args:
        k: Number of neighbours (100).
        alpha: Fraction of the training set kept in the bank, in (0, 1] (0.01; use 1.0 on small sets).
        seed: Seed of the bank's random subset (only used when ``alpha < 1``).
        chunk_size: Test rows per chunk (memory ``chunk_size × n``).
    """

    _state_names = ("bank",)

    def __init__(self, k: int = 100, alpha: float = 0.01, seed: int = 0, chunk_size: int = 1024) -> None:
        super().__init__()
        self.k = check_positive_int("k", k)
        self.alpha = check_probability("alpha", alpha)
        if self.alpha == 0.0:
            raise ValueError("alpha must lie in (0, 1] (fraction of the training set in the bank); got 0.0")
        self.seed = check_positive_int("seed", seed, minimum=0)
        self.chunk_size = int(check_positive("chunk_size", chunk_size))

    def _state_spec(self) -> dict[str, TensorSpec]:
        return {"bank": TensorSpec(("N", "D"), nonzero=True, min_sizes=(("N", self.k),))}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = check_features("features", features).detach()
        logits = check_features("logits", logits, n=z.shape[0]).detach()
        n = z.shape[0]
        if n < self.k:
            raise ValueError(f"NNGuide needs at least k={self.k} training features; got {n}")
        size = min(n, max(self.k, math.ceil(self.alpha * n)))
        if size < n:
            g = torch.Generator().manual_seed(self.seed)
            idx = torch.randperm(n, generator=g)[:size].to(z.device)
            z, logits = z[idx], logits[idx]
        self.bank = F.normalize(z, dim=-1, eps=1e-12) * torch.logsumexp(logits, dim=-1, keepdim=True)

    def guidance(self, features: Tensor) -> Tensor:
        """``(N, D) -> (N,)`` mean of the ``k`` largest inner products of ``ẑ`` with the bank (the guidance term)."""
        z = check_features("features", features, dim=self.bank.shape[1])
        bank = self.bank.to(device=z.device, dtype=z.dtype)
        outs = [
            (part @ bank.T).topk(self.k, dim=-1).values.mean(dim=-1)
            for part in F.normalize(z, dim=-1, eps=1e-12).split(self.chunk_size)
        ]
        return torch.cat(outs)

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        guide = self.guidance(features)
        return -torch.logsumexp(check_features("logits", logits, n=guide.shape[0]), dim=-1) * guide
