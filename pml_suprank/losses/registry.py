"""The loss registry: the one table of the losses the recipes train by name.

A loss class becomes trainable by the recipes (``--loss NAME``, hub_config ``loss.name``), is validated in
hub_configs, recorded in the run fingerprint and cited by the model card through ONE decorator::

    @register_loss("MyAP", hierarchical=False, multilabel=False, paper=("My paper (2026)", "https://..."))
    class MyAPLoss(BaseRankLoss):
        def __init__(self, tau: float = 0.01, kernel: str = "auto"): ...

What the entry says:

* ``hierarchical``: the loss takes all label columns ``(N, L)`` of a batch (fine → coarse), and its ClusterLoss
  proxies (if any) need ``num_classes`` / ``embedding_size``; otherwise it takes the fine labels ``(N,)``.
  ``recipes/train_happier.py`` trains the hierarchical losses, ``recipes/train_roadmap.py`` the others.
* ``multilabel``: the loss has a multi-label variant (``relevance="multilabel"`` with a ``hierarchy=`` table), so the
  ``synthetic_multilabel`` dataset may train it.
* ``paper``: ``(title, url)`` cited by the model card (``None``: the SupRank TPAMI paper).
* ``options``: the recipe loss options (``tau``, ``rho``, ``decomposability_weight``, ...) the constructor takes;
  ``None`` derives them from the named parameters of ``__init__``.

The registry is read, never copied: :func:`loss_entry` and :func:`registered_losses` return the current entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

__all__ = [
    "HAPPIER_PAPER",
    "SUPRANK_PAPER",
    "LossEntry",
    "loss_entry",
    "register_loss",
    "registered_losses",
    "unregister_loss",
]

T = TypeVar("T", bound=type)

#: the SupRank paper (the model card's citation for a loss registered without ``paper``)
SUPRANK_PAPER = (
    "Optimization of Rank Losses for Image Retrieval (Ramzi et al., TPAMI)",
    "https://arxiv.org/abs/2309.08250",
)
#: the HAPPIER paper
HAPPIER_PAPER = (
    "Hierarchical Average Precision Training for Pertinent Image Retrieval (Ramzi et al., ECCV 2022)",
    "https://arxiv.org/abs/2207.04873",
)


@dataclass(frozen=True)
class LossEntry:
    """One registered loss.

    Attributes:
        name: The recipe name (``--loss`` / hub_config ``loss.name``), e.g. ``"HAPPIER"``.
        cls: The ``nn.Module`` loss class.
        hierarchical: Trained on the ``(N, L)`` label columns (see the module docstring).
        multilabel: Has a multi-label variant (``relevance="multilabel"``, ``hierarchy=``).
        paper: ``(title, url)`` for the model card, or ``None``.
        options: Recipe loss options the constructor takes, or ``None`` (its named ``__init__`` parameters).
    """

    name: str
    cls: type
    hierarchical: bool
    multilabel: bool
    paper: tuple[str, str] | None
    options: tuple[str, ...] | None


# the table itself: written only by register_loss / unregister_loss
_REGISTRY: dict[str, LossEntry] = {}


def _check_paper(paper: Any) -> tuple[str, str] | None:
    if paper is None:
        return None
    if isinstance(paper, (tuple, list)) and len(paper) == 2 and all(isinstance(p, str) and p for p in paper):
        return (paper[0], paper[1])
    raise TypeError(f"paper must be None or a (title, url) pair of non-empty strings; got {paper!r}")


def register_loss(
    name: str,
    *,
    hierarchical: bool,
    multilabel: bool = False,
    paper: tuple[str, str] | None = None,
    options: Sequence[str] | None = None,
) -> Callable[[T], T]:
    """Class decorator: register the loss class under ``name`` (see the module docstring).

    Raises:
        TypeError: ``name`` is not a non-empty string, a flag is not a bool, ``paper`` is not a ``(title, url)`` pair,
            ``options`` is not a sequence of strings, or the decorated object is not an ``nn.Module`` class.
        ValueError: ``name`` is already registered for another class.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string; got {name!r}")
    for flag, value in (("hierarchical", hierarchical), ("multilabel", multilabel)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool; got {type(value).__name__} {value!r}")
    paper = _check_paper(paper)
    if options is not None:
        if isinstance(options, str) or not all(isinstance(o, str) and o for o in options):
            raise TypeError(f"options must be None or a sequence of option names; got {options!r}")
        options = tuple(options)

    def decorate(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"register_loss({name!r}) decorates an nn.Module class; got {cls!r}")
        previous = _REGISTRY.get(name)
        if previous is not None and previous.cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"loss name {name!r} is already registered for {previous.cls.__qualname__}")
        _REGISTRY[name] = LossEntry(name, cls, hierarchical, multilabel, paper, options)
        return cls

    return decorate


def unregister_loss(name: str) -> LossEntry:
    """Remove ``name`` from the registry and return its entry (e.g. a test's temporary loss)."""
    if name not in _REGISTRY:
        raise KeyError(f"loss {name!r} is not registered (registered: {sorted(_REGISTRY)})")
    return _REGISTRY.pop(name)


def registered_losses(*, hierarchical: bool | None = None, multilabel: bool | None = None) -> dict[str, LossEntry]:
    """The registered losses (registration order), optionally only the (non-)hierarchical / multi-label ones."""
    return {
        n: e
        for n, e in _REGISTRY.items()
        if (hierarchical is None or e.hierarchical == hierarchical)
        and (multilabel is None or e.multilabel == multilabel)
    }


def loss_entry(name: str) -> LossEntry:
    """The entry of the loss registered as ``name``, or of the registered class named ``name`` (e.g.
    ``"HAPPIERLoss"``, as written by ``save_pretrained``).

    Raises:
        ValueError: Nothing is registered under that name.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    for entry in _REGISTRY.values():
        if entry.cls.__name__ == name:
            return entry
    raise ValueError(f"loss must be one of {sorted(_REGISTRY)}; got {name!r}")
