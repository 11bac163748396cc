"""The loss registry: the one table of the losses the recipes train by name.

A loss class becomes trainable by the recipes (``--loss NAME``, hub_config ``loss.name``), is validated in
hub_configs, recorded in the run fingerprint and cited by the model card through ONE decorator::

    @register_loss("MyAP", hierarchical=False, multilabel=False, paper=("My paper (2026)", "https://..."))
    class MyAPLoss(BaseRankLoss):
        def __init__(self, tau: float = 0.01, kernel: str = "auto"): ...

What the entry says:

* ``hierarchical``: the loss takes all label columns ``(N, L)`` of a batch (fine → coarse), and its ClusterLoss
  proxies (if any) need ``num_classes`` / ``embedding_size``; otherwise it takes the fine labels ``(N,)``.
  Every loss trains with the one training command (``recipes/train.py``; ``train_happier`` / ``train_roadmap`` are
  its presets).
* ``multilabel``: the loss has a multi-label variant (``relevance="multilabel"`` with a ``hierarchy=`` table), so the
  ``synthetic_multilabel`` dataset may train it.
* ``paper``: ``(title, url)`` cited by the model card (``None``: the SupRank TPAMI paper).
* ``options``: the recipe loss options (``tau``, ``rho``, ``decomposability_weight``, ...) the constructor takes;
  ``None`` derives them from the named parameters of ``__init__``.

The registry is read, never copied: :func:`loss_entry` and :func:`registered_losses` return the current entries.

Every rank loss of the package is registered (:data:`BUILTIN_LOSSES`: Smooth-AP, SupAP, ROADMAP, Sup-R@k, ROD-R@k,
Sup-H-AP, HAPPIER, Sup-NDCG, ROD-NDCG, CSL; HAPPIER_F is HAPPIER with ``alpha > 1``). Besides a registered name,
:func:`resolve_loss` reads three more spellings of ``--loss``:

* ``pml:ClassName`` — a loss of ``pytorch_metric_learning.losses`` as a baseline (``pml:MultiSimilarityLoss``,
  ``pml:ArcFaceLoss``...), trained on the fine labels, its arguments given by ``--loss_kwargs``;
* ``package.module:ClassName`` — a loss class of an importable module (your own file on ``PYTHONPATH``), with the
  decorator above or none (then it takes the fine labels unless the class sets ``hierarchical = True``);
* a name published by an installed package under the entry-point group ``pml_suprank.losses``
  (``[project.entry-points."pml_suprank.losses"] MyAP = "my_package.losses:MyAPLoss"``), loaded when first asked for.
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

__all__ = [
    "BUILTIN_LOSSES",
    "ENTRY_POINT_GROUP",
    "check_loss_name",
    "installed_plugins",
    "is_import_name",
    "HAPPIER_PAPER",
    "SUPRANK_PAPER",
    "LossEntry",
    "entry_options",
    "loss_entry",
    "loss_keywords",
    "register_builtin_losses",
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


def _origin(cls: type) -> tuple[str, str]:
    """Where a class is defined: ``(module, qualified name)``."""
    return cls.__module__, cls.__qualname__


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
        if previous is not None and _origin(previous.cls) != _origin(cls):  # the same class re-imported is no change
            raise ValueError(
                f"loss name {name!r} is already registered for {previous.cls.__qualname__} (module "
                f"{previous.cls.__module__}); register {cls.__qualname__} of {cls.__module__} under another name (or "
                f"unregister_loss({name!r}) first)"
            )
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


#: the entry-point group under which installed packages publish losses (name = the ``--loss`` name)
ENTRY_POINT_GROUP = "pml_suprank.losses"
#: the prefix of a pytorch-metric-learning loss (``pml:MultiSimilarityLoss``)
PML_PREFIX = "pml:"
_SMOOTH_AP_PAPER = ("Smooth-AP: Smoothing the Path Towards Large-Scale Image Retrieval (Brown et al., ECCV 2020)",
                    "https://arxiv.org/abs/2007.12163")  # fmt: skip
_CSL_PAPER = ("Dynamic Metric Learning: Towards a Scalable Metric Space to Accommodate Multiple Semantic Scales "
              "(Sun et al., CVPR 2021)", "https://arxiv.org/abs/2103.11781")  # fmt: skip
_SUPRANK = ("tau", "rho", "delta", "start", "offset", "kernel")
_COMBINED = ("decomposability", "decomposability_weight", *_SUPRANK)

#: the rank losses of the package: ``(name, "module:Class" under pml_suprank.losses, hierarchical, multilabel, paper,
#: options)`` (HAPPIER, ROADMAP and ROD-NDCG are registered by their modules' decorators)
BUILTIN_LOSSES: tuple[tuple[str, str, bool, bool, tuple[str, str], tuple[str, ...] | None], ...] = (
    ("Smooth-AP", "smooth_ap_loss:SmoothAPLoss", False, False, _SMOOTH_AP_PAPER, ("kernel",)),
    ("SupAP", "sup_ap_loss:SupAPLoss", False, False, SUPRANK_PAPER, _SUPRANK),
    ("Sup-R@k", "sup_recall_loss:SupRecallLoss", False, False, SUPRANK_PAPER, _SUPRANK),
    ("ROD-R@k", "rod_recall_loss:RODRecallLoss", False, False, SUPRANK_PAPER, _COMBINED),
    ("Sup-H-AP", "sup_hap_loss:SupHAPLoss", True, True, HAPPIER_PAPER, (*_SUPRANK, "alpha")),
    ("Sup-NDCG", "sup_ndcg_loss:SupNDCGLoss", True, True, SUPRANK_PAPER, _SUPRANK),
    ("CSL", "csl_loss:CSLLoss", True, False, _CSL_PAPER, ()),
)


def register_builtin_losses() -> None:
    """Register :data:`BUILTIN_LOSSES` (called once by :mod:`pml_suprank.losses`)."""
    for name, path, hierarchical, multilabel, paper, options in BUILTIN_LOSSES:
        module, _, attr = path.partition(":")
        cls = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
        register_loss(name, hierarchical=hierarchical, multilabel=multilabel, paper=paper, options=options)(cls)


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def is_import_name(name: Any) -> bool:
    """``name`` is spelled ``package.module:ClassName`` (not ``pml:``): a loss that :func:`resolve_loss` imports."""
    return isinstance(name, str) and not name.startswith(PML_PREFIX) and bool(_MODULE_NAME.fullmatch(name))


def check_loss_name(name: Any, *, from_file: bool = False) -> str | None:
    """Why ``name`` is not a ``--loss`` value (``None``: it may be one), WITHOUT importing anything: a registered
    name or class name, an installed plugin's name (read from the distributions' metadata, not loaded),
    ``pml:ClassName`` or ``package.module:ClassName``. ``from_file``: the name was read from a file (a hub_config,
    a ``--config`` YAML, a model folder), where a ``module:Class`` name is refused — files are data, only a name
    typed on the command line or passed in Python is imported (:func:`resolve_loss`)."""
    if not isinstance(name, str) or not name:
        return f"a non-empty string; got {name!r}"
    if name in _REGISTRY or any(e.cls.__name__ == name for e in _REGISTRY.values()):
        return None
    if name.startswith(PML_PREFIX):  # the fixed, already imported package of the host library
        from pytorch_metric_learning import losses as pml_losses

        cls = getattr(pml_losses, name[len(PML_PREFIX):], None)
        ok = isinstance(cls, type) and issubclass(cls, pml_losses.BaseMetricLossFunction)
        return None if ok else f"pml:ClassName of a pytorch_metric_learning loss; got {name!r}"
    if is_import_name(name):
        if from_file:
            return (
                f"a registered loss or pml:ClassName in a file; got {name!r}: a package.module:ClassName loss is "
                "imported only when typed on the command line (--loss) or passed in Python, never from a file"
            )
        return None
    if name in installed_plugins():
        return None
    plugins = sorted(installed_plugins())
    return (
        f"one of {sorted(_REGISTRY)}" + (f", an installed plugin ({', '.join(plugins)})" if plugins else "")
        + f", pml:ClassName (pytorch-metric-learning) or package.module:ClassName; got {name!r}"
    )


def _trusted_paths() -> list[str]:
    """The import paths whose distributions count as installed: ``sys.path`` without the working directory that
    Python puts first (``''`` or the folder ``python -m`` runs from: a downloaded folder one runs in must not publish
    plugins); a folder named on ``PYTHONPATH`` appears again later and is kept."""
    cwd = os.path.realpath(os.getcwd())
    return [p for i, p in enumerate(sys.path) if p and not (i == 0 and os.path.realpath(p) == cwd)]


def _plugin_entry_points() -> dict[str, Any]:
    """``{name: entry point}`` of the group :data:`ENTRY_POINT_GROUP` in installed distributions only."""
    out: dict[str, Any] = {}
    for dist in importlib.metadata.distributions(path=_trusted_paths()):
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                out.setdefault(ep.name, ep)
    return out


def installed_plugins() -> tuple[str, ...]:
    """The loss names installed distributions publish (entry-point group :data:`ENTRY_POINT_GROUP`), not loaded."""
    return tuple(sorted(_plugin_entry_points()))


def _import_class(name: str, *, search_cwd: bool) -> type:
    """The class ``module:Class`` names (``pml:Class``: of ``pytorch_metric_learning.losses``); ``search_cwd``:
    the working directory is searched first, as ``python -m`` does (a name typed on the command line)."""
    module, _, attr = name.partition(":")
    module = "pytorch_metric_learning.losses" if module == "pml" else module
    if not module or not attr:
        raise ValueError(f"loss {name!r}: expected a registered name, pml:ClassName or package.module:ClassName")
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
    """A class trainable as a metric loss: a PML ``BaseMetricLossFunction``, or an ``nn.Module`` whose ``forward``
    takes ``(embeddings, labels, ...)`` (PML's call convention; ``torch.nn.MSELoss(input, target)`` is not one)."""
    from pytorch_metric_learning.losses import BaseMetricLossFunction

    if issubclass(cls, BaseMetricLossFunction):
        return True
    params = [p for p in inspect.signature(cls.forward).parameters if p != "self"]
    return params[:2] == ["embeddings", "labels"]


def _entry_point(name: str) -> LossEntry | None:
    """Load the loss an installed package publishes as ``name`` (entry-point group :data:`ENTRY_POINT_GROUP`)."""
    ep = _plugin_entry_points().get(name)
    if ep is None:
        return None
    cls = ep.load()
    if name not in _REGISTRY:  # published without the decorator (or under another registered name)
        register_loss(name, hierarchical=bool(getattr(cls, "hierarchical", False)))(cls)
    return _REGISTRY[name]


def resolve_loss(name: str, *, search_cwd: bool = False) -> LossEntry:
    """The entry of the ``--loss`` value ``name``: a registered name (or registered class name), ``pml:Class``,
    ``package.module:Class`` or an installed plugin's name (see the module docstring). A class from a module that
    registers it with the decorator gets its registered entry; others get one with ``hierarchical`` read from the
    class attribute of that name (default ``False``). This is the one place a loss module is imported: call it for
    a name typed on the command line or passed in Python, never for a name read from a file
    (:func:`check_loss_name` checks those without importing).

    Args:
        name: The loss name.
        search_cwd: Import a ``package.module:Class`` from the working directory too, as ``python -m`` does (the
            recipes, for a name typed on the command line).

    Raises:
        ValueError: ``name`` names no loss; the message gives the real cause (the ImportError / AttributeError of a
            ``module:Class`` name, the registered names and the other spellings).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"loss must be a non-empty string; got {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        cls = _import_class(name, search_cwd=search_cwd)
        for entry in _REGISTRY.values():
            if entry.cls is cls:
                return entry
        if not _is_metric_loss(cls):
            raise ValueError(
                f"loss {name!r}: {cls.__module__}.{cls.__qualname__} is not a metric loss: expected a "
                "pytorch_metric_learning BaseMetricLossFunction or an nn.Module with forward(embeddings, labels, ...)"
            )
        if name.startswith(PML_PREFIX):  # a baseline: fine labels, its options only through --loss_kwargs
            return LossEntry(name, cls, False, False, None, ())
        return LossEntry(name, cls, bool(getattr(cls, "hierarchical", False)), False, None, None)
    entry = _entry_point(name)
    if entry is not None:
        return entry
    try:
        return loss_entry(name)
    except ValueError:
        raise ValueError(f"loss must be {check_loss_name(name)}") from None


def entry_options(entry: LossEntry, option_names: Sequence[str]) -> tuple[str, ...]:
    """The recipe options (of ``option_names``: ``tau``, ``rho``...) the loss of ``entry`` takes: its ``options``,
    or those that are named parameters of its constructor."""
    if entry.options is not None:
        return entry.options
    params = inspect.signature(entry.cls.__init__).parameters
    return tuple(n for n in option_names if n in params and n not in ("loss", "loss_kwargs"))


def loss_keywords(cls: type) -> frozenset[str] | None:
    """The keyword arguments the loss class ``cls`` accepts, read from the ``__init__`` signatures along its MRO
    (an ``__init__`` with ``**kwargs`` passes them on to its base); ``None`` when they cannot be read that way (the
    package's combined losses hand their ``**kwargs`` to an inner loss)."""
    if cls.__module__.startswith(f"{__package__}."):
        return None
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names |= {p.name for p in params if p.kind in kinds and p.name != "self"}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return frozenset(names)
