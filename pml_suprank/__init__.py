"""pml-suprank: rank losses, exact retrieval evaluation and HEAT for pytorch-metric-learning. Subpackages are
imported lazily: ``import pml_suprank`` needs only torch, numpy and pytorch-metric-learning (``models``, ``hub``,
``data``: the ``recipes`` extra).

Example:
    >>> from pml_suprank import losses
    >>> loss_fn = losses.ROADMAPLoss()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

__all__ = [
    "__version__",
    "data",
    "hub",
    "losses",
    "memory",
    "metrics",
    "models",
    "ood",
    "plots",
    "ranking",
    "relevance",
    "samplers",
    "search",
    "training",
]

_SUBMODULES = frozenset(__all__) - {"__version__"}

if TYPE_CHECKING:  # pragma: no cover - for static analysers only
    from . import (
        data,
        hub,
        losses,
        memory,
        metrics,
        models,
        ood,
        plots,
        ranking,
        relevance,
        samplers,
        search,
        training,
    )


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
