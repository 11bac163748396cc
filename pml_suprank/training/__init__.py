"""Training: Accelerate-driven metric learning with rank losses (the engine behind the recipes).

Layout:

* :mod:`.config` — :class:`TrainingConfig`, the single source of the training options (help, default, hub_config
  section and value check of every field), and the option machinery (``option``, ``OptionCheck``, the checks);
* :mod:`.options` — the model / data / loss / run options of the recipes and the one loss builder
  (:func:`build_loss`: a registered loss, ``pml:ClassName``, ``module:ClassName`` or a plugin,
  :func:`pml_suprank.losses.resolve_loss`);
* :mod:`.hub_config` — the hub_config schema (derived from the options), reader and validator;
* :mod:`.run_spec` — :class:`RunSpec`, the whole configuration of a recipe run (model / data / loss / train / run),
  built once from a hub_config YAML plus command-line overrides and validated once;
* :mod:`.spec` — the one spec engine of every recipe: ``parse(SpecClass, argv)`` (flags generated from the
  dataclasses, ``--config`` files, layers, one check per value);
* :mod:`.optim` — :func:`build_optimizer` (parameter groups) and :func:`build_scheduler`;
* :mod:`.loaders` — :class:`SeededAugmentation`, the data loaders and the one embedding loop :func:`embed_loader`;
* :mod:`.loss_module` — :class:`LossModule` (model + loss [+ memory], what goes through ``accelerator.prepare``);
* :mod:`.checkpoint` — find / validate / atomically write checkpoints (:mod:`.run_folder` checks that one continues
  this run);
* :mod:`.run_folder` — run identity and ownership of ``output_dir``: the run fingerprint, ``run.json``, the lock file
  ``run.lock`` and the refusal of a new run into a previous run's folder;
* :mod:`.trainer` — :class:`Trainer`;
* :mod:`.nonfinite` — steps with a non-finite loss or gradient: skipped, counted, and a run that keeps producing
  them stopped (:class:`NonFiniteTrainingError`);
* :mod:`.export` — the final Hub-ready folder;
* :mod:`.recipe` — the training command's whole job (``recipes/train.py``) and its presets (``train_happier``,
  ``train_roadmap``: defaults only).

Printed metric summaries live in :mod:`pml_suprank.metrics.report` (``format_metrics_table`` is re-exported here).
"""

from __future__ import annotations

from ..metrics.report import format_metrics_table
from .cached_backward import cached_backward
from .checkpoint import (
    CHECKPOINT_PREFIX,
    TRAINER_STATE,
    CheckpointError,
    find_checkpoints,
    latest_checkpoint,
    latest_valid_checkpoint,
    validate_checkpoint,
)
from .config import OptimizerType, SamplerType, SchedulerType, TrainingConfig
from .export import write_final_folder
from .loaders import SeededAugmentation, collate, embed_loader, make_loader
from .loss_module import LossModule
from .nonfinite import NonFiniteTrainingError
from .optim import build_optimizer, build_scheduler
from .options import DataOptions, LossOptions, ModelOptions, RunOptions, build_loss
from .run_folder import LOCK_FILE, RUN_FILE, OutputDirError, RunLock, RunLockError, run_config, run_fingerprint
from .run_spec import RunSpec
from .trainer import Trainer

__all__ = [
    "CheckpointError",
    "DataOptions",
    "LossModule",
    "LossOptions",
    "ModelOptions",
    "NonFiniteTrainingError",
    "OutputDirError",
    "RunLock",
    "RunLockError",
    "RunOptions",
    "RunSpec",
    "Trainer",
    "TrainingConfig",
    "build_loss",
    "build_optimizer",
    "build_scheduler",
    "cached_backward",
    "embed_loader",
    "make_loader",
    "run_fingerprint",
    "validate_checkpoint",
]
