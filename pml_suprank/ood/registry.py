"""Name → class registries of the OOD detectors and of HEAT's priors, filled by subclassing.

Defining a concrete subclass of :class:`~pml_suprank.ood.base.Detector` (or of :class:`~pml_suprank.ood.prior.Prior`
with a ``name=`` class keyword) registers it; there is no table to edit::

    class MyDetector(ood.Detector):              # registered as "MyDetector"
        requires_fit = False
        def _score(self, features=None, logits=None, **kwargs):
            return features.norm(dim=-1)

    ood.get_detector("MyDetector")               # -> MyDetector
    ood.list_detectors()                         # (..., "MyDetector")

Both are :class:`pml_suprank._registry.Registry` objects: registering a second class under a taken name replaces the
entry with a :class:`UserWarning` (re-running a notebook cell redefines its class); ``unregister`` removes an entry.

The two registries are the only module-level mutable objects of :mod:`pml_suprank.ood`: they are written only when a
class is defined (or explicitly unregistered), never while fitting or scoring.
"""

from __future__ import annotations

from .._registry import Registry

__all__ = ["DETECTOR_REGISTRY", "PRIOR_REGISTRY", "list_detectors", "get_detector", "list_priors", "get_prior"]

DETECTOR_REGISTRY = Registry("detector")
PRIOR_REGISTRY = Registry("HEAT prior")


def list_detectors() -> tuple[str, ...]:
    """Names of the registered detectors (every concrete :class:`Detector` subclass defined so far)."""
    return DETECTOR_REGISTRY.names()


def get_detector(name: str) -> type:
    """The detector class registered under ``name`` (its class name); ``ValueError`` listing the valid names."""
    return DETECTOR_REGISTRY.get_class(name)


def list_priors() -> tuple[str, ...]:
    """Names of the registered HEAT priors (``"gmm"``, ``"gmm_std"``, ``"el"`` and any user-defined prior)."""
    return PRIOR_REGISTRY.names()


def get_prior(name: str) -> type:
    """The :class:`~pml_suprank.ood.prior.Prior` subclass registered under ``name``; ``ValueError`` otherwise."""
    return PRIOR_REGISTRY.get_class(name)
