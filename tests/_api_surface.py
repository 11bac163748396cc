"""The public surface of pml_suprank: the names one import away, as listed by ``__all__``.

Counted modules: the root package, every public subpackage (``pml_suprank.losses``, ...) and every public top-level
module (``pml_suprank.memory``, ...). Deeper modules (``pml_suprank.ranking.dense``, ...) are the expert namespace and
are not counted. Used by ``tests/test_api_snapshot.py`` and its ``--update`` command.
"""

from __future__ import annotations

import importlib
import pkgutil

import pml_suprank

NO_ALL = frozenset({"version"})  # modules without __all__: ``version`` only holds ``__version__`` (in the root)


def surface_modules() -> list[str]:
    """``["pml_suprank", "pml_suprank.data", ...]``: the root, public subpackages and public top-level modules."""
    names = [info.name for info in pkgutil.iter_modules(pml_suprank.__path__)]
    return ["pml_suprank"] + [f"pml_suprank.{n}" for n in sorted(names) if not n.startswith("_") and n not in NO_ALL]


def public_surface() -> dict[str, list[str]]:
    """``{module: sorted __all__}`` for every module of :func:`surface_modules` (each must define ``__all__``)."""
    out = {}
    for name in surface_modules():
        module = importlib.import_module(name)
        if not hasattr(module, "__all__"):
            raise AssertionError(f"{name} has no __all__; every public module lists its public names")
        out[name] = sorted(module.__all__)
    return out


def count_public_names(surface: dict[str, list[str]] | None = None) -> int:
    """Total number of public names one import away (the sum of the ``__all__`` lengths)."""
    surface = public_surface() if surface is None else surface
    return sum(len(names) for names in surface.values())
