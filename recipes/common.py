########################################################################
# Shared plumbing of the pml-suprank recipes (train_happier.py, train_roadmap.py, evaluate.py).
#
# The command line is generated from the option dataclasses of pml_suprank.training (TrainingConfig, ModelOptions,
# DataOptions, LossOptions, RunOptions): one snake_case flag per field, with its help and default shown by --help;
# booleans are `--flag true/false`, lists comma-separated. `--config` reads hub_configs (several files are laid over
# each other, so an override file may hold only the keys it changes); command-line flags override them. The model,
# data and loss are built with the same builders as pml_suprank.hub_config. `--dataset` takes a paper benchmark by
# name (sop, cub, inat_base, inat_full, dyml_*, cifar100, omniglot, gldv2_hier, ...), read from its archive as
# distributed under `--data_root DIR` (pml_suprank.data.benchmarks.load_benchmark), as well as a Hub id or a local copy.
#
# Everything here runs in any `accelerate launch` setting: CPU, multi-process (gloo), multi-GPU, mixed precision.
# With no argument at all, a recipe trains a tiny timm backbone on SyntheticShapes (built into the package): it needs
# no network and finishes in a few minutes on a 2-core CPU.
########################################################################
from __future__ import annotations

import os

# OpenMP threads that spin while waiting make a busy or shared CPU dramatically slower (small ops 10-20x slower,
# and a tiny ResNet step up to 30x, with 2 spinning threads on an oversubscribed 2-core machine); sleeping waits cost
# nothing when the CPU is idle. Must be set before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from dataclasses import fields  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from pml_suprank import hub_config as hc  # noqa: E402
from pml_suprank.data.benchmarks import BENCHMARKS  # noqa: E402
from pml_suprank.metrics.report import one_column as _one_column  # noqa: E402
from pml_suprank.training import TrainingConfig  # noqa: E402
from pml_suprank.training.cli import add_option_arguments, int_list, json_dict, str2bool, str_list  # noqa: E402
from pml_suprank.training.options import (  # noqa: E402
    HIERARCHICAL_LOSSES,
    LOSS_CLASSES,
    DataOptions,
    LossOptions,
    ModelOptions,
    RunOptions,
    build_loss,
)

__all__ = [
    "NO_ARGUMENT_RUN",
    "build_datasets",
    "build_model",
    "build_parser",
    "int_list",
    "json_dict",
    "loss_kwargs",
    "main",
    "make_accelerator",
    "make_loss",
    "multilabel_parts",
    "parse_with_config",
    "push",
    "run",
    "str2bool",
    "str_list",
    "suprank_kwargs",
    "training_config",
]


# The training recipes without arguments: tiny backbone (ModelOptions), 48-px SyntheticShapes (DataOptions), fast on
# 2 CPU cores; only these differ from the TrainingConfig defaults.
NO_ARGUMENT_RUN: dict[str, Any] = {"epochs": 12, "lr_backbone": 1e-3, "lr_head": 2e-3, "eval_every": 4}


# ---------------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------------
def build_parser(description: str, defaults: Mapping[str, Any], losses: Sequence[str]) -> argparse.ArgumentParser:
    """The training recipes' parser, generated from the option dataclasses.

    Args:
        description: The recipe's one-line description.
        defaults: The recipe's no-argument run (replacing the dataclass defaults, shown by ``--help``).
        losses: The losses this recipe trains (``--loss`` choices; loss options of other losses are left out).
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(
        "--config",
        action="append",
        default=None,
        help="hub_config YAML (e.g. hub_configs/happier_sop.yaml); repeat it to lay partial override files over a "
        "base; command-line flags override the files",
    )
    defaults = {"loss": losses[0], **defaults}
    add_option_arguments(parser.add_argument_group("run"), RunOptions, defaults=defaults)
    add_option_arguments(parser.add_argument_group("data"), DataOptions, defaults=defaults)
    add_option_arguments(parser.add_argument_group("model"), ModelOptions, defaults=defaults)
    accepted = {k for name in losses for k in LOSS_CLASSES[name][1]}
    add_option_arguments(
        parser.add_argument_group("loss (SupRank H⁻ and decomposability)"),
        LossOptions,
        only=[f.name for f in fields(LossOptions) if f.name == "loss" or f.name in accepted],
        defaults=defaults,
        choices={"loss": list(losses)},
    )
    add_option_arguments(parser.add_argument_group("training"), TrainingConfig, defaults=defaults)
    return parser


def parse_with_config(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse ``argv``; the options of the ``--config`` hub_config(s) become defaults that explicit flags override (as
    timm's ``train.py``). Several ``--config`` files are merged in order, each may be partial; the result is
    validated by :func:`pml_suprank.hub_config.validate_hub_config`. Returns the parsed arguments and the merged
    hub_config (``{}`` without ``--config``) for the model card.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", action="append", default=None)
    known, _ = pre.parse_known_args(argv)
    hub_config: dict[str, Any] = {}
    if known.config:
        defaults = {a.dest: a.default for a in parser._actions}  # the options the files leave out
        try:
            files = [hc.load_hub_config(path, partial=True, defaults=defaults) for path in known.config]
            hub_config = hc.validate_hub_config(
                hc.merge_hub_configs(*files), source=" + ".join(known.config), partial=True, defaults=defaults
            )
        except (ValueError, FileNotFoundError) as e:
            parser.error(f"--config: {e}")
        options = hc.recipe_options(hub_config)
        actions = {a.dest: a for a in parser._actions}
        unknown = sorted(set(options) - set(actions))
        if unknown:
            parser.error(f"--config {' '.join(known.config)}: option(s) {unknown} are not options of this recipe")
        for dest, value in options.items():
            choices = actions[dest].choices
            if choices is not None and value not in choices:
                parser.error(f"--config: {dest} {value!r} is not trained by this recipe (choose from {choices})")
        parser.set_defaults(**options)
    args = parser.parse_args(argv)
    _check_run_flags(parser, args)
    return args, hub_config


def _check_run_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse flag combinations that would only fail after training (parser.error: exit 2, nothing built)."""
    if getattr(args, "push_to_hub", False):
        if not args.hub_model_id:
            parser.error("--push_to_hub true needs --hub_model_id (e.g. your-name/happier-synthetic)")
        from pml_suprank.hub.transport import check_repo_id

        try:
            check_repo_id(args.hub_model_id)
        except ValueError as e:
            parser.error(f"--hub_model_id: {e}")
    if getattr(args, "resume_ignore_config", False) and args.resume is None:
        parser.error("--resume_ignore_config true needs --resume (a checkpoint folder or 'latest')")
    if getattr(args, "overwrite_output_dir", False) and args.resume is not None:
        parser.error("--overwrite_output_dir true starts a new run: it cannot be combined with --resume")
    if getattr(args, "dataset", None) is not None:
        errors = hc.data_option_errors(hc.nest_options(vars(args)).get("data", {}), require_root=True)
        errors += hc.multilabel_option_errors(
            args.dataset, getattr(args, "loss", None), getattr(args, "memory_size", 0), getattr(args, "sampler", None)
        )
        if errors:
            parser.error(f"--dataset {args.dataset}: " + "; ".join(errors))


def training_config(args: argparse.Namespace, **overrides: Any) -> TrainingConfig:
    """The :class:`TrainingConfig` of the parsed arguments (its fields are recipe options)."""
    values = {f.name: getattr(args, f.name) for f in fields(TrainingConfig) if hasattr(args, f.name)}
    values.update(overrides)
    return TrainingConfig.from_dict(values)


def suprank_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """SupRank H⁻ options given on the command line or by the hub_config (unset ones keep the loss defaults)."""
    out: dict[str, Any] = {"tau": args.tau, "rho": args.rho}
    for k in ("delta", "start", "offset"):
        if getattr(args, k, None) is not None:
            out[k] = getattr(args, k)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# building blocks (the hub_config builders)
# ---------------------------------------------------------------------------------------------------------------------
def make_accelerator(args: argparse.Namespace, find_unused_parameters: bool) -> Any:
    """Accelerator with the run options (mixed precision, trackers under output_dir/logs, DDP kwargs)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    log_with = None
    if getattr(args, "with_tracking", False) and importlib.util.find_spec("tensorboard") is not None:
        log_with = "tensorboard"
    kwargs: dict[str, Any] = {"cpu": args.cpu, "log_with": log_with}
    if getattr(args, "output_dir", None):
        kwargs["project_config"] = ProjectConfiguration(
            project_dir=args.output_dir, logging_dir=f"{args.output_dir}/logs"
        )
    if find_unused_parameters:  # frozen backbone during warm-up: its parameters get no gradient for a while
        kwargs["kwargs_handlers"] = [DistributedDataParallelKwargs(find_unused_parameters=True)]
    if args.mixed_precision is not None:
        kwargs["mixed_precision"] = args.mixed_precision
    return Accelerator(**kwargs)


def build_model(args: argparse.Namespace) -> Any:
    """The :class:`~pml_suprank.models.RetrievalModel` of the model options (:func:`hub_config.model_kwargs`)."""
    from pml_suprank.models import RetrievalModel

    return RetrievalModel(**hc.model_kwargs(hc.nest_options(vars(args))))


def build_datasets(args: argparse.Namespace, model: Any) -> tuple[Any, Any]:
    """Training and test sets (:func:`hub_config.build_dataset`: SyntheticShapes, a benchmark read from its archive
    under ``--data_root``, or a Hub / local dataset) with timm-config transforms (RandomResizedCrop + flip / resize +
    center crop). A benchmark with ``--open_set true`` is checked for disjoint training / test fine classes."""
    from pml_suprank import data

    errors = hc.data_option_errors(hc.nest_options(vars(args)).get("data", {}), require_root=True)
    if errors:
        raise ValueError(f"--dataset {args.dataset!r}: " + "; ".join(errors))
    config = hc.nest_options(vars(args))
    train_tf = data.build_transforms(model.data_config, train=True, scale=tuple(args.crop_scale),
                                     auto_augment=args.auto_augment, re_prob=args.re_prob)  # fmt: skip
    test_tf = data.build_transforms(model.data_config, train=False)
    train = hc.build_dataset(config, "train", train_tf, seed=args.seed)
    test = hc.build_dataset(config, "test", test_tf, seed=args.seed)
    if args.dataset in BENCHMARKS and args.open_set:
        data.check_disjoint_classes(train, test, name=f"benchmark {args.dataset}")
    return train, test


def make_loss(
    args: argparse.Namespace, num_classes: int, embedding_size: int, hierarchy: torch.Tensor | None = None
) -> torch.nn.Module:
    """The loss ``--loss`` with the loss options (the one loss builder, as a hub_config's); with the ``(num_fine, L)``
    ``hierarchy`` table of a multi-label dataset, its multi-label variant (``relevance="multilabel"``).
    ``--compile_loss`` compiles it in place (``nn.Module.compile``: same parameters and state-dict keys)."""
    if hierarchy is None:
        loss = build_loss(args.loss, vars(args), num_classes, embedding_size)
    else:
        loss = build_loss(
            args.loss, vars(args), num_classes, embedding_size, relevance="multilabel", hierarchy=hierarchy
        )
    if getattr(args, "compile_loss", False):
        loss.compile()
    return loss


def multilabel_parts(args: argparse.Namespace, accelerator: Any, train_ds: Any, test_ds: Any) -> dict[str, Any]:
    """The :class:`~pml_suprank.training.Trainer` arguments of a multi-label dataset (``ds.multilabel``: labels
    ``(N, M)`` padded with ``-1``, ``ds.hierarchy`` the ``(num_fine, L)`` table): the
    :class:`~pml_suprank.samplers.MultiLabelSampler` (``m = samples_per_class`` items per sampled label, sharded over
    the processes) and the :class:`~pml_suprank.metrics.RetrievalEvaluator` with the graded multi-label relevance of
    the test set's table (``h_ap``, ``ndcg``, ``mean_label_ap``, R@k). ``{}`` for a single-label dataset."""
    if not getattr(train_ds, "multilabel", False):
        return {}
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.samplers import MultiLabelSampler

    sampler = MultiLabelSampler(
        train_ds.labels, m=args.samples_per_class, batch_size=args.batch_size, seed=args.seed,
        num_replicas=accelerator.num_processes, rank=accelerator.process_index,
    )  # fmt: skip
    evaluator = RetrievalEvaluator(
        k_values=tuple(args.k_values), alpha=args.alpha, multilabel=True, hierarchy=test_ds.hierarchy
    )
    return {"sampler": sampler, "evaluator": evaluator}


def loss_kwargs(loss: torch.nn.Module) -> dict[str, Any]:
    """The scalar hyper-parameters of a loss, for config.json."""
    return {k: v for k, v in vars(loss).items() if not k.startswith("_") and isinstance(v, (int, float, str, bool))}


# ---------------------------------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None, description: str, defaults: Mapping[str, Any], losses: Sequence[str]) -> Any:
    """A training recipe: parse, then :func:`run`."""
    parser = build_parser(description, defaults, losses)
    args, hub_config = parse_with_config(parser, argv)
    return run(args, hub_config)


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """Accelerator, trainer, test set and number of classes of the run (model, data and loss built here)."""
    from accelerate.utils import set_seed

    from pml_suprank.training import Trainer

    # parameters without a gradient in some steps (frozen backbone during the warm-up, frozen BatchNorm) need DDP's
    # find_unused_parameters
    accelerator = make_accelerator(args, find_unused_parameters=args.warmup_epochs > 0 or args.freeze_batch_norm)
    set_seed(args.seed)  # the model initialisation (the package itself never seeds global RNGs)
    model = build_model(args)
    train_ds, test_ds = build_datasets(args, model)
    multilabel = bool(getattr(train_ds, "multilabel", False))
    labels = train_ds.labels
    num_seen = int(torch.unique(labels[labels >= 0]).numel()) if multilabel else int(labels[:, 0].max()) + 1
    # proxies are indexed by the fine label (multi-label: every row of the hierarchy table, train and test classes)
    num_classes = len(train_ds.hierarchy) if multilabel else int(train_ds.labels[:, 0].max()) + 1
    loss = make_loss(args, num_classes, model.embedding_size, hierarchy=train_ds.hierarchy if multilabel else None)
    # multi-label: the (B, M) label sets go to the loss whole
    config = training_config(args, hierarchical_labels=multilabel or args.loss in HIERARCHICAL_LOSSES)
    trainer = Trainer(
        accelerator, model, loss, train_ds, config, test_dataset=test_ds,
        run_options=run_options(args, loss, accelerator.mixed_precision),
        **multilabel_parts(args, accelerator, train_ds, test_ds),
    )  # fmt: skip
    if accelerator.is_main_process:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    accelerator.print(
        f"{args.loss} on {args.dataset}: {len(train_ds)} training / {len(test_ds)} test images, "
        f"{num_seen} training classes, backbone {args.backbone} @ {args.image_size}px, "
        f"{accelerator.num_processes} process(es) on {accelerator.device}, "
        f"mixed precision {accelerator.mixed_precision}; {trainer.steps_per_epoch} steps/epoch, "
        f"{trainer.total_steps} steps"
    )
    if args.with_tracking:
        accelerator.init_trackers(
            "pml_suprank", config={k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))}
        )
    return accelerator, trainer, test_ds, num_classes


def run_options(args: argparse.Namespace, loss: torch.nn.Module, mixed_precision: str) -> dict[str, Any]:
    """The resolved model / data / loss options of the run (with the ``TrainingConfig``, its fingerprint)."""
    values = dict(vars(args))
    nested = hc.nest_options(values)
    for part in ("train", "test"):  # the split actually read (unset: "train" / "test" or the benchmark's own)
        if values.get(f"{part}_split") is None and "dataset" in values:
            values[f"{part}_split"] = hc.resolved_split(nested, part)
    # where the data lies does not change the run (moving the archive keeps the fingerprint)
    data_options = [f.name for f in fields(DataOptions) if f.name in values and f.name != "data_root"]
    return {
        "model": {f.name: values[f.name] for f in fields(ModelOptions) if f.name in values},
        "data": {name: values[name] for name in data_options},
        "loss": {"name": args.loss, **loss_kwargs(loss)},
        "mixed_precision": str(mixed_precision),
    }


def _initial_eval(args: argparse.Namespace, trainer: Any) -> dict[str, float] | None:
    """Test metrics before training (read back from ``metrics_before.json`` when resuming)."""
    if args.skip_initial_eval:
        return None
    acc = trainer.accelerator
    before_file = Path(args.output_dir) / "metrics_before.json"
    if args.resume is not None and before_file.is_file():
        return json.loads(before_file.read_text())
    before = trainer.evaluate(description="evaluation before training")
    if acc.is_main_process:
        before_file.write_text(json.dumps(before, indent=1))
    acc.print("test metrics before training:")
    acc.print(_one_column(before))
    return before


def run(args: argparse.Namespace, hub_config: dict[str, Any]) -> dict[str, Any] | None:
    """The whole job: data, model, loss, evaluation before, training, evaluation after, final folder, push."""
    accelerator, trainer, test_ds, _ = _setup(args)
    # lock the output folder, refuse another run's folder or checkpoint, record run.json: before any work
    trainer.begin_run(
        args.resume, ignore_config_change=args.resume_ignore_config, overwrite_output_dir=args.overwrite_output_dir
    )
    try:
        return _job(args, hub_config, accelerator, trainer, test_ds)
    finally:
        trainer.end_run()


def _job(args: argparse.Namespace, hub_config: dict[str, Any], accelerator: Any, trainer: Any, test_ds: Any) -> Any:
    from pml_suprank.training import format_metrics_table

    t_start = time.perf_counter()
    before = _initial_eval(args, trainer)
    t_train = time.perf_counter()
    trainer.train()
    train_time = time.perf_counter() - t_train
    if not trainer.finished:
        accelerator.print(f"training interrupted at step {trainer.progress.global_step}; continue with --resume latest")
        accelerator.end_training()
        return None

    after = trainer.evaluate(description="evaluation after training")
    if before is not None:
        accelerator.print("test metrics before / after training:")
        accelerator.print(format_metrics_table(before, after))
    else:
        accelerator.print("test metrics after training:")
        accelerator.print(_one_column(after))
    summary = {
        "before": before,
        "after": after,
        "train_time_s": train_time,
        "steps": trainer.progress.global_step,
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
    }
    metadata = {
        "loss": args.loss,
        "loss_kwargs": loss_kwargs(trainer.loss),
        "dataset": args.dataset,
        "label_names": list(getattr(test_ds, "label_names", [])),
        "training_config": trainer.config.to_dict(),
    }
    final = Path(args.output_dir) / "final"
    plots = not args.no_plots
    if plots and getattr(test_ds, "multilabel", False):  # the plots colour and match items by one label per level
        accelerator.print("plots skipped: they need one label per item, the test set is multi-label")
        plots = False
    trainer.save_final(
        final,
        metrics=after,
        summary=summary,
        metadata=metadata,
        hub_config=hub_config or None,
        plots=plots,
        repo_id=args.hub_model_id,  # the card's usage line: the repo pushed to, else the folder itself
    )
    total = time.perf_counter() - t_start
    accelerator.print(
        f"final model, model card, metrics{' and plots' if plots else ''} in {final} "
        f"({total:.0f} s in all, {train_time:.0f} s of training)"
    )
    pushed_ok = True
    if args.push_to_hub and accelerator.is_main_process:
        pushed_ok = push(args, final)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not pushed_ok:
        sys.exit(1)
    return summary


def push(args: argparse.Namespace, folder: Path) -> bool:
    """Upload the final folder; a failed upload keeps the local results and says where they are."""
    from pml_suprank import hub

    if not args.hub_model_id:
        print(
            "--push_to_hub needs --hub_model_id (e.g. your-name/happier-synthetic); nothing was uploaded, "
            f"the results are in {folder}",
            file=sys.stderr,
        )
        return False
    try:
        info = hub.push_folder_to_hub(folder, args.hub_model_id, private=args.hub_private or None)
    except Exception as e:  # the local folder is never touched by a failed push
        print(
            f"push to {args.hub_model_id!r} failed ({type(e).__name__}: {e}); the results stay in {folder}",
            file=sys.stderr,
        )
        return False
    print(f"pushed {folder} to {getattr(info, 'commit_url', None) or args.hub_model_id}")
    return True
