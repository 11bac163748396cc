"""The SupRank step ``H⁻`` (SupRank paper Eq. 4) as held by the losses built on it, and the name of its ``τ``.

``τ`` of ``H⁻`` is ``tau=`` or its alias ``temperature=`` (:func:`resolve_tau`), except in Sup-R@k, where
``temperature=`` is the outer ``τ*`` (SupRank Eq. 16).
"""

from __future__ import annotations

from dataclasses import replace

from .._validation import check_positive
from ..ranking import SupRankStep

__all__ = ["DEFAULT_TAU", "STEP_OPTIONS", "SupRankStepMixin", "pop_step_options", "resolve_tau"]

DEFAULT_TAU = 0.01
STEP_OPTIONS = ("tau", "rho", "delta", "start", "offset")


def resolve_tau(tau: float | None, temperature: float | None, owner: str) -> float:
    """The ``τ`` of ``H⁻`` given as ``tau=`` or ``temperature=`` (``None`` for both: ``0.01``).

    Raises:
        ValueError: when both are given with different values.
    """
    if temperature is not None:
        check_positive("temperature", temperature)
    if tau is None:
        return DEFAULT_TAU if temperature is None else temperature
    if temperature is not None and float(tau) != float(temperature):
        raise ValueError(
            f"{owner} takes the τ of H⁻ as tau= or temperature= (aliases); got tau={tau!r} and "
            f"temperature={temperature!r}: give one of them"
        )
    return tau


def pop_step_options(owner: str, kwargs: dict, *, temperature_is_tau: bool = True) -> dict:
    """Remove the ``H⁻`` options from ``kwargs`` and return them, ``tau`` resolved (see :func:`resolve_tau`).

    Args:
        owner: the loss's name, for error messages.
        kwargs: keyword arguments of a loss constructor (modified in place).
        temperature_is_tau: treat ``temperature`` as an alias of ``tau`` (False for Sup-R@k, whose
            ``temperature`` is its outer ``τ*`` and stays in ``kwargs``).
    """
    options = {key: kwargs.pop(key) for key in STEP_OPTIONS if key in kwargs}
    temperature = kwargs.pop("temperature", None) if temperature_is_tau else None
    options["tau"] = resolve_tau(options.get("tau"), temperature, owner)
    return options


class SupRankStepMixin:
    """Holds the SupRank step ``H⁻`` and mirrors its hyper-parameters as attributes (``tau``, ``rho``, ``delta``,
    ``start``, ``offset`` — the resolved value at ``t = δ⁺``)."""

    def init_step(
        self,
        tau: float = DEFAULT_TAU,
        rho: float = 100.0,
        delta: float = 0.05,
        start: float = 0.5,
        offset: float | None = None,
    ) -> None:
        """Build ``self.step = SupRankStep(...)`` (arguments validated there) and set the attributes."""
        self.step = SupRankStep(tau=tau, rho=rho, delta=delta, start=start, offset=offset)
        self.tau, self.rho, self.delta, self.start = self.step.tau, self.step.rho, self.step.delta, self.step.start
        self.offset = self.step.resolved_offset
        self.constant_step()  # resolved now, eagerly: a later call (perhaps under torch.compile) only reads it

    def constant_step(self) -> SupRankStep:
        """``self.step`` with its offset resolved to a number (cached per step object): the dense kernel's hot path
        then has no host round trip (:func:`~pml_suprank.ranking.default_offset`) and no graph break."""
        cached = self.__dict__.get("_constant_step")
        if cached is None or cached[0] is not self.step:
            step = self.step if self.step.offset is not None else replace(self.step, offset=self.step.resolved_offset)
            cached = (self.step, step)
            self.__dict__["_constant_step"] = cached
        return cached[1]
