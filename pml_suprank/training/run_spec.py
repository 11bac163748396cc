"""The run specification: the whole configuration of one training run, built once and validated once.

:class:`RunSpec` nests one option dataclass per part of a run (``model``, ``data``, ``loss``, ``train``, ``run``)
and ``hub_config``, the merged YAML file(s) as read (model-card metadata). The training command builds it with
``parse(RunSpec, argv, defaults=preset, read_config=hub_config.read_layer)``, Python with :meth:`RunSpec.from_values`.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from torch import nn

from ..data.source import data_option_errors, resolved_split
from ..losses.registry import LossEntry, loss_keywords, registered_losses, resolve_loss
from .config import OptionError, TrainingConfig
from .options import DataOptions, LossOptions, ModelOptions, RunOptions, build_loss, loss_keys, loss_option_names

__all__ = ["PARTS", "RunSpec", "losses_listing", "merge_hub_configs", "multilabel_option_errors", "spec_problems"]

#: part name of a :class:`RunSpec` → its option dataclass (the order of ``--help``)
PARTS: dict[str, type] = {"run": RunOptions, "data": DataOptions, "model": ModelOptions, "loss": LossOptions,
                          "train": TrainingConfig}  # fmt: skip
#: option name (= flag name) → the part of :class:`RunSpec` holding it
FIELD_PARTS: dict[str, str] = {f.name: part for part, cls in PARTS.items() for f in fields(cls)}
_TITLES = {"loss": "loss (SupRank H⁻ and decomposability)", "train": "training"}  # the others: the part name


def multilabel_option_errors(dataset: Any, loss: Any, sampler: Any = None) -> list[str]:
    """The problems of training ``synthetic_multilabel`` with ``loss`` and ``sampler`` (``[]`` for another dataset):
    only losses registered ``multilabel=True`` (HAPPIER, Sup-H-AP, Sup-NDCG: the thesis' Algorithm 1 relevance), and
    batches drawn by :class:`pml_suprank.samplers.MultiLabelSampler` (``sampler`` keeps ``m_per_class``)."""
    if dataset != "synthetic_multilabel":
        return []
    errors, multilabel_losses = [], list(registered_losses(multilabel=True))
    if loss is not None and loss not in multilabel_losses:
        errors.append(f"'loss' {loss} has no multi-label variant: dataset synthetic_multilabel (several labels per "
                      f"image) trains with {' or '.join(multilabel_losses)} only")  # fmt: skip
    if sampler not in (None, "m_per_class"):
        errors.append(f"'sampler' {sampler}: dataset synthetic_multilabel is sampled by MultiLabelSampler (m items "
                      "per label); keep sampler m_per_class")  # fmt: skip
    return errors


def spec_problems(spec: RunSpec, *, require_data_root: bool = True) -> list[str]:
    """The rules between the parts of ``spec`` (``require_data_root``: a benchmark needs ``data_root``): the loss's
    ``loss_kwargs`` are its arguments and set nothing a flag or the data sets, a loss option the user gave applies to
    the loss, the data options fit the dataset, a multi-label dataset has a multi-label loss."""
    loss, dataset, kwargs = spec.loss.loss, spec.data.dataset, set(spec.loss.loss_kwargs or {})
    accepted = loss_keys(loss, spec.loss_entry)
    valid = loss_keywords(spec.loss_entry.cls) if kwargs else None  # None: any keyword (the package's own losses)
    unknown = sorted(kwargs - valid) if valid is not None else []
    clash = sorted(kwargs & ({*accepted, "num_classes", "embedding_size"} - {"loss", "loss_kwargs"}))
    errors = []
    if unknown:
        errors.append(f"--loss_kwargs {unknown} are not arguments of loss {loss} (valid: {sorted(valid)})")
    elif clash:  # two values for one argument, one silently lost
        named = (f"the {k} of the data / model" if k in ("num_classes", "embedding_size") else f"--{k}" for k in clash)
        errors.append(f"--loss_kwargs {clash} set what {', '.join(named)} sets for loss {loss}: give each value once "
                      "(by its flag)")  # fmt: skip
    errors += [f"'loss.{n}' does not apply to loss {loss} (--{n}; its options: {list(accepted)}; others go through "
               "--loss_kwargs)" for n in loss_option_names()  # alpha is also the evaluator's H-AP exponent
               if n in spec.given and n not in (*accepted, "loss", "loss_kwargs", "alpha")]  # fmt: skip
    for problems in (data_option_errors(spec.data_section(), require_root=require_data_root),
                     multilabel_option_errors(dataset, loss, spec.train.sampler)):  # fmt: skip
        errors += [f"--dataset {dataset}: " + "; ".join(problems)] if problems else []
    return errors


def losses_listing() -> str:
    """Every loss ``--loss`` takes: the registered ones (labels, options), installed plugins, the other spellings."""
    from ..losses.registry import ENTRY_POINT_GROUP, installed_plugins

    lines = ["registered losses (--loss NAME):"]
    for name, entry in registered_losses().items():
        labels = "hierarchical labels (N, L)" if entry.hierarchical else "fine labels (N,)"
        labels += ", multi-label" if entry.multilabel else ""
        lines.append(f"  {name:<10} {entry.cls.__name__:<15} {labels}; options: {', '.join(loss_keys(name, entry))}")
    if plugins := [name for name in installed_plugins() if name not in registered_losses()]:
        lines.append(f"installed plugins (entry-point group {ENTRY_POINT_GROUP}): {', '.join(plugins)}")
    return "\n".join([*lines,
        "pytorch-metric-learning baselines: --loss pml:ClassName (e.g. pml:MultiSimilarityLoss, pml:ArcFaceLoss), "
        "arguments by --loss_kwargs",
        "your own loss class: --loss package.module:ClassName (imported from the working directory or PYTHONPATH; "
        "typed on the command line only, never read from a --config file)"])  # fmt: skip


@dataclass
class RunSpec:
    """The configuration of one run (module docstring). ``given``: the options the user set (flags, ``--config`` keys;
    not the preset's), which a recipe never changes on its own (a batch the data cannot fill is refused, not shrunk)."""

    model: ModelOptions = field(default_factory=ModelOptions)
    data: DataOptions = field(default_factory=DataOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    train: TrainingConfig = field(default_factory=TrainingConfig)
    run: RunOptions = field(default_factory=RunOptions)
    hub_config: dict[str, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()
    _entry: tuple[str, LossEntry] | None = field(default=None, repr=False, compare=False)  # (loss, its entry)

    CONFIG_APPEND = True
    CONFIG_HELP = (
        "hub_config: a bundled name (e.g. happier_sop; pml_suprank.training.hub_config.bundled_hub_configs()) or a "
        "YAML file; repeat it to lay partial override files over a base; command-line flags override the files"
    )
    GROUPS = tuple((_TITLES.get(part, part), fields(cls)[0].name) for part, cls in PARTS.items())

    @classmethod
    def option_classes(cls) -> tuple[type, ...]:
        return tuple(PARTS.values())

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.epilog = losses_listing()  # --list_losses prints it and exits, as --version does
        parser.add_argument("--list_losses", action="version", version=parser.epilog,
                            help="list every loss --loss takes, and exit")  # fmt: skip

    @classmethod
    def from_options(cls, values: Mapping[str, Any], *, given: frozenset[str] = frozenset(),
                     where: Mapping[str, str] | None = None, files: Sequence[Mapping[str, Any]] = (),
                     require_data_root: bool = True) -> RunSpec:  # fmt: skip
        """The spec of merged option ``values``: the loss resolved once (a name typed as ``--loss``, per ``where``,
        is imported from the working directory too, as ``python -m`` does), each part built (its fields checked
        once), the rules between parts (:func:`spec_problems`) run once. ``OptionError``: every problem."""
        if unknown := sorted(set(values) - set(FIELD_PARTS)):
            raise OptionError(f"unknown option(s) {unknown}; valid options: {sorted(FIELD_PARTS)}")
        name = values.get("loss", LossOptions.__dataclass_fields__["loss"].default)
        try:  # a file's loss name was refused by its reader unless registered or pml: (files are data)
            entry = resolve_loss(name, search_cwd=(where or {}).get("loss", "").startswith("--"))
        except ValueError as e:
            raise OptionError([("loss", f"refused: {e}")]) from None
        parts, problems = {}, []
        for part, option_cls in PARTS.items():
            try:
                parts[part] = option_cls(**{k: list(v) if isinstance(v, tuple) else v for k, v in values.items()
                                            if FIELD_PARTS[k] == part})  # fmt: skip
            except OptionError as e:
                problems += e.problems
        if problems:
            raise OptionError(problems)
        spec = cls(**parts, hub_config=merge_hub_configs(*files), given=frozenset(given), _entry=(name, entry))
        if problems := spec_problems(spec, require_data_root=require_data_root):
            raise OptionError(problems)
        return spec

    @classmethod
    def from_values(cls, values: Mapping[str, Any], hub_config: Mapping[str, Any] | None = None) -> RunSpec:
        """The spec of ``values`` given in Python (all by the user; ``virtual_batch_size`` sets ``batch_size``)."""
        return cls.from_options(values, given=frozenset(values), files=[hub_config] if hub_config else ())

    def values(self) -> dict[str, Any]:
        """Every option as ``{option name: value}`` (the recipes' flag names)."""
        return {f.name: getattr(getattr(self, part), f.name) for part in PARTS for f in fields(PARTS[part])}

    def data_section(self) -> dict[str, Any]:
        """The data options that are set, as a hub_config ``data`` section."""
        return {f.name: v for f in fields(DataOptions) if (v := getattr(self.data, f.name)) is not None}

    @property
    def loss_entry(self) -> LossEntry:
        """The registry entry of ``loss.loss``: resolved when the spec was built, again if the loss was changed."""
        if self._entry is None or self._entry[0] != self.loss.loss:
            self._entry = (self.loss.loss, resolve_loss(self.loss.loss))
        return self._entry[1]

    def loss_kwargs(self) -> dict[str, Any]:
        """The options the loss takes (and ``loss_kwargs`` when set) as given, ``None`` = the loss's default: what
        ``config.json`` records and the fingerprint identifies."""
        values = {**asdict(self.loss), "alpha": self.train.alpha}
        out = {k: values[k] for k in loss_keys(self.loss.loss, self.loss_entry) if k in values}
        return {**out, "loss_kwargs": dict(self.loss.loss_kwargs)} if self.loss.loss_kwargs else out

    def build_loss(self, num_classes: int, embedding_size: int, **extra: Any) -> nn.Module:
        """The loss of the spec, by the one loss builder :func:`~pml_suprank.training.build_loss`."""
        return build_loss(self.loss.loss, self.loss_kwargs(), num_classes, embedding_size, entry=self.loss_entry,
                          **extra)  # fmt: skip

    def training_config(self, *, multilabel: bool = False) -> TrainingConfig:
        """The :class:`TrainingConfig` with ``hierarchical_labels`` resolved (a hierarchical loss, or multi-label data
        whose ``(B, M)`` label sets go to the loss whole); its values are not checked again."""
        train = copy.copy(self.train)
        train.hierarchical_labels = bool(multilabel or self.loss_entry.hierarchical)
        return train

    def run_options(self, mixed_precision: str) -> dict[str, Any]:
        """The resolved model / data / loss options (with the ``TrainingConfig``: the run fingerprint): the splits
        actually read; ``data_root`` left out (moving the archive keeps the fingerprint)."""
        data = {k: v for k, v in asdict(self.data).items() if k != "data_root"}
        data.update({f"{p}_split": resolved_split({"data": self.data_section()}, p) for p in ("train", "test")})
        return {"model": asdict(self.model), "data": data, "loss": {"name": self.loss.loss, **self.loss_kwargs()},
                "mixed_precision": str(mixed_precision)}  # fmt: skip


def merge_hub_configs(*configs: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: hub_config ``configs`` laid over each other (a later section's keys replace earlier ones)."""
    out: dict[str, Any] = {}
    for key, value in (item for cfg in configs for item in cfg.items()):
        out[key] = {**(out.get(key) or {}), **value} if isinstance(value, Mapping) else value
    return out
