"""The run specification: the whole configuration of one training run, built once and validated once.

:class:`RunSpec` nests the option dataclasses, one per part of a run:

* ``model`` — :class:`~pml_suprank.training.ModelOptions` (the :class:`~pml_suprank.models.RetrievalModel`);
* ``data`` — :class:`~pml_suprank.training.DataOptions` (training / test sets);
* ``loss`` — :class:`~pml_suprank.training.LossOptions` (a loss of the registry,
  :func:`pml_suprank.losses.register_loss`, and its hyper-parameters);
* ``train`` — :class:`~pml_suprank.training.TrainingConfig` (optimizer, schedule, sampler, memory, evaluation,
  checkpoints, gradient caching's ``virtual_batch_size`` / ``chunk_size``);
* ``run`` — :class:`~pml_suprank.training.RunOptions` (hardware, tracking, resume, outputs, publishing);

plus ``hub_config``, the merged YAML file(s) as read (metadata for the model card: ``hub.*``, ``name``, ``notes``).

The training command builds it with :func:`pml_suprank.training.spec.parse` (``parse(RunSpec, argv,
defaults=preset, read_config=hub_config.read_layer)``: field defaults < the preset < ``--config`` hub_configs <
flags), Python with
:meth:`RunSpec.from_values`. Each part checks its own fields when built, the rules between parts run once
(:func:`~pml_suprank.training.rules.spec_problems`) and the loss is resolved once. The run fingerprint
(:meth:`RunSpec.run_options`), ``config.json`` (:meth:`RunSpec.loss_kwargs`) and the model card are written from it.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from torch import nn

from ..data.source import resolved_split
from ..losses.registry import LossEntry, registered_losses, resolve_loss
from .config import OptionError, TrainingConfig
from .options import (
    DataOptions,
    LossOptions,
    ModelOptions,
    RunOptions,
    build_loss,
    loss_keys,
    loss_option_names,
)
from .rules import spec_problems

__all__ = ["PARTS", "RunSpec", "losses_listing", "merge_hub_configs"]

#: part name of a :class:`RunSpec` → its option dataclass (the order of ``--help``)
PARTS: dict[str, type] = {
    "run": RunOptions,
    "data": DataOptions,
    "model": ModelOptions,
    "loss": LossOptions,
    "train": TrainingConfig,
}
#: option name (= flag name) → the part of :class:`RunSpec` holding it
FIELD_PARTS: dict[str, str] = {f.name: part for part, cls in PARTS.items() for f in fields(cls)}
_TITLES = {"run": "run", "data": "data", "model": "model", "loss": "loss (SupRank H⁻ and decomposability)",
           "train": "training"}  # fmt: skip


def losses_listing() -> str:
    """Every loss the training command trains: the registered ones (with their labels and options), the installed
    plugins and the other spellings of ``--loss``."""
    from ..losses.registry import ENTRY_POINT_GROUP, installed_plugins

    lines = ["registered losses (--loss NAME):"]
    for name, entry in registered_losses().items():
        labels = "hierarchical labels (N, L)" if entry.hierarchical else "fine labels (N,)"
        extra = ", multi-label" if entry.multilabel else ""
        options = ", ".join(loss_keys(name, entry))
        lines.append(f"  {name:<10} {entry.cls.__name__:<15} {labels}{extra}; options: {options}")
    plugins = [name for name in installed_plugins() if name not in registered_losses()]
    if plugins:
        lines.append(f"installed plugins (entry-point group {ENTRY_POINT_GROUP}): {', '.join(plugins)}")
    lines += [
        "pytorch-metric-learning baselines: --loss pml:ClassName (e.g. pml:MultiSimilarityLoss, pml:ArcFaceLoss), "
        "arguments by --loss_kwargs",
        "your own loss class: --loss package.module:ClassName (imported from the working directory or PYTHONPATH; "
        "typed on the command line only, never read from a --config file)",
    ]
    return "\n".join(lines)


class _ListLosses(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=kwargs.get("help"))

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        print(losses_listing())  # noqa: T201 - the command's answer, as --help
        parser.exit()


@dataclass
class RunSpec:
    """The configuration of one run (see the module docstring): build it with
    :func:`~pml_suprank.training.spec.parse` or :meth:`from_values`; each part checks its fields when built, the
    rules between parts run once.

    ``given`` holds the options the user set (flags and ``--config`` keys, not the recipe's defaults): a recipe does
    not change those on its own (e.g. a batch the data cannot fill is refused rather than shrunk).
    """

    model: ModelOptions = field(default_factory=ModelOptions)
    data: DataOptions = field(default_factory=DataOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    train: TrainingConfig = field(default_factory=TrainingConfig)
    run: RunOptions = field(default_factory=RunOptions)
    hub_config: dict[str, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()
    _entry: LossEntry | None = field(default=None, repr=False, compare=False)  # resolved once, kept by replace()

    CONFIG_APPEND = True
    CONFIG_HELP = (
        "hub_config: a bundled name (e.g. happier_sop; pml_suprank.training.hub_config.bundled_hub_configs()) or a "
        "YAML file; repeat it to lay partial override files over a base; command-line flags override the files"
    )
    GROUPS = tuple((_TITLES[part], fields(cls)[0].name) for part, cls in PARTS.items())

    # ----------------------------------------------------------------------------------------------------- building
    @classmethod
    def option_classes(cls) -> tuple[type, ...]:
        """The option dataclasses whose fields are the flags (:func:`~pml_suprank.training.spec.parse`)."""
        return tuple(PARTS.values())

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """``--list_losses`` and the listing of the losses after ``--help``."""
        parser.epilog = losses_listing()
        parser.add_argument("--list_losses", action=_ListLosses, help="list every loss --loss takes, and exit")

    @classmethod
    def from_options(
        cls,
        values: Mapping[str, Any],
        *,
        given: frozenset[str] = frozenset(),
        where: Mapping[str, str] | None = None,
        files: Sequence[Mapping[str, Any]] = (),
        require_data_root: bool = True,
    ) -> RunSpec:
        """The spec of merged option ``values`` (:func:`~pml_suprank.training.spec.parse`): the loss resolved once (a
        name typed as ``--loss`` is imported from the working directory too, as ``python -m`` does), each part built
        (its fields checked once, named by ``where``: field → ``--flag`` or ``file: section.key``), the rules
        between parts run once.

        Raises:
            OptionError: an unknown option, refused values or broken rules.
        """
        where = dict(where or {})
        unknown = sorted(set(values) - set(FIELD_PARTS))
        if unknown:
            raise OptionError(f"unknown option(s) {unknown}; valid options: {sorted(FIELD_PARTS)}")
        name = values.get("loss", LossOptions.__dataclass_fields__["loss"].default)
        try:  # a file's loss name was refused by its reader unless registered or pml: (files are data)
            entry = resolve_loss(name, search_cwd=where.get("loss", "").startswith("--"))
        except ValueError as e:
            raise OptionError([("loss", f"refused: {e}")]) from None
        by_part: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
        for key, value in values.items():
            by_part[FIELD_PARTS[key]][key] = list(value) if isinstance(value, tuple) else value
        parts, problems = {}, []
        for part, kwargs in by_part.items():
            try:
                parts[part] = PARTS[part](**kwargs)
            except OptionError as e:
                problems += e.problems
        if problems:
            raise OptionError(problems)
        spec = cls(**parts, hub_config=merge_hub_configs(*files), given=frozenset(given), _entry=entry)
        problems = spec_problems(spec.values(), entry, given=spec.given, loss_options=loss_option_names(),
                                 require_data_root=require_data_root)  # fmt: skip
        if problems:
            raise OptionError(problems)
        return spec

    @classmethod
    def from_values(cls, values: Mapping[str, Any], hub_config: Mapping[str, Any] | None = None) -> RunSpec:
        """The spec of option ``values`` given in Python (``{option name: value}``, all given by the user; the others
        keep their defaults; ``virtual_batch_size`` sets ``batch_size``)."""
        from .spec import merge_layers

        merged, _ = merge_layers([{k: (k, v) for k, v in values.items()}], explicit_from=0)
        return cls.from_options(merged, given=frozenset(values), files=[hub_config] if hub_config else ())

    # ------------------------------------------------------------------------------------------------------ reading
    def values(self) -> dict[str, Any]:
        """Every option as ``{option name: value}`` (the recipes' flag names)."""
        return {f.name: getattr(getattr(self, part), f.name) for part in PARTS for f in fields(PARTS[part])}

    def data_section(self) -> dict[str, Any]:
        """The data options that are set (``None`` = unset is left out), as a hub_config ``data`` section."""
        return {f.name: v for f in fields(DataOptions) if (v := getattr(self.data, f.name)) is not None}

    @property
    def loss_entry(self) -> LossEntry:
        """The registry entry of ``loss.loss`` (resolved once when the spec was built)."""
        entry = self._entry
        if entry is None or entry.name != self.loss.loss and entry.cls.__name__ != self.loss.loss:
            entry = self._entry = resolve_loss(self.loss.loss)  # a spec built by hand or given another loss
        return entry

    def loss_kwargs(self) -> dict[str, Any]:
        """The options of the loss (those it takes, and ``loss_kwargs`` when set), as given: ``None`` = the loss's
        default. What ``config.json`` records and the fingerprint identifies."""
        values = {**_asdict(self.loss), "alpha": self.train.alpha}
        out = {k: values[k] for k in loss_keys(self.loss.loss, self.loss_entry) if k in values}
        if self.loss.loss_kwargs:
            out["loss_kwargs"] = dict(self.loss.loss_kwargs)
        return out

    def build_loss(self, num_classes: int, embedding_size: int, **extra: Any) -> nn.Module:
        """The loss of the spec, by the one loss builder :func:`~pml_suprank.training.build_loss`."""
        return build_loss(self.loss.loss, self.loss_kwargs(), num_classes, embedding_size, entry=self.loss_entry,
                          **extra)  # fmt: skip

    def training_config(self, *, multilabel: bool = False) -> TrainingConfig:
        """The :class:`TrainingConfig` of the run, with ``hierarchical_labels`` resolved: the loss is hierarchical,
        or the dataset is multi-label (its ``(B, M)`` label sets go to the loss whole)."""
        train = copy.copy(self.train)  # each value was checked when the spec was built: not again
        train.hierarchical_labels = bool(multilabel or self.loss_entry.hierarchical)
        return train

    def run_options(self, mixed_precision: str) -> dict[str, Any]:
        """The resolved model / data / loss options of the run (with the ``TrainingConfig``: its fingerprint). The
        splits are the ones actually read; ``data_root`` is left out (moving the archive keeps the fingerprint)."""
        data = {k: v for k, v in _asdict(self.data).items() if k != "data_root"}
        for part in ("train", "test"):
            if data[f"{part}_split"] is None:
                data[f"{part}_split"] = resolved_split({"data": self.data_section()}, part)
        return {
            "model": _asdict(self.model),
            "data": data,
            "loss": {"name": self.loss.loss, **self.loss_kwargs()},
            "mixed_precision": str(mixed_precision),
        }


def merge_hub_configs(*configs: Mapping[str, Any]) -> dict[str, Any]:
    """Lay hub_config ``configs`` over each other in order: later sections' keys replace earlier ones, top-level
    values (``name``, ``notes``...) are replaced whole. Returns a new dict; the inputs are not modified."""
    out: dict[str, Any] = {}
    for cfg in configs:
        for key, value in cfg.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = {**out[key], **value}
            else:
                out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def _asdict(options: Any) -> dict[str, Any]:
    """The fields of an option dataclass as a shallow dict (tuples as lists, for JSON)."""
    return {f.name: list(v) if isinstance(v := getattr(options, f.name), tuple) else v for f in fields(options)}
