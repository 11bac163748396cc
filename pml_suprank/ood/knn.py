"""Nearest-neighbour scores: deep nearest-neighbour distance (Sun et al., ICML 2022) and NNGuide, nearest-neighbour
guidance of a classifier score (Park et al., ICCV 2023); higher = more OOD."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import MAX_CONFIG_INT, check_bool, check_positive_int, check_probability
from ..hub.schema import TensorSpec
from .base import Detector, check_features

__all__ = ["KNN", "NNGuide"]


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
        self.chunk_size = check_positive_int("chunk_size", chunk_size, maximum=MAX_CONFIG_INT)

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
        self.chunk_size = check_positive_int("chunk_size", chunk_size, maximum=MAX_CONFIG_INT)

    _state_spec = KNN._state_spec  # the bank: at least k rows

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
