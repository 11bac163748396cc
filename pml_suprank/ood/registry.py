"""Name → class registries of the OOD detectors and of HEAT's priors, filled by subclassing (no table to edit).

Both are :class:`pml_suprank._registry.Registry` objects, written only when a class is defined or unregistered:
registering a second class under a taken name replaces it with a :class:`UserWarning`.
"""

from __future__ import annotations

from .._registry import Registry

__all__ = ["DETECTOR_REGISTRY", "PRIOR_REGISTRY", "list_detectors", "get_detector", "list_priors", "get_prior"]

DETECTOR_REGISTRY = Registry("detector")
PRIOR_REGISTRY = Registry("HEAT prior")


def list_detectors() -> tuple[str, ...]:
    """Names of the registered detectors."""
    return DETECTOR_REGISTRY.names()


def get_detector(name: str) -> type:
    """The detector class registered under ``name``; ``ValueError`` listing the valid names."""
    return DETECTOR_REGISTRY.get_class(name)


def list_priors() -> tuple[str, ...]:
    """Names of the registered HEAT priors (``"gmm"``, ``"gmm_std"``, ``"el"``, user-defined ones)."""
    return PRIOR_REGISTRY.names()


def get_prior(name: str) -> type:
    """The :class:`~pml_suprank.ood.priors.Prior` subclass registered under ``name``; ``ValueError`` listing them."""
    return PRIOR_REGISTRY.get_class(name)
