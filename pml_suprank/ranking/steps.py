"""Step functions of the rank surrogates, each with its value and its explicit derivative.

* :func:`heaviside` — ``H(t) = 1[t >= 0]`` (no gradient), ``rank⁺`` of SupRank (Ramzi et al., TPAMI 2025, Eq. 3);
* :func:`tau_sigmoid` — Smooth-AP's ``σ_τ(t) = 1 / (1 + exp(-t/τ))``, exponent clamped to ±50 like the reference code
  (Brown et al., ECCV 2020, Eq. 5);
* :class:`SupRankStep` — SupRank's ``H⁻`` (Eq. 4): ``σ_τ(t)`` for ``t <= 0``, ``start + σ_τ(t)`` for ``0 < t <= δ``,
  ``ρ (t − δ) + offset`` for ``t > δ``; the default ``offset = σ_τ(δ) + start`` makes it continuous and an upper
  bound of ``H`` on ``t > 0``;
* :class:`HRankParams` — HAPPIER's lower bound ``H_s^>`` of the Heaviside in H-rank⁺ (Ramzi et al., ECCV 2022,
  App. A.3, Eq. 43).

The step objects expose ``value(t)``, ``derivative(t)`` and ``differentiable``, elementwise on any shape and dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import check_positive, check_probability

__all__ = [
    "HRankParams",
    "HeavisideStep",
    "SigmoidStep",
    "SupRankStep",
    "default_offset",
    "heaviside",
    "tau_sigmoid",
]

_CLAMP = 50.0  # the reference clamps -t/τ to [-50, 50] (σ_τ saturates, zero gradient beyond)


def heaviside(t: Tensor) -> Tensor:
    """``H(t) = 1[t >= 0]`` (``H(0) = 1``) of score differences ``s_j − s_i``: same shape and dtype, detached."""
    return (t.detach() >= 0).to(t.dtype)


def tau_sigmoid(t: Tensor, tau: float) -> Tensor:
    """``σ_τ(t) = 1 / (1 + exp(clamp(−t/τ, −50, 50)))`` (Smooth-AP Eq. 5; SupRank Eq. 4), same shape and dtype as
    ``t``; zero gradient where ``|t/τ| > 50``."""
    return 1.0 / (1.0 + torch.exp(torch.clamp(-t / tau, -_CLAMP, _CLAMP)))


def default_offset(tau: float, delta: float, start: float) -> float:
    """SupRank's default ``offset = σ_τ(δ) + start`` (makes ``H⁻`` of SupRank Eq. 4 continuous at ``t = δ``).

    ``σ_τ(δ)`` in float32 as in the reference code (float64 runs reproduce it to ~1e-16); e.g. ``τ = 0.01,
    δ = 0.05, start = 0.5`` gives 1.49330717.
    """
    d = torch.tensor([delta], dtype=torch.float32)
    return float(tau_sigmoid(d, tau)[0]) + float(start)


class HeavisideStep:
    """``H(t) = 1[t >= 0]``; not differentiable (the gradient is zero)."""

    differentiable = False

    def value(self, t: Tensor) -> Tensor:
        return heaviside(t)

    def derivative(self, t: Tensor) -> Tensor:
        return torch.zeros_like(t)

    def __repr__(self) -> str:
        return "HeavisideStep()"


@dataclass(frozen=True)
class SigmoidStep:
    """Smooth-AP's ``σ_τ`` (Smooth-AP Eq. 5) as a step object (value and explicit derivative)."""

    tau: float = 0.01
    differentiable = True

    def __post_init__(self) -> None:
        check_positive("tau", self.tau)

    def value(self, t: Tensor) -> Tensor:
        return tau_sigmoid(t, self.tau)

    def derivative(self, t: Tensor) -> Tensor:
        z = -t / self.tau
        inside = (z >= -_CLAMP) & (z <= _CLAMP)
        sig = 1.0 / (1.0 + torch.exp(torch.clamp(z, -_CLAMP, _CLAMP)))
        return torch.where(inside, sig * (1.0 - sig) / self.tau, torch.zeros_like(t))


@dataclass(frozen=True)
class SupRankStep:
    """SupRank's ``H⁻`` (SupRank Eq. 4): temperature ``tau``, slope ``rho`` of the linear branch from ``delta``,
    jump ``start`` on ``(0, δ]`` and value ``offset`` at ``δ⁺`` (``None``: :func:`default_offset`, resolved in
    :attr:`resolved_offset`)."""

    tau: float = 0.01
    rho: float = 100.0
    delta: float = 0.05
    start: float = 0.5
    offset: float | None = None
    differentiable = True

    def __post_init__(self) -> None:
        check_positive("tau", self.tau)
        check_positive("rho", self.rho, strict=False)
        check_positive("delta", self.delta, strict=False)
        if isinstance(self.start, bool) or not isinstance(self.start, (int, float)) or not math.isfinite(self.start):
            raise TypeError(f"start must be a finite real number; got {self.start!r}")
        if self.offset is not None and (
            isinstance(self.offset, bool) or not isinstance(self.offset, (int, float)) or not math.isfinite(self.offset)
        ):
            raise TypeError(f"offset must be None or a finite real number; got {self.offset!r}")

    @property
    def resolved_offset(self) -> float:
        if self.offset is None:
            return default_offset(self.tau, self.delta, self.start)
        return float(self.offset)

    def value(self, t: Tensor) -> Tensor:
        sig = tau_sigmoid(t, self.tau)
        linear = self.rho * (t - self.delta) + self.resolved_offset
        return torch.where(t <= 0, sig, torch.where(t <= self.delta, sig + self.start, linear))

    def derivative(self, t: Tensor) -> Tensor:
        d_sig = SigmoidStep(self.tau).derivative(t)
        return torch.where(t <= self.delta, d_sig, torch.full_like(t, self.rho))


class HRankParams:
    """Hyper-parameters of the HAPPIER H-rank⁺ lower bound ``H_s^>`` (HAPPIER App. A.3, Eq. 43).

    ``H_s^>(t) = gamma·t`` for ``t ≤ 0`` and ``min(nu·t + mu, 1)`` for ``t > 0`` (Eq. 43 with ``min`` instead of the
    paper's ``max`` typo). The hierarchical kernel sums it in closed form from prefix sums; :meth:`value` is the
    elementwise definition.
    """

    __slots__ = ("nu", "mu", "gamma")

    def __init__(self, nu: float = 25.0, mu: float = 0.5, gamma: float = 10.0) -> None:
        self.nu = check_positive("hrank_nu", nu)
        self.mu = check_probability("hrank_mu", mu)
        self.gamma = check_positive("hrank_gamma", gamma, strict=False)

    @property
    def saturation(self) -> float:
        """``(1 − μ) / ν``: the ``t`` from which ``H_s^>`` equals 1."""
        return (1.0 - self.mu) / self.nu

    def value(self, t: Tensor) -> Tensor:
        """``H_s^>(t)`` elementwise, same shape and dtype as ``t``."""
        return torch.where(t <= 0, self.gamma * t, torch.clamp(self.nu * t + self.mu, max=1.0))

    def __repr__(self) -> str:
        return f"HRankParams(nu={self.nu}, mu={self.mu}, gamma={self.gamma})"
