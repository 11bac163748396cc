"""Training: Accelerate-driven metric learning with rank losses (the engine behind the recipes).

Entry points: :class:`Trainer`, :class:`TrainingConfig`, :class:`RunSpec`, :func:`cached_backward`; the module map
is in ``docs/extending.md``.
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
