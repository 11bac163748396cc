"""Name → class registries of the OOD detectors and of HEAT's priors, filled by subclassing.

Defining a concrete subclass of :class:`~pml_suprank.ood.base.Detector` (or of :class:`~pml_suprank.ood.prior.Prior`
with a ``name=`` class keyword) registers it; there is no table to edit::

    class MyDetector(ood.Detector):              # registered as "MyDetector"
        requires_fit = False
        def _score(self, features=None, logits=None, **kwargs):
            return features.norm(dim=-1)

    ood.get_detector("MyDetector")               # -> MyDetector
    ood.list_detectors()                         # (..., "MyDetector")

Registering a second class under a taken name replaces the entry with a :class:`UserWarning` (re-running a
notebook cell redefines its class). :meth:`Registry.unregister` removes an entry.

The two registries are the only module-level mutable objects of :mod:`pml_suprank.ood`: they are written only when a
class is defined (or explicitly unregistered), never while fitting or scoring.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "Registry",
    "RegistryNames",
    "DETECTOR_REGISTRY",
    "PRIOR_REGISTRY",
    "list_detectors",
    "get_detector",
    "list_priors",
    "get_prior",
]


class Registry(Mapping[str, type]):
    """An ordered, read-mostly mapping ``name -> class`` (registration order).

    Args:
        kind: What is registered, used in error messages (``"detector"``, ``"HEAT prior"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, type] = {}

    def register(self, name: str, cls: type) -> type:
        """Add ``cls`` under ``name`` (warning when it replaces another class). Returns ``cls``."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.kind} name must be a non-empty string; got {name!r}")
        old = self._entries.get(name)
        if old is not None and old is not cls:
            warnings.warn(
                f"{self.kind} {name!r} is already registered by {old.__module__}.{old.__qualname__}; "
                f"replacing it with {cls.__module__}.{cls.__qualname__}",
                UserWarning,
                stacklevel=3,
            )
        self._entries[name] = cls
        return cls

    def unregister(self, name: str) -> type:
        """Remove and return the class registered under ``name`` (``ValueError`` if there is none)."""
        cls = self.get_class(name)
        del self._entries[name]
        return cls

    def get_class(self, name: Any) -> type:
        """The class registered under ``name``; ``ValueError`` listing the valid names otherwise."""
        if isinstance(name, str) and name in self._entries:
            return self._entries[name]
        raise ValueError(f"unknown {self.kind} {name!r}; expected one of {list(self._entries)}")

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._entries)

    def __getitem__(self, name: str) -> type:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


class RegistryNames(Sequence[str]):
    """Live, read-only tuple-like view of a registry's names (``ood.DETECTORS``: it used to be a tuple)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, index):
        return self._registry.names()[index]

    def __len__(self) -> int:
        return len(self._registry)

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RegistryNames, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._registry.names())

    def __repr__(self) -> str:
        return repr(self._registry.names())


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
