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

The command line (:mod:`pml_suprank.training.cli`) and the hub_config schema (:mod:`pml_suprank.hub_config`) are
generated from the same fields; a recipe builds its spec once with :func:`pml_suprank.training.cli.parse_run_spec`
(dataclass defaults < recipe defaults < ``--config`` files < explicit flags) and passes it down typed. The run
fingerprint (:meth:`RunSpec.run_options`), ``config.json`` (:meth:`RunSpec.loss_kwargs`) and the model card are
written from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from torch import nn

from ..losses.registry import LossEntry, loss_entry
from .config import TrainingConfig
from .data_source import data_option_errors, multilabel_option_errors, resolved_split
from .options import DataOptions, LossOptions, ModelOptions, RunOptions, build_loss, loss_keys, recipe_options

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
    """The configuration of one run (see the module docstring). Build it with :meth:`from_values` (or
    :func:`~pml_suprank.training.cli.parse_run_spec`), check it once with :meth:`validate`."""

    model: ModelOptions = field(default_factory=ModelOptions)
    data: DataOptions = field(default_factory=DataOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    train: TrainingConfig = field(default_factory=TrainingConfig)
    run: RunOptions = field(default_factory=RunOptions)
    hub_config: dict[str, Any] = field(default_factory=dict)

    # ----------------------------------------------------------------------------------------------------- building
    @classmethod
    def from_values(cls, values: Mapping[str, Any], hub_config: Mapping[str, Any] | None = None) -> RunSpec:
        """The spec of flat option ``values`` (``{option name: value}``; the others keep their defaults).

        Raises:
            ValueError: An unknown option name, or a :class:`TrainingConfig` that refuses its values (message
                prefixed with ``training options:``).
        """
        unknown = sorted(set(values) - set(FIELD_PARTS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; valid options: {sorted(FIELD_PARTS)}")
        by_part: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
        for name, value in values.items():
            by_part[FIELD_PARTS[name]][name] = list(value) if isinstance(value, tuple) else value
        parts: dict[str, Any] = {}
        for part, kwargs in by_part.items():
            try:
                parts[part] = PARTS[part](**kwargs)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{'training' if part == 'train' else part} options: {e}") from e
        return cls(**parts, hub_config=dict(hub_config or {}))

    @classmethod
    def from_hub_config(cls, config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> RunSpec:
        """The spec of a (schema-checked) hub_config dict laid over ``defaults`` (option name → value)."""
        return cls.from_values({**(defaults or {}), **recipe_options(config)}, config)

    # ------------------------------------------------------------------------------------------------------ reading
    def values(self) -> dict[str, Any]:
        """Every option as ``{option name: value}`` (the recipes' flag names)."""
        return {f.name: getattr(getattr(self, part), f.name) for part in PARTS for f in fields(PARTS[part])}

    def data_section(self) -> dict[str, Any]:
        """The data options that are set (``None`` = unset is left out), as a hub_config ``data`` section."""
        return {f.name: v for f in fields(DataOptions) if (v := getattr(self.data, f.name)) is not None}

    @property
    def loss_entry(self) -> LossEntry:
        """The registry entry of ``loss.loss``."""
        return loss_entry(self.loss.loss)

    def loss_kwargs(self) -> dict[str, Any]:
        """The options of the loss (those its registry entry takes), as given: ``None`` = the loss's default. What
        ``config.json`` records and the fingerprint identifies."""
        values = {**_asdict(self.loss), "alpha": self.train.alpha}
        return {k: values[k] for k in loss_keys(self.loss.loss) if k in values}

    def build_loss(self, num_classes: int, embedding_size: int, **extra: Any) -> nn.Module:
        """The loss of the spec (:func:`~pml_suprank.training.build_loss`); ``extra``: e.g. ``relevance=``,
        ``hierarchy=`` of a multi-label dataset."""
        return build_loss(self.loss.loss, self.loss_kwargs(), num_classes, embedding_size, **extra)

    def training_config(self, *, multilabel: bool = False) -> TrainingConfig:
        """The :class:`TrainingConfig` of the run, with ``hierarchical_labels`` resolved: the registered loss is
        hierarchical, or the dataset is multi-label (its ``(B, M)`` label sets go to the loss whole)."""
        return replace(self.train, hierarchical_labels=multilabel or self.loss_entry.hierarchical)

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
        """Every inconsistency of the spec, as messages naming the options (``[]``: valid). ``require_data_root``:
        a benchmark dataset needs ``data_root`` (a complete run; a shipped hub_config leaves it to the command line).
        """
        errors = _field_errors(self)
        try:
            accepted = loss_keys(self.loss.loss)
        except ValueError as e:
            errors.append(f"'loss.name': {e}")
        else:
            for key in self.hub_config.get("loss") or {}:
                if key != "name" and key not in accepted:
                    errors.append(f"'loss.{key}' does not apply to loss {self.loss.loss} (valid: {list(accepted)})")
        errors += _backbone_errors(self.model.backbone) + _hub_config_model_problems(self.hub_config)
        data = data_option_errors(self.data_section(), require_root=require_data_root)
        data += multilabel_option_errors(self.data.dataset, self.loss.loss, self.train.memory_size, self.train.sampler)
        if data:
            errors.append(f"--dataset {self.data.dataset}: " + "; ".join(data))
        return errors + _run_flag_errors(self)

    def validate(self, *, require_data_root: bool = True) -> RunSpec:
        """Raise ``ValueError`` listing :meth:`problems`, else return the spec."""
        errors = self.problems(require_data_root=require_data_root)
        if errors:
            raise ValueError("; ".join(errors))
        return self


def _asdict(options: Any) -> dict[str, Any]:
    """The fields of an option dataclass as a shallow dict (tuples as lists, for JSON)."""
    return {f.name: list(v) if isinstance(v := getattr(options, f.name), tuple) else v for f in fields(options)}


def _field_errors(spec: RunSpec) -> list[str]:
    """The value check of every set option (a command-line value gets the same check as a hub_config's)."""
    errors = []
    for part, cls in PARTS.items():
        for f in fields(cls):
            check, value = f.metadata.get("check"), getattr(getattr(spec, part), f.name)
            if (
                check is not None
                and value is not None
                and not check(list(value) if isinstance(value, tuple) else value)
            ):
                errors.append(f"--{f.name} must be {check.expected}; got {value!r}")
    return errors


def _hub_config_model_problems(config: Mapping[str, Any]) -> list[str]:
    from ..hub.loaded_config import hub_config_model_problems

    return hub_config_model_problems(config)


def _backbone_errors(backbone: str) -> list[str]:
    from ..models import check_backbone_name

    try:
        check_backbone_name(backbone)
    except (ValueError, TypeError) as e:
        return [f"'model.backbone': {e}"]
    return []


def _run_flag_errors(spec: RunSpec) -> list[str]:
    """Flag combinations that would only fail after training."""
    from ..hub.transport import check_repo_id

    run, errors = spec.run, []
    if run.push_to_hub:
        if not run.hub_model_id:
            errors.append("--push_to_hub true needs --hub_model_id (e.g. your-name/happier-synthetic)")
        else:
            try:
                check_repo_id(run.hub_model_id)
            except ValueError as e:
                errors.append(f"--hub_model_id: {e}")
    if run.resume_ignore_config and run.resume is None:
        errors.append("--resume_ignore_config true needs --resume (a checkpoint folder or 'latest')")
    if run.overwrite_output_dir and run.resume is not None:
        errors.append("--overwrite_output_dir true starts a new run: it cannot be combined with --resume")
    return errors
