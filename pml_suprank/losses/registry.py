"""The loss registry: the losses the recipes train by name (``--loss NAME``, hub_config ``loss.name``).

A loss class is registered by ONE decorator, which also makes it checkable in hub_configs, recorded in the run
fingerprint and cited by the model card::

    @register_loss("MyAP", hierarchical=False, multilabel=False, paper=("My paper (2026)", "https://..."))
    class MyAPLoss(BaseRankLoss):
        def __init__(self, tau: float = 0.01, kernel: str = "auto"): ...

Each loss has one name and one alias, its class name (as ``save_pretrained`` records it); a taken name is refused.
:func:`resolve_loss` also reads ``pml:ClassName`` (a PML loss, on the fine labels, ``--loss_kwargs``),
``package.module:ClassName`` (imported only when typed or passed in Python, never read from a file:
:func:`check_loss_name`) and names published under the entry-point group ``pml_suprank.losses``
(``[project.entry-points."pml_suprank.losses"] MyAP = "my_package.losses:MyAPLoss"``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from .._registry import Registry

__all__ = [
    "ENTRY_POINT_GROUP",
    "HAPPIER_PAPER",
    "SUPRANK_PAPER",
    "LossEntry",
    "check_loss_name",
    "entry_options",
    "installed_plugins",
    "loss_entry",
    "loss_keywords",
    "register_loss",
    "registered_losses",
    "resolve_loss",
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
#: the entry-point group under which installed distributions publish losses (name = the ``--loss`` name)
ENTRY_POINT_GROUP = "pml_suprank.losses"
_PML = "pml:"
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class LossEntry:
    """One registered loss.

    Attributes:
        name: The recipe name (``--loss`` / hub_config ``loss.name``), e.g. ``"HAPPIER"``.
        cls: The ``nn.Module`` loss class.
        hierarchical: Trained on the ``(N, L)`` label columns (fine → coarse); otherwise on the fine labels ``(N,)``.
        multilabel: Has a multi-label variant (``relevance="multilabel"`` with a ``hierarchy=`` table).
        paper: ``(title, url)`` for the model card, or ``None`` (the SupRank paper).
        options: Recipe loss options (``tau``, ``rho``...) the constructor takes (``None``: its named parameters).
    """

    name: str
    cls: type
    hierarchical: bool
    multilabel: bool
    paper: tuple[str, str] | None
    options: tuple[str, ...] | None


LOSSES = Registry("loss", on_conflict="refuse", origin=lambda entry: entry.cls)


def register_loss(
    name: str,
    *,
    hierarchical: bool,
    multilabel: bool = False,
    paper: tuple[str, str] | None = None,
    options: Sequence[str] | None = None,
) -> Callable[[T], T]:
    """Class decorator: register the loss class under ``name`` and its class name (see the module docstring).

    Raises:
        TypeError: ``name`` is not a non-empty string, a flag is not a bool, ``paper`` is not a ``(title, url)`` pair,
            ``options`` is not a sequence of strings, or the decorated object is not an ``nn.Module`` class.
        ValueError: ``name`` (or the class name) is already registered for another class.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string; got {name!r}")
    for flag, value in (("hierarchical", hierarchical), ("multilabel", multilabel)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool; got {type(value).__name__} {value!r}")
    if paper is not None and not (
        isinstance(paper, (tuple, list)) and len(paper) == 2 and all(isinstance(p, str) and p for p in paper)
    ):
        raise TypeError(f"paper must be None or a (title, url) pair of non-empty strings; got {paper!r}")
    if options is not None and (isinstance(options, str) or not all(isinstance(o, str) and o for o in options)):
        raise TypeError(f"options must be None or a sequence of option names; got {options!r}")

    def decorate(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"register_loss({name!r}) decorates an nn.Module class; got {cls!r}")
        entry = LossEntry(
            name, cls, hierarchical, multilabel, None if paper is None else tuple(paper),
            None if options is None else tuple(options),
        )  # fmt: skip
        taken = cls.__name__ in LOSSES.aliases() or cls.__name__ in LOSSES
        same = taken and LOSSES.get_class(cls.__name__).cls is cls  # the class under a second name
        aliases = () if cls.__name__ == name or same else (cls.__name__,)
        LOSSES.register(name, entry, aliases=aliases)
        return cls

    return decorate


def unregister_loss(name: str) -> LossEntry:
    """Remove ``name`` from the registry and return its entry (e.g. a test's temporary loss)."""
    if name not in LOSSES:
        raise KeyError(f"loss {name!r} is not registered (registered: {sorted(LOSSES)})")
    return LOSSES.unregister(name)


def registered_losses(*, hierarchical: bool | None = None, multilabel: bool | None = None) -> dict[str, LossEntry]:
    """The registered losses (registration order), optionally only the (non-)hierarchical / multi-label ones."""
    return {
        n: e
        for n, e in LOSSES.items()
        if (hierarchical is None or e.hierarchical == hierarchical)
        and (multilabel is None or e.multilabel == multilabel)
    }


def loss_entry(name: str) -> LossEntry:
    """The entry of the loss registered as ``name`` or under its class name (``ValueError`` otherwise)."""
    try:
        return LOSSES.get_class(name)
    except ValueError:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}; got {name!r}") from None


def check_loss_name(name: Any, *, from_file: bool = False) -> str | None:
    """Why ``name`` is not a ``--loss`` value (``None``: it may be one), WITHOUT importing anything; ``from_file``:
    read from a file (hub_config, ``--config`` YAML, model folder), where a ``module:Class`` name is refused."""
    if not isinstance(name, str) or not name:
        return f"a non-empty string; got {name!r}"
    if name in LOSSES or name in LOSSES.aliases():
        return None
    if name.startswith(_PML):  # the host library's own, already imported package
        from pytorch_metric_learning import losses as pml_losses

        cls = getattr(pml_losses, name[len(_PML) :], None)
        ok = isinstance(cls, type) and issubclass(cls, pml_losses.BaseMetricLossFunction)
        return None if ok else f"pml:ClassName of a pytorch_metric_learning loss; got {name!r}"
    if _MODULE_NAME.fullmatch(name):
        if from_file:
            return (
                f"a registered loss or pml:ClassName in a file; got {name!r}: a package.module:ClassName loss is "
                "imported only when typed on the command line (--loss) or passed in Python, never from a file"
            )
        return None
    plugins = installed_plugins()
    if name in plugins:
        return None
    return (
        f"one of {sorted(LOSSES)}" + (f", an installed plugin ({', '.join(plugins)})" if plugins else "")
        + f", pml:ClassName (pytorch-metric-learning) or package.module:ClassName; got {name!r}"
    )  # fmt: skip


def _plugin_entry_points() -> dict[str, Any]:
    """``{name: entry point}`` of :data:`ENTRY_POINT_GROUP` in installed distributions only (``sys.path`` without the
    working directory Python puts first: a downloaded folder one runs in must not publish plugins)."""
    cwd = os.path.realpath(os.getcwd())
    paths = [p for i, p in enumerate(sys.path) if p and not (i == 0 and os.path.realpath(p) == cwd)]
    out: dict[str, Any] = {}
    for dist in importlib.metadata.distributions(path=paths):
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                out.setdefault(ep.name, ep)
    return out


def installed_plugins() -> tuple[str, ...]:
    """The loss names installed distributions publish (entry-point group :data:`ENTRY_POINT_GROUP`), not loaded."""
    return tuple(sorted(_plugin_entry_points()))


def _import_class(name: str, *, search_cwd: bool) -> type:
    """The ``nn.Module`` class ``module:Class`` (``pml:Class``) names; ``search_cwd``: the working directory is
    searched first, as ``python -m`` does (a name typed on the command line)."""
    module, _, attr = name.partition(":")
    module = "pytorch_metric_learning.losses" if module == "pml" else module
    added = search_cwd and module != "pytorch_metric_learning.losses" and os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except ImportError as e:  # the real cause (a missing module, or a missing dependency inside it)
        raise ValueError(f"loss {name!r}: cannot import module {module!r}: {type(e).__name__}: {e}") from e
    finally:
        if added:
            sys.path.remove(os.getcwd())
    cls = getattr(mod, attr, None)
    if cls is None:
        close = difflib.get_close_matches(attr, [n for n in dir(mod) if not n.startswith("_")], n=1, cutoff=0.85)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"loss {name!r}: AttributeError: module {module!r} has no attribute {attr!r}{hint}")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"loss {name!r}: {module} has no nn.Module class {attr!r}")
    return cls


def _is_metric_loss(cls: type) -> bool:
    """A PML ``BaseMetricLossFunction``, or an ``nn.Module`` whose ``forward`` takes ``(embeddings, labels, ...)``
    (``torch.nn.MSELoss(input, target)`` is not one)."""
    from pytorch_metric_learning.losses import BaseMetricLossFunction

    if issubclass(cls, BaseMetricLossFunction):
        return True
    return [p for p in inspect.signature(cls.forward).parameters if p != "self"][:2] == ["embeddings", "labels"]


def resolve_loss(name: str, *, search_cwd: bool = False) -> LossEntry:
    """The entry of the ``--loss`` value ``name``: a registered name or class name, ``pml:Class``,
    ``package.module:Class`` or an installed plugin's name (module docstring). The one place a loss module is
    imported: call it for a name typed on the command line or passed in Python, never for a name read from a file.
    An unregistered class gets an entry with ``hierarchical`` read from its class attribute (default ``False``).

    Args:
        name: The loss name.
        search_cwd: Import a ``package.module:Class`` from the working directory too, as ``python -m`` does.

    Raises:
        ValueError: ``name`` names no loss (the message gives the import error or the accepted spellings).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"loss must be a non-empty string; got {name!r}")
    if name in LOSSES or name in LOSSES.aliases():
        return LOSSES.get_class(name)
    if ":" in name:
        if not name.startswith(_PML) and not _MODULE_NAME.fullmatch(name):
            raise ValueError(f"loss {name!r}: expected a registered name, pml:ClassName or package.module:ClassName")
        cls = _import_class(name, search_cwd=search_cwd)
        registered = [e for e in LOSSES.values() if e.cls is cls]
        if registered:
            return registered[0]
        if not _is_metric_loss(cls):
            raise ValueError(
                f"loss {name!r}: {cls.__module__}.{cls.__qualname__} is not a metric loss: expected a "
                "pytorch_metric_learning BaseMetricLossFunction or an nn.Module with forward(embeddings, labels, ...)"
            )
        if name.startswith(_PML):  # a baseline: fine labels, its options only through --loss_kwargs
            return LossEntry(name, cls, False, False, None, ())
        return LossEntry(name, cls, bool(getattr(cls, "hierarchical", False)), False, None, None)
    ep = _plugin_entry_points().get(name)
    if ep is None:
        raise ValueError(f"loss must be {check_loss_name(name)}")
    cls = ep.load()
    if name not in LOSSES:  # published without the decorator (or under another registered name)
        register_loss(name, hierarchical=bool(getattr(cls, "hierarchical", False)))(cls)
    return LOSSES[name]


def entry_options(entry: LossEntry, option_names: Sequence[str]) -> tuple[str, ...]:
    """The recipe options (of ``option_names``: ``tau``, ``rho``...) the loss of ``entry`` takes: its ``options``,
    or those that are named parameters of its constructor."""
    if entry.options is not None:
        return entry.options
    params = inspect.signature(entry.cls.__init__).parameters
    return tuple(n for n in option_names if n in params and n not in ("loss", "loss_kwargs"))


def loss_keywords(cls: type) -> frozenset[str] | None:
    """The keyword arguments the loss class ``cls`` accepts, read from the ``__init__`` signatures along its MRO
    while they pass on ``**kwargs``; ``None`` for the package's own losses."""
    if cls.__module__.startswith(f"{__package__}."):
        return None
    names: set[str] = set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind in kinds and p.name != "self"}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return frozenset(names)
