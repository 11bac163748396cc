"""The run specification: the whole configuration of one recipe run, built once and validated once.

:class:`RunSpec` nests the option dataclasses, one per part of a run:

* ``model`` — :class:`~pml_suprank.training.ModelOptions` (the :class:`~pml_suprank.models.RetrievalModel`);
* ``data`` — :class:`~pml_suprank.training.DataOptions` (training / test sets);
* ``loss`` — :class:`~pml_suprank.training.LossOptions` (a loss of the registry,
  :func:`pml_suprank.losses.register_loss`, and its hyper-parameters);
* ``train`` — :class:`~pml_suprank.training.TrainingConfig` (optimizer, schedule, sampler, memory, evaluation,
  checkpoints), including gradient caching's ``virtual_batch_size`` / ``chunk_size`` (``--virtual_batch_size`` /
  ``--chunk_size`` flags and hub_config keys), read by the :class:`~pml_suprank.training.Trainer` from its typed
  config; ``--virtual_batch_size`` replaces ``--batch_size`` (:func:`~pml_suprank.training.cli.parse_run_spec`);
* ``run`` — :class:`~pml_suprank.training.RunOptions` (hardware, tracking, resume, outputs, publishing);

plus ``hub_config``, the merged YAML file(s) as read (metadata for the model card: ``hub.*``, ``name``, ``notes``).

The command line (:mod:`pml_suprank.training.cli`) and the hub_config schema (:mod:`pml_suprank.training.hub_config`)
are generated from the same fields, and every entry point checks a value with its field's check and the rules between
options with :func:`~pml_suprank.training.rules.cross_field_problems`. A recipe builds its spec once with
:func:`pml_suprank.training.cli.parse_run_spec` (dataclass defaults < recipe defaults < ``--config`` files < explicit
flags, :meth:`RunSpec.from_layers`) and passes it down typed. The run
fingerprint (:meth:`RunSpec.run_options`), ``config.json`` (:meth:`RunSpec.loss_kwargs`) and the model card are
written from it.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from torch import nn

from ..data.source import resolved_split
from ..losses.registry import LossEntry, check_loss_name, resolve_loss
from .config import TrainingConfig
from .options import (
    DataOptions,
    LossOptions,
    ModelOptions,
    RunOptions,
    build_loss,
    loss_keys,
    loss_option_names,
    recipe_options,
)
from .rules import cross_field_problems, merge_option_layers

__all__ = ["PARTS", "RunSpec"]

#: part name of a :class:`RunSpec` → its option dataclass (the order of ``--help``)
PARTS: dict[str, type] = {
    "run": RunOptions,
    "data": DataOptions,
    "model": ModelOptions,
    "loss": LossOptions,
    "train": TrainingConfig,
}


def _field_parts() -> dict[str, str]:
    out: dict[str, str] = {}
    for part, cls in PARTS.items():
        for f in fields(cls):
            if f.name in out:  # a flag name must say which part it sets
                raise RuntimeError(f"option {f.name!r} is a field of both {out[f.name]} and {part}")
            out[f.name] = part
    return out


#: option name (= flag name) → the part of :class:`RunSpec` holding it
FIELD_PARTS: dict[str, str] = _field_parts()


@dataclass
class RunSpec:
    """The configuration of one run (see the module docstring). Build it with :meth:`from_layers` /
    :meth:`from_values` (or :func:`~pml_suprank.training.cli.parse_run_spec`): each part checks its values when built;
    :meth:`validate` checks the rules between the parts once.

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

    # ----------------------------------------------------------------------------------------------------- building
    @classmethod
    def from_layers(
        cls,
        layers: Sequence[tuple[str, Mapping[str, Any]]],
        hub_config: Mapping[str, Any] | None = None,
        *,
        explicit_from: int = 1,
        files: Collection[int] = (),
        search_cwd: bool = False,
    ) -> RunSpec:
        """The spec of option layers ``(source, {option name: value})`` laid over each other in order
        (:func:`~pml_suprank.training.rules.merge_option_layers`: ``virtual_batch_size`` sets ``batch_size``); the
        layers from ``explicit_from`` on are the user's (``given``). The layers at the indices ``files`` were read
        from files: a ``package.module:ClassName`` loss there is refused (files are data). The loss is resolved
        once, here (:func:`pml_suprank.losses.resolve_loss`; ``search_cwd``: a name typed on the command line is
        imported from the working directory too, as ``python -m`` does).

        Raises:
            ValueError: An unknown option name, or a part refusing its values (message prefixed with the part,
                e.g. ``training options:``), or two batch sizes given that differ.
        """
        unknown = sorted({n for _, layer in layers for n in layer} - set(FIELD_PARTS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; valid options: {sorted(FIELD_PARTS)}")
        values = merge_option_layers(layers, explicit_from)
        entry = _resolve_once(layers, values, files, search_cwd)
        given = frozenset(n for _, layer in layers[explicit_from:] for n in layer)
        by_part: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
        for name, value in values.items():
            by_part[FIELD_PARTS[name]][name] = list(value) if isinstance(value, tuple) else value
        parts: dict[str, Any] = {}
        for part, kwargs in by_part.items():
            try:
                parts[part] = PARTS[part](**kwargs)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{'training' if part == 'train' else part} options: {e}") from e
        spec = cls(**parts, hub_config=dict(hub_config or {}), given=given)
        spec._entry = entry
        return spec

    @classmethod
    def from_values(cls, values: Mapping[str, Any], hub_config: Mapping[str, Any] | None = None) -> RunSpec:
        """The spec of flat option ``values`` (``{option name: value}``, all given by the user; the others keep
        their defaults); see :meth:`from_layers`."""
        return cls.from_layers([("options", values)], hub_config, explicit_from=0)

    @classmethod
    def from_hub_config(cls, config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> RunSpec:
        """The spec of a (schema-checked) hub_config dict laid over ``defaults`` (option name → value)."""
        layers = [("defaults", defaults or {}), ("the hub_config", recipe_options(config))]
        return cls.from_layers(layers, config, files=(1,))

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
        entry = getattr(self, "_entry", None)
        if entry is None or entry.name != self.loss.loss and entry.cls.__name__ != self.loss.loss:
            entry = self._entry = resolve_loss(self.loss.loss)  # a spec changed by replace()
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

    # --------------------------------------------------------------------------------------------------- validation
    def problems(self, *, require_data_root: bool = True) -> list[str]:
        """Every inconsistency between the options of the spec, as messages naming them (``[]``: valid): the rules
        of :func:`~pml_suprank.training.rules.cross_field_problems` (each value was checked when its part was
        built), and the hub_config's model section held to the rule of a loaded ``config.json``.
        ``require_data_root``: a benchmark dataset needs ``data_root`` (a complete run; a shipped hub_config leaves
        it to the command line)."""
        errors = cross_field_problems(
            {**self.values(), "@entry": self.loss_entry}, given=self.given, loss_options=loss_option_names(),
            require_data_root=require_data_root,
        )  # fmt: skip
        return errors + _hub_config_model_problems(self.hub_config)

    def validate(self, *, require_data_root: bool = True) -> RunSpec:
        """Raise ``ValueError`` listing :meth:`problems`, else return the spec."""
        errors = self.problems(require_data_root=require_data_root)
        if errors:
            raise ValueError("; ".join(errors))
        return self


def _resolve_once(
    layers: Sequence[tuple[str, Mapping[str, Any]]], values: Mapping[str, Any], files: Collection[int], search_cwd: bool
) -> LossEntry:
    """The entry of the loss the layers choose; a ``module:Class`` name from a file layer is refused unimported."""
    name = values.get("loss", LossOptions.__dataclass_fields__["loss"].default)
    for i in files:
        if layers[i][1].get("loss") == name and (problem := check_loss_name(name, from_file=True)) is not None:
            raise ValueError(f"{layers[i][0]}: loss.name must be {problem}")
    try:
        return resolve_loss(name, search_cwd=search_cwd)
    except ValueError as e:
        raise ValueError(f"loss options: {e}") from None


def _asdict(options: Any) -> dict[str, Any]:
    """The fields of an option dataclass as a shallow dict (tuples as lists, for JSON)."""
    return {f.name: list(v) if isinstance(v := getattr(options, f.name), tuple) else v for f in fields(options)}


def _hub_config_model_problems(config: Mapping[str, Any]) -> list[str]:
    """The hub_config's ``model`` section against the loaded ``config.json`` rule (one function for both)."""
    from ..hub.loaded_config import hub_config_model_problems

    return hub_config_model_problems(config)
