"""The training command's job (``recipes/train.py``; the presets ``train_happier`` / ``train_roadmap`` change only
the defaults, :data:`PRESETS`): parse the :class:`~pml_suprank.training.RunSpec` once (flags over ``--config``
hub_configs, :func:`~pml_suprank.training.spec.parse`), build the model, data and loss, train, evaluate, save, push.
It runs in any ``accelerate launch`` setting; without arguments it trains a tiny backbone on SyntheticShapes offline
in minutes on a CPU. A refusal is one ``<prog>: error: ...`` line with exit status 2 on every process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from .._safe_json import load_json
from ..data.batch_fit import fit_batch, short_run_warning
from ..data.benchmarks.registry import BENCHMARKS
from ..data.folders import class_names_of, class_split
from ..data.source import dataset_source, folder_layout
from ..losses.compile_guard import compile_loss
from ..metrics.report import format_metrics_table, one_column
from .checkpoint import CheckpointError, CheckpointSaveError
from .config import OptionError
from .hub_config import read_layer
from .nonfinite import NonFiniteTrainingError
from .run_folder import RUN_FOLDER_ERRORS, check_outside_inputs, leave_process_group, prepare_output_dir
from .run_spec import RunSpec
from .spec import build_parser as spec_parser
from .spec import parse

__all__ = [
    "NO_ARGUMENT_RUN",
    "PRESETS",
    "build_datasets",
    "build_model",
    "build_parser",
    "main",
    "make_accelerator",
    "make_loss",
    "multilabel_parts",
    "push",
    "run",
]


# the training recipes without arguments (tiny backbone, 48-px SyntheticShapes): what differs from TrainingConfig's
NO_ARGUMENT_RUN: dict[str, Any] = {"epochs": 12, "lr_backbone": 1e-3, "lr_head": 2e-3, "eval_every": 4}

#: the presets of the training command (``pml-suprank-train-happier`` / ``-roadmap``): defaults only, the same code
PRESETS: dict[str, dict[str, Any]] = {
    "train": {**NO_ARGUMENT_RUN, "loss": "HAPPIER", "output_dir": "outputs/train_synthetic"},
    "train_happier": {**NO_ARGUMENT_RUN, "loss": "HAPPIER", "output_dir": "outputs/happier_synthetic"},
    "train_roadmap": {**NO_ARGUMENT_RUN, "loss": "ROADMAP", "output_dir": "outputs/roadmap_synthetic"},
}
#: the one-line description of each preset (``--help``)
DESCRIPTIONS: dict[str, str] = {
    "train": "Train a retrieval model with any rank loss, a pytorch-metric-learning loss or your own (--list_losses).",
    "train_happier": "Train a retrieval model with HAPPIER (hierarchical AP; Ramzi et al., ECCV 2022) or ROD-NDCG.",
    "train_roadmap": "Train a retrieval model with ROADMAP (SupAP + L_DG; Ramzi et al., NeurIPS 2021).",
}


def preset_command(name: str) -> tuple[Callable[..., Any], Callable[[], None]]:
    """``(main(argv=None) -> summary, run())`` of the preset ``name`` of :data:`PRESETS` (``run``: the console
    script)."""
    defaults, description = PRESETS[name], DESCRIPTIONS[name]

    def preset_main(argv: list[str] | None = None) -> dict | None:
        return main(argv, description, defaults)

    def preset_run() -> None:  # a console script: its return value would be the exit status
        preset_main()

    return preset_main, preset_run


def build_parser(
    description: str, defaults: Mapping[str, Any], hierarchical: bool | None = None
) -> argparse.ArgumentParser:
    """The training command's parser (``--help`` tables) with the preset's ``defaults`` (``hierarchical``: unused)."""
    return spec_parser(RunSpec, defaults, description, config=True)


def make_accelerator(
    *,
    cpu: bool = False,
    mixed_precision: str | None = None,
    with_tracking: bool = False,
    output_dir: str | None = None,
    find_unused_parameters: bool = False,
    report_to: str | None = None,
) -> Any:
    """Accelerator with the run options: mixed precision, trackers (``with_tracking``: ``report_to``, default
    TensorBoard when installed) logging under ``output_dir/logs``, DDP's ``find_unused_parameters``."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    log_with = None
    if with_tracking:
        log_with = report_to or ("tensorboard" if importlib.util.find_spec("tensorboard") is not None else None)
    project = ProjectConfiguration(project_dir=output_dir, logging_dir=f"{output_dir}/logs") if output_dir else None
    # a frozen backbone during warm-up: its parameters get no gradient for a while
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)] if find_unused_parameters else None
    return Accelerator(cpu=cpu, mixed_precision=mixed_precision, log_with=log_with, project_config=project,
                       kwargs_handlers=handlers)  # fmt: skip


def build_model(spec: RunSpec) -> Any:
    """The :class:`~pml_suprank.models.RetrievalModel` of the model options (at the data's ``image_size``)."""
    from dataclasses import asdict

    from ..models import RetrievalModel

    try:  # e.g. --pretrained true while offline: the message names the ways out
        return RetrievalModel(**asdict(spec.model), image_size=spec.data.image_size)
    except ValueError as e:
        refuse(f"--backbone {spec.model.backbone}: {e}")
    except TypeError as e:  # the timm model class refused a keyword of --backbone_kwargs
        kwargs = json.dumps(spec.model.backbone_kwargs)
        refuse(f"--backbone_kwargs {kwargs}: timm.create_model({spec.model.backbone!r}) refused them ({e}); give "
               "only keyword arguments of that model class")  # fmt: skip


def build_datasets(spec: RunSpec, model: Any) -> tuple[Any, Any]:
    """Training and test sets of ``--dataset`` (:func:`~pml_suprank.data.source.dataset_source`) with the model's
    timm transforms; a benchmark with ``--open_set true`` is checked for disjoint fine classes."""
    from .. import data

    train_tf = data.build_transforms(model.data_config, train=True, scale=tuple(spec.data.crop_scale),
                                     auto_augment=spec.data.auto_augment, re_prob=spec.data.re_prob)  # fmt: skip
    test_tf = data.build_transforms(model.data_config, train=False)
    section = spec.data_section()
    try:  # a data problem (unusable images, a missing split) ends the job with its message, not a traceback
        train = dataset_source(section, "train").load(train_tf, seed=spec.train.seed)
        test = dataset_source(section, "test").load(test_tf, seed=spec.train.seed)
    except ValueError as e:
        refuse(f"--dataset {spec.data.dataset}: {e}")
    if spec.data.dataset in BENCHMARKS and spec.data.open_set:
        data.check_disjoint_classes(train, test, name=f"benchmark {spec.data.dataset}")
    return train, test


def make_loss(
    spec: RunSpec, num_classes: int, embedding_size: int, hierarchy: torch.Tensor | None = None
) -> torch.nn.Module:
    """The loss ``--loss`` with its options (:func:`~pml_suprank.training.build_loss`), multi-label with the
    ``(num_fine, L)`` ``hierarchy`` table; ``--compile_loss`` compiles it (:func:`pml_suprank.losses.compile_loss`)."""
    extra = {} if hierarchy is None else {"relevance": "multilabel", "hierarchy": hierarchy}
    try:
        loss = spec.build_loss(num_classes, embedding_size, **extra)
    except OptionError as e:  # the constructor refused: the flag whose values it refused
        refuse(e.located({"loss": "--loss", "loss_kwargs": "--loss_kwargs"}))
    except ValueError as e:
        refuse(f"--loss {spec.loss.loss}: {e}")
    if spec.run.compile_loss:
        compile_loss(loss)
    return loss


def multilabel_parts(spec: RunSpec, accelerator: Any, train_ds: Any, test_ds: Any) -> dict[str, Any]:
    """``{"sampler", "evaluator"}`` for the :class:`~pml_suprank.training.Trainer` of a multi-label dataset (labels
    ``(N, M)`` padded with ``-1``, ``ds.hierarchy`` ``(num_fine, L)``): a sharded
    :class:`~pml_suprank.samplers.MultiLabelSampler` and a multi-label
    :class:`~pml_suprank.metrics.RetrievalEvaluator`; ``{}`` for single-label data."""
    if not getattr(train_ds, "multilabel", False):
        return {}
    from ..metrics import RetrievalEvaluator
    from ..samplers import MultiLabelSampler

    train = spec.train
    sampler = MultiLabelSampler(
        train_ds.labels, m=train.samples_per_class, batch_size=train.batch_size, seed=train.seed,
        num_replicas=accelerator.num_processes, rank=accelerator.process_index,
    )  # fmt: skip
    evaluator = RetrievalEvaluator(
        k_values=tuple(train.k_values), alpha=train.alpha, multilabel=True, hierarchy=test_ds.hierarchy
    )
    return {"sampler": sampler, "evaluator": evaluator}


def main(
    argv: list[str] | None, description: str, defaults: Mapping[str, Any], hierarchical: bool | None = None
) -> Any:
    """The training command with the preset's ``defaults``: parse the :class:`RunSpec`, then :func:`run`. A refused
    output folder or checkpoint ends it with one error line and exit status 2 (1 for a failed save or
    :class:`~pml_suprank.training.nonfinite.NonFiniteTrainingError`), not a traceback."""
    spec = parse(RunSpec, argv, defaults=defaults, description=description, read_config=read_layer)
    try:
        return run(spec, given=spec.given)
    except (*RUN_FOLDER_ERRORS, NonFiniteTrainingError) as e:  # the folder, a checkpoint, diverging steps: one line
        text, resume = str(e), spec.run.resume
        if isinstance(e, CheckpointError) and resume is not None and not text.startswith("--"):
            text = f"--resume {resume}: {text}"
        refuse(text, 1 if isinstance(e, (CheckpointSaveError, NonFiniteTrainingError)) else 2)


def refuse(message: str, status: int = 2) -> NoReturn:
    """End the job as argparse does on a bad option: ``<prog>: error: <message>`` on stderr, exit ``status``; every
    process of a multi-process run refuses alike and leaves together (no SIGABRT of a torn connection)."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)  # noqa: T201 - the recipes' job reports
    leave_process_group(status)
    sys.exit(status)


def fit_to_data(spec: RunSpec, train_ds: Any, num_processes: int, given: Collection[str] = ()) -> RunSpec:
    """The spec with a batch the training set can fill (:func:`~pml_suprank.data.batch_fit.fit_batch`), said in one
    line; :func:`refuse` when the user set ``--batch_size`` / ``--samples_per_class`` (``given``) and it cannot."""
    train = spec.train
    if getattr(train_ds, "multilabel", False) or train.sampler != "m_per_class":
        return spec
    try:
        fit = fit_batch(train_ds.labels, batch_size=train.batch_size, samples_per_class=train.samples_per_class,
                        num_processes=num_processes)  # fmt: skip
    except ValueError as e:
        refuse(f"--dataset {spec.data.dataset}: {e}")
    asked = f"--batch_size {train.batch_size} --samples_per_class {train.samples_per_class}"
    works = f"--batch_size {fit.batch_size} --samples_per_class {fit.samples_per_class}"
    if {"batch_size", "samples_per_class"} & set(given):
        if not fit.fits:
            need = num_processes * train.batch_size // train.samples_per_class
            refuse(
                f"{asked} need {need} classes per batch ({num_processes} process(es)) but the training set has "
                f"{fit.describe_data()}; values that would work: {works}"
            )
        return spec
    if not fit.changed:
        return spec
    print(f"batch fitted to the data ({fit.describe_data()}): {works} instead of {asked}")  # noqa: T201 - as above
    return replace(spec, train=replace(train, batch_size=fit.batch_size, samples_per_class=fit.samples_per_class))


def _data_notes(spec: RunSpec, train_ds: Any, test_ds: Any) -> dict[str, Any] | None:
    """Print an own image folder's layout and counts; return its class split when it has no test split."""
    layout = folder_layout(spec.data.dataset)
    if layout is None:
        return None

    def counts(ds: Any) -> str:
        return f"{len(ds)} images, {int(torch.unique(ds.labels[:, 0]).numel())} classes"

    print(f"data: {layout.root} ({layout.describe()}): training {counts(train_ds)}; test {counts(test_ds)}")  # noqa: T201
    if dataset_source(spec.data_section(), "train").options.get("class_split") is None:
        return None
    train_cls, test_cls = class_split(torch.cat([train_ds.labels, test_ds.labels]), seed=spec.train.seed)
    return {"seed": spec.train.seed, "train_classes": class_names_of(train_ds, train_cls),
            "test_classes": class_names_of(test_ds, test_cls)}  # fmt: skip


def _setup(spec: RunSpec, given: Collection[str]) -> tuple[RunSpec, Any, Any, Any, dict[str, Any] | None]:
    """The run's spec (batch fitted to the data), accelerator, trainer, test set and class split."""
    from accelerate.utils import set_seed

    from .trackers import resolve_report_to
    from .trainer import Trainer

    check_outside_inputs(spec.train.output_dir, {"--dataset": spec.data.dataset})  # OutputDirError: exit 2
    log_with = None
    if spec.run.with_tracking:
        try:
            log_with = resolve_report_to(spec.run.report_to, required="report_to" in given)
        except ValueError as e:
            refuse(str(e))
    # a frozen backbone (warm-up) or BatchNorm leaves parameters without a gradient: DDP's find_unused_parameters
    train = spec.train
    accelerator = make_accelerator(
        cpu=spec.run.cpu, mixed_precision=spec.run.mixed_precision, with_tracking=log_with is not None,
        output_dir=train.output_dir, find_unused_parameters=train.warmup_epochs > 0 or train.freeze_batch_norm,
        report_to=log_with,
    )  # fmt: skip
    set_seed(train.seed)  # the model initialisation (the package itself never seeds global RNGs)
    model = build_model(spec)
    batch_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if train.chunk_size is not None and not train.freeze_batch_norm and batch_norm:
        refuse(
            f"--chunk_size {train.chunk_size}: the backbone {spec.model.backbone} has BatchNorm layers, whose "
            "statistics a chunked forward cannot reproduce (they would be each chunk's, not the batch's); add "
            "--freeze_batch_norm true (BatchNorm in eval mode, as the retrieval papers train), or drop --chunk_size"
        )
    train_ds, test_ds = build_datasets(spec, model)
    split = _data_notes(spec, train_ds, test_ds) if accelerator.is_main_process else None
    spec = fit_to_data(spec, train_ds, accelerator.num_processes, given)
    multilabel = bool(getattr(train_ds, "multilabel", False))
    labels = train_ds.labels
    num_seen = int(torch.unique(labels[labels >= 0] if multilabel else labels[:, 0]).numel())
    # proxies are indexed by the fine label (multi-label: every row of the hierarchy table, train and test classes)
    num_classes = len(train_ds.hierarchy) if multilabel else int(train_ds.labels[:, 0].max()) + 1
    loss = make_loss(spec, num_classes, model.embedding_size, hierarchy=train_ds.hierarchy if multilabel else None)
    trainer = Trainer(
        accelerator, model, loss, train_ds, spec.training_config(multilabel=multilabel), test_dataset=test_ds,
        run_options=spec.run_options(accelerator.mixed_precision),
        **multilabel_parts(spec, accelerator, train_ds, test_ds),
    )  # fmt: skip
    if accelerator.is_main_process:
        prepare_output_dir(train.output_dir)  # OutputDirError naming --output_dir: a file, read-only
    accelerator.print(
        f"{spec.loss.loss} on {spec.data.dataset}: {len(train_ds)} training / {len(test_ds)} test images, "
        f"{num_seen} training classes, backbone {spec.model.backbone} @ {spec.data.image_size}px, "
        f"{accelerator.num_processes} process(es) on {accelerator.device}, "
        f"mixed precision {accelerator.mixed_precision}; {trainer.steps_per_epoch} steps/epoch, "
        f"{trainer.total_steps} steps"
        + (f"; batches of {spec.train.batch_size} in chunks of {spec.train.chunk_size} (gradient caching)"
           if spec.train.chunk_size else "")
    )  # fmt: skip
    warning = short_run_warning(trainer.steps_per_epoch, trainer.total_steps, epochs=spec.train.epochs,
                                max_train_steps=spec.train.max_train_steps)  # fmt: skip
    if warning:
        accelerator.print(warning)
    if log_with is not None:
        from .trackers import flat_config, log_config_text

        config = flat_config(spec.values())
        accelerator.init_trackers("pml_suprank", config=config)
        log_config_text(accelerator, config)
    return spec, accelerator, trainer, test_ds, split


def _initial_eval(spec: RunSpec, trainer: Any, resumed: bool) -> dict[str, float] | None:
    """Test metrics before training, recorded at step 0 (history, trackers, ``metrics_before.json``); a resumed run
    is not evaluated again (:func:`_recorded_before`, once its checkpoint is loaded)."""
    if spec.run.skip_initial_eval or resumed:
        return None
    acc = trainer.accelerator
    before = trainer.record_evaluation(trainer.evaluate(description="evaluation before training"), epoch=0)
    if acc.is_main_process:
        (Path(spec.train.output_dir) / "metrics_before.json").write_text(json.dumps(before, indent=1))
    acc.print("test metrics before training:")
    acc.print(one_column(before))
    return before


def _recorded_before(spec: RunSpec, trainer: Any) -> dict[str, float] | None:
    """A resumed run's metrics before training: the step-0 evaluation of its history, else ``metrics_before.json``
    (a run begun by an older version), else ``None``: the initial weights of a resumed run are not evaluated again."""
    if spec.run.skip_initial_eval:
        return None
    for record in trainer.progress.history:
        if record.get("step") == 0 and any(str(k).startswith("eval/") for k in record):
            return {k.removeprefix("eval/"): v for k, v in record.items() if str(k).startswith("eval/")}
    before_file = Path(spec.train.output_dir) / "metrics_before.json"
    return load_json(before_file, expected=dict) if before_file.is_file() else None


def run(spec: RunSpec, *, given: Collection[str] = ()) -> dict[str, Any] | None:
    """The whole job: build, evaluate, train, evaluate, save the final folder, push. ``given``: the options the user
    set (a batch the data cannot fill is then refused, not shrunk)."""
    if spec.run.push_to_hub:  # token, network and write access: before any work (the spec requires hub_model_id)
        from ..hub.preflight import require_push_access

        require_push_access(spec.run.hub_model_id)
    spec, accelerator, trainer, test_ds, split = _setup(spec, given)
    # lock the output folder, refuse another run's folder or checkpoint, record run.json: before any work
    run_opts = spec.run
    resumed = trainer.begin_run(
        run_opts.resume, ignore_config_change=run_opts.resume_ignore_config,
        overwrite_output_dir=run_opts.overwrite_output_dir,
    ) is not None  # fmt: skip
    if split is not None:
        path = Path(spec.train.output_dir) / "class_split.json"
        path.write_text(json.dumps(split, indent=1))
        accelerator.print(
            f"no test split: classes split by seed {split['seed']} into {len(split['train_classes'])} training and "
            f"{len(split['test_classes'])} test classes (open set), written to {path}"
        )
    try:
        return _job(spec, accelerator, trainer, test_ds, split, resumed)
    finally:
        trainer.end_run()


def _job(
    spec: RunSpec, accelerator: Any, trainer: Any, test_ds: Any, split: dict[str, Any] | None, resumed: bool
) -> Any:
    t_start = time.perf_counter()
    before = _initial_eval(spec, trainer, resumed)
    t_train = time.perf_counter()
    trainer.train()
    train_time = time.perf_counter() - t_train
    if not trainer.finished:
        accelerator.print(f"training interrupted at step {trainer.progress.global_step}; continue with --resume latest")
        accelerator.end_training()
        return None
    before = _recorded_before(spec, trainer) if resumed else before
    after = trainer.record_evaluation(trainer.evaluate(description="evaluation after training"))
    if before is not None:
        accelerator.print("test metrics before / after training:")
        accelerator.print(format_metrics_table(before, after))
    else:
        accelerator.print("test metrics after training:")
        accelerator.print(one_column(after))
    summary = {
        "before": before,
        "after": after,
        "train_time_s": train_time,
        "steps": trainer.progress.global_step,
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
    }
    from ..hub.local_names import public_name, without_local_paths

    metadata = {
        "loss": spec.loss.loss,
        "loss_kwargs": spec.loss_kwargs(),
        "dataset": public_name(spec.data.dataset),  # a local folder by its name: a model folder holds no local path
        "data": spec.data_section(),  # the final folder's data_spec.json (reused by evaluate / search / fit_heat)
        "label_names": list(getattr(test_ds, "label_names", [])),
        "training_config": without_local_paths(trainer.config.to_dict()),
    }
    if split is not None:  # data_spec.json records it: a class folder added later is refused, not silently split
        metadata["class_split"] = {k: split[k] for k in ("train_classes", "test_classes")}
    final = Path(spec.train.output_dir) / "final"
    plots = not spec.run.no_plots
    if plots and getattr(test_ds, "multilabel", False):  # the plots colour and match items by one label per level
        accelerator.print("plots skipped: they need one label per item, the test set is multi-label")
        plots = False
    trainer.save_final(
        final,
        metrics=after,
        summary=summary,
        metadata=metadata,
        hub_config=spec.hub_config or None,
        plots=plots,
        repo_id=spec.run.hub_model_id,  # the card's usage line: the repo pushed to, else the folder itself
    )
    if plots:
        from .trackers import log_plots

        log_plots(accelerator, sorted(final.glob("*.png")), trainer.progress.global_step)
    accelerator.print(
        f"final model, model card, metrics{' and plots' if plots else ''} in {final} "
        f"({time.perf_counter() - t_start:.0f} s in all, {train_time:.0f} s of training)"
    )
    pushed_ok = True
    if spec.run.push_to_hub and accelerator.is_main_process:
        pushed_ok = push(spec, final)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not pushed_ok:
        sys.exit(1)
    return summary


def push(spec: RunSpec, folder: Path) -> bool:
    """Upload the final folder; a failed upload keeps the local results and says where they are."""
    from .. import hub

    repo_id = spec.run.hub_model_id
    try:
        info = hub.push_folder_to_hub(folder, repo_id, private=spec.run.hub_private or None)
    except Exception as e:  # the local folder is never touched by a failed push
        message = f"push to {repo_id!r} failed ({type(e).__name__}: {e}); the results stay in {folder}"
        print(message, file=sys.stderr)  # noqa: T201 - the recipes' command-line job reports on the terminal
        return False
    print(f"pushed {folder} to {getattr(info, 'commit_url', None) or repo_id}")  # noqa: T201 - as above
    return True
