"""Training: Accelerate-driven metric learning with rank losses (the engine behind the recipes).

Layout:

* :mod:`.config` — :class:`TrainingConfig`, the single source of the training options (help, default, hub_config
  section and value check of every field);
* :mod:`.options` — the model / data / loss / run options of the recipes and the one loss builder
  (:func:`build_loss`, :data:`LOSS_CLASSES`);
* :mod:`.cli` — the recipes' argparse flags generated from those dataclasses;
* :mod:`.optim` — :func:`build_optimizer` (parameter groups) and :func:`build_scheduler`;
* :mod:`.loaders` — :class:`SeededAugmentation`, the data loaders and the one embedding loop :func:`embed_loader`;
* :mod:`.loss_module` — :class:`LossModule` (model + loss [+ memory], what goes through ``accelerator.prepare``);
* :mod:`.checkpoint` — find / validate / atomically write checkpoints, check that one continues this run;
* :mod:`.run_folder` — run identity and ownership of ``output_dir``: the run fingerprint, ``run.json``, the lock file
  ``run.lock`` and the refusal of a new run into a previous run's folder;
* :mod:`.trainer` — :class:`Trainer`;
* :mod:`.export` — the final Hub-ready folder;
* :mod:`.report` — printed metric summaries.
"""

from __future__ import annotations

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
from .checkpoint import jsonable as _jsonable
from .config import OptimizerType, SamplerType, SchedulerType, TrainingConfig, _check_int
from .export import write_final_folder
from .loaders import SeededAugmentation, _dataset_labels, _infer_dim, _progress, collate, embed_loader, make_loader
from .loaders import collate as _collate
from .loss_module import LossModule
from .optim import _model_groups, build_optimizer, build_scheduler
from .options import (
    LOSS_CLASSES,
    DataOptions,
    LossOptions,
    ModelOptions,
    RunOptions,
    build_loss,
)
from .report import _SHORT_KEYS, _format_metrics, _one_column, format_metrics_table
from .run_folder import LOCK_FILE, RUN_FILE, OutputDirError, RunLock, RunLockError, run_config, run_fingerprint
from .trainer import Trainer, _Progress

__all__ = [
    "CHECKPOINT_PREFIX",
    "LOCK_FILE",
    "LOSS_CLASSES",
    "RUN_FILE",
    "TRAINER_STATE",
    "CheckpointError",
    "DataOptions",
    "LossModule",
    "LossOptions",
    "ModelOptions",
    "OutputDirError",
    "RunLock",
    "RunLockError",
    "RunOptions",
    "SeededAugmentation",
    "Trainer",
    "TrainingConfig",
    "build_loss",
    "build_optimizer",
    "build_scheduler",
    "cached_backward",
    "collate",
    "embed_loader",
    "find_checkpoints",
    "format_metrics_table",
    "latest_checkpoint",
    "latest_valid_checkpoint",
    "make_loader",
    "run_config",
    "run_fingerprint",
    "validate_checkpoint",
    "write_final_folder",
]
