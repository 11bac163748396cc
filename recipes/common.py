########################################################################
# Shared plumbing of the pml-suprank recipes (train_happier.py, train_roadmap.py, evaluate.py).
#
# The recipes follow Accelerate's example scripts: argparse run options with `choices=` and `help=`, hyper-parameters
# overridable by a `--config` YAML (a hub_config), `accelerator.print` for output, `gather_for_metrics` for the
# evaluation (inside pml_suprank.training), and `--max_train_steps` so CI can smoke-test them. Everything here
# runs in any `accelerate launch` setting: CPU, multi-process (gloo), multi-GPU, mixed precision.
#
# With no argument at all, a recipe trains a tiny timm backbone on SyntheticShapes (built into the package): it needs
# no network and finishes in a few minutes on a 2-core CPU.
########################################################################
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# OpenMP threads that spin while waiting make a busy or shared CPU dramatically slower (measured here: a tiny ResNet
# step took 30x longer with 2 spinning threads on an oversubscribed 2-core machine); sleeping waits cost nothing when
# the CPU is idle. Must be set before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

import torch  # noqa: E402

# Direct invocation (`python recipes/train_happier.py`) puts recipes/ on sys.path; nothing else is needed here.

TRAINING_KEYS = (
    "output_dir", "seed", "epochs", "max_train_steps", "batch_size", "samples_per_class", "sampler",
    "batches_per_super_tuple", "super_classes_per_batch", "optimizer", "lr_backbone", "lr_head", "lr_proxies",
    "weight_decay", "proxies_weight_decay", "momentum", "scheduler", "min_lr_ratio", "warmup_epochs",
    "freeze_batch_norm", "grad_clip", "memory_size", "memory_warmup_steps", "eval_every", "eval_batch_size",
    "k_values", "alpha", "checkpoint_every", "keep_checkpoints", "num_workers", "log_every", "stop_after_steps",
)  # fmt: skip


def str2bool(value: str) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in ("1", "true", "yes", "y", "on"):
        return True
    if value.lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false); got {value!r}")


def int_list(value: str) -> list[int]:
    try:
        return [int(v) for v in str(value).replace(" ", "").split(",") if v]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,10; got {value!r}") from e


def json_dict(value: str) -> dict[str, Any]:
    try:
        out = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f'expected a JSON object such as {{"img_size": 64}}; got {value!r}') from e
    if not isinstance(out, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object; got {value!r}")
    return out


def str_list(value: str) -> list[str]:
    return [v for v in str(value).replace(" ", "").split(",") if v]


def add_common_arguments(parser: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    """Run options shared by the training recipes (the defaults are the no-argument CPU run)."""
    g = parser.add_argument_group("run")
    g.add_argument(
        "--config",
        type=str,
        default=None,
        help="YAML file of options (e.g. hub_configs/happier_sop.yaml); command-line flags override it",
    )
    g.add_argument("--output_dir", type=str, default=defaults["output_dir"], help="checkpoints, final model, plots")
    g.add_argument("--seed", type=int, default=0, help="seed of the model init, samplers and augmentation")
    g.add_argument(
        "--mixed_precision",
        type=str,
        default=None,
        choices=["no", "fp16", "bf16"],
        help="override the `accelerate launch` mixed precision setting",
    )
    g.add_argument("--cpu", action="store_true", help="train on the CPU even if an accelerator is available")
    g.add_argument(
        "--with_tracking",
        type=str2bool,
        default=True,
        help="log to the trackers Accelerate finds (TensorBoard when installed) under output_dir/logs",
    )
    g.add_argument(
        "--resume",
        type=str,
        default=None,
        help="checkpoint folder to continue from, or 'latest' (newest in output_dir/checkpoints)",
    )
    g.add_argument(
        "--stop_after_steps",
        type=int,
        default=None,
        help="end this invocation after N steps with a checkpoint (for time-limited jobs; use --resume)",
    )
    g.add_argument("--skip_initial_eval", action="store_true", help="do not evaluate before training")
    g.add_argument("--no_plots", action="store_true", help="do not draw the plots of the final folder")
    g.add_argument("--push_to_hub", action="store_true", help="upload the final folder to the Hugging Face Hub")
    g.add_argument("--hub_model_id", type=str, default=None, help="repo id for --push_to_hub, e.g. user/happier-sop")
    g.add_argument("--hub_private", action="store_true", help="create the Hub repo as private")

    g = parser.add_argument_group("data")
    g.add_argument(
        "--dataset",
        type=str,
        default="synthetic",
        help="'synthetic' (built-in SyntheticShapes), a Hub dataset id, a local image folder, parquet "
        "files or a save_to_disk folder",
    )
    g.add_argument(
        "--label_columns",
        type=str_list,
        default=None,
        help="label columns fine→coarse for a Hub/local dataset, e.g. fine_label,coarse_label",
    )
    g.add_argument("--train_split", type=str, default="train", help="split used for training")
    g.add_argument("--test_split", type=str, default="test", help="split used for evaluation")
    g.add_argument(
        "--num_per_class", type=int, default=defaults["num_per_class"], help="SyntheticShapes: images per fine class"
    )
    g.add_argument("--image_size", type=int, default=defaults["image_size"], help="training/test resolution")
    g.add_argument(
        "--crop_scale",
        type=float,
        nargs=2,
        default=defaults["crop_scale"],
        help="area range of the RandomResizedCrop (reference: 0.16 1.0)",
    )

    g.add_argument(
        "--open_set",
        type=str2bool,
        default=False,
        help="Hub/local data: make train and test fine classes disjoint (error if they overlap)",
    )
    g.add_argument(
        "--train_classes_per_coarse",
        type=int,
        default=None,
        help="open-set rule: the first N fine classes of every coarse class are for training",
    )
    g.add_argument(
        "--train_class_fraction",
        type=float,
        default=None,
        help="open-set rule: this fraction of the fine classes is for training",
    )

    g = parser.add_argument_group("loss (SupRank H⁻ and decomposability)")
    g.add_argument("--decomposability_weight", type=float, default=0.1, help="λ of the decomposability term")
    g.add_argument("--tau", type=float, default=0.01, help="SupRank sigmoid temperature τ")
    g.add_argument("--rho", type=float, default=100.0, help="SupRank slope ρ of the linear branch")
    g.add_argument("--delta", type=float, default=None, help="SupRank δ (default: the loss default 0.05)")
    g.add_argument("--start", type=float, default=None, help="SupRank start of the linear branch (default 0.5)")
    g.add_argument(
        "--offset",
        type=float,
        default=None,
        help="SupRank offset (default: the continuous σ(δ/τ) + start; the SOP reference uses 1.44)",
    )

    g = parser.add_argument_group("model")
    g.add_argument("--backbone", type=str, default=defaults["backbone"], help="any timm model name")
    g.add_argument("--pretrained", type=str2bool, default=False, help="load timm pretrained weights (downloads)")
    g.add_argument("--pooling", type=str, default="avg", choices=["avg", "gem", "max"], help="global pooling")
    g.add_argument("--embedding_size", type=int, default=defaults["embedding_size"], help="embedding dimension")
    g.add_argument("--layer_norm", type=str2bool, default=True, help="LayerNorm (no affine) before the projection")
    g.add_argument(
        "--backbone_kwargs",
        type=json_dict,
        default=None,
        help="extra timm.create_model kwargs as JSON, e.g. '{\"img_size\": 64}' for a ViT",
    )

    g = parser.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=defaults["epochs"], help="number of epochs")
    g.add_argument("--max_train_steps", type=int, default=None, help="stop after N steps (smoke tests)")
    g.add_argument("--batch_size", type=int, default=defaults["batch_size"], help="images per step per process")
    g.add_argument("--samples_per_class", type=int, default=4, help="images per class in a batch (m)")
    g.add_argument(
        "--sampler",
        type=str,
        default="m_per_class",
        choices=["m_per_class", "hierarchical"],
        help="batch sampler (hierarchical = the SOP sampler over pairs of super-classes)",
    )
    g.add_argument("--batches_per_super_tuple", type=int, default=4, help="hierarchical sampler only")
    g.add_argument("--super_classes_per_batch", type=int, default=2, help="hierarchical sampler only")
    g.add_argument("--optimizer", type=str, default="adam", choices=["adam", "adamw", "sgd"], help="optimizer")
    g.add_argument("--lr_backbone", type=float, default=defaults["lr_backbone"], help="backbone learning rate")
    g.add_argument("--lr_head", type=float, default=defaults["lr_head"], help="pooling/projection learning rate")
    g.add_argument(
        "--lr_proxies",
        type=float,
        default=defaults.get("lr_proxies", 10.0),
        help="learning rate of the loss proxies (ClusterLoss)",
    )
    g.add_argument("--weight_decay", type=float, default=defaults["weight_decay"], help="weight decay")
    g.add_argument("--proxies_weight_decay", type=float, default=0.0, help="weight decay of the loss proxies")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (Nesterov)")
    g.add_argument("--scheduler", type=str, default="cosine", choices=["cosine", "constant"], help="lr schedule")
    g.add_argument("--min_lr_ratio", type=float, default=0.0, help="final lr of the cosine as a fraction")
    g.add_argument(
        "--warmup_epochs", type=int, default=defaults["warmup_epochs"], help="first epochs with the backbone frozen"
    )
    g.add_argument("--freeze_batch_norm", type=str2bool, default=False, help="BatchNorm in eval mode (ResNet-50)")
    g.add_argument("--grad_clip", type=float, default=None, help="clip the gradient norm")
    g.add_argument("--memory_size", type=int, default=0, help="cross-batch memory size (0: none)")
    g.add_argument("--memory_warmup_steps", type=int, default=0, help="steps before the memory is used")
    g.add_argument("--eval_every", type=int, default=defaults["eval_every"], help="evaluate every N epochs (0: end)")
    g.add_argument("--eval_batch_size", type=int, default=256, help="evaluation batch size per process")
    g.add_argument("--k_values", type=int_list, default=[1, 10], help="Recall@k values, e.g. 1,10,100")
    g.add_argument("--checkpoint_every", type=int, default=0, help="checkpoint every N steps (0: every epoch)")
    g.add_argument("--keep_checkpoints", type=int, default=2, help="most recent checkpoints kept (0: all)")
    g.add_argument("--num_workers", type=int, default=0, help="DataLoader workers")
    g.add_argument("--log_every", type=int, default=10, help="log the loss every N steps")


def parse_with_config(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse ``argv``; the options of a ``--config`` hub_config become defaults that explicit flags override (as
    timm's ``train.py``). The hub_config is read and validated by :func:`pml_suprank.hub_config.load_hub_config`
    (``name``, ``hub`` and ``loss.name`` are metadata; every other key is a recipe option). Returns the parsed
    arguments and the hub_config (``{}`` without ``--config``) for the model card.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=str, default=None)
    known, _ = pre.parse_known_args(argv)
    hub_config: dict[str, Any] = {}
    if known.config:
        from pml_suprank.hub_config import flat_options

        try:
            hub_config = load_config(known.config)
        except (ValueError, FileNotFoundError) as e:
            parser.error(f"--config: {e}")
        options = flat_options(hub_config)
        valid = {a.dest for a in parser._actions}
        unknown = sorted(set(options) - valid)
        if unknown:
            parser.error(f"--config {known.config}: option(s) {unknown} are not options of this recipe")
        loss_name = (hub_config.get("loss") or {}).get("name")
        if loss_name is not None and "loss" in valid:
            options["loss"] = loss_name
        parser.set_defaults(**options)
    args = parser.parse_args(argv)
    return args, hub_config


def load_config(path: str) -> dict[str, Any]:
    """Read and validate a hub_config YAML (a path, or a bare name looked up in ``hub_configs/``)."""
    from pml_suprank.hub_config import load_hub_config

    return load_hub_config(path)


def make_accelerator(args: argparse.Namespace, find_unused_parameters: bool) -> Any:
    """Accelerator with the run options (mixed precision, trackers under output_dir/logs, DDP kwargs)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    log_with = None
    if args.with_tracking and importlib.util.find_spec("tensorboard") is not None:
        log_with = "tensorboard"
    kwargs: dict[str, Any] = {
        "cpu": args.cpu,
        "log_with": log_with,
        "project_config": ProjectConfiguration(project_dir=args.output_dir, logging_dir=f"{args.output_dir}/logs"),
        # frozen backbone during warm-up: its parameters get no gradient for a while
        "kwargs_handlers": [DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters)],
    }
    if args.mixed_precision is not None:
        kwargs["mixed_precision"] = args.mixed_precision
    return Accelerator(**kwargs)


def build_datasets(args: argparse.Namespace, model: Any) -> tuple[Any, Any]:
    """Training and test sets with timm-config transforms (RandomResizedCrop + flip / resize + center crop)."""
    from pml_suprank import data

    train_tf = data.build_transforms(model.data_config, train=True, scale=tuple(args.crop_scale))
    test_tf = data.build_transforms(model.data_config, train=False)
    if args.dataset == "synthetic":
        train = data.SyntheticShapes(
            "train", num_per_class=args.num_per_class, image_size=args.image_size, seed=args.seed, transform=train_tf
        )
        test = data.SyntheticShapes(
            "test", num_per_class=args.num_per_class, image_size=args.image_size, seed=args.seed, transform=test_tf
        )
        return train, test
    loader = getattr(data, "load_retrieval_dataset", None)
    if loader is None:  # pragma: no cover - depends on the installed package version
        raise RuntimeError("this pml_suprank has no data.load_retrieval_dataset; only --dataset synthetic works")
    if not args.label_columns:
        raise ValueError(f"--label_columns is required with --dataset {args.dataset!r} (e.g. fine_label,coarse_label)")
    rules = {
        k: getattr(args, k)
        for k in ("train_classes_per_coarse", "train_class_fraction")
        if getattr(args, k) is not None
    }
    train = loader(
        args.dataset,
        args.label_columns,
        split=args.train_split,
        transform=train_tf,
        open_set="train" if args.open_set else None,
        **rules,
    )
    test = loader(
        args.dataset,
        args.label_columns,
        split=args.test_split,
        transform=test_tf,
        open_set="test" if args.open_set else None,
        **rules,
    )
    return train, test


def suprank_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """SupRank H⁻ options given on the command line or by the hub_config (unset ones keep the loss defaults)."""
    out: dict[str, Any] = {"tau": args.tau, "rho": args.rho}
    for k in ("delta", "start", "offset"):
        if getattr(args, k, None) is not None:
            out[k] = getattr(args, k)
    return out


def build_model(args: argparse.Namespace) -> Any:
    from pml_suprank.models import RetrievalModel

    return RetrievalModel(
        backbone=args.backbone,
        pretrained=args.pretrained,
        pooling=args.pooling,
        embedding_size=args.embedding_size,
        layer_norm=args.layer_norm,
        image_size=args.image_size,
        backbone_kwargs=args.backbone_kwargs,
    )


def training_config(args: argparse.Namespace, **overrides: Any) -> Any:
    from pml_suprank.training import TrainingConfig

    values = {k: getattr(args, k) for k in TRAINING_KEYS if hasattr(args, k)}
    values.update(overrides)
    return TrainingConfig.from_dict(values)


def run(
    args: argparse.Namespace,
    hub_config: dict[str, Any],
    make_loss: Callable[[argparse.Namespace, int, int, Any], torch.nn.Module],
    loss_name: str,
    hierarchical_labels: bool,
) -> dict[str, Any] | None:
    """The whole job: data, model, loss, evaluation before, training, evaluation after, final folder, push."""
    from accelerate.utils import set_seed

    from pml_suprank.training import Trainer, format_metrics_table

    t_start = time.perf_counter()
    # parameters without a gradient in some steps (frozen backbone during the warm-up, frozen BatchNorm) need DDP's
    # find_unused_parameters
    accelerator = make_accelerator(args, find_unused_parameters=args.warmup_epochs > 0 or args.freeze_batch_norm)
    set_seed(args.seed)  # the model initialisation (the package itself never seeds global RNGs)
    model = build_model(args)
    train_ds, test_ds = build_datasets(args, model)
    num_classes = int(train_ds.labels[:, 0].max()) + 1  # proxies are indexed by the fine label
    loss = make_loss(args, num_classes, model.embedding_size, train_ds)
    config = training_config(args, hierarchical_labels=hierarchical_labels)
    trainer = Trainer(accelerator, model, loss, train_ds, config, test_dataset=test_ds)
    if accelerator.is_main_process:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    accelerator.print(
        f"{loss_name} on {args.dataset}: {len(train_ds)} training / {len(test_ds)} test images, "
        f"{num_classes} training classes, backbone {args.backbone} @ {args.image_size}px, "
        f"{accelerator.num_processes} process(es) on {accelerator.device}, "
        f"mixed precision {accelerator.mixed_precision}; {trainer.steps_per_epoch} steps/epoch, "
        f"{trainer.total_steps} steps"
    )
    if args.with_tracking:
        accelerator.init_trackers(
            "pml_suprank", config={k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))}
        )

    before_file = Path(args.output_dir) / "metrics_before.json"
    before: dict[str, float] | None = None
    resuming = args.resume is not None
    if not args.skip_initial_eval:
        if resuming and before_file.is_file():
            before = json.loads(before_file.read_text())
        else:
            before = trainer.evaluate(description="evaluation before training")
            if accelerator.is_main_process:
                before_file.write_text(json.dumps(before, indent=1))
            accelerator.print("test metrics before training:")
            accelerator.print(_one_column(before))

    t_train = time.perf_counter()
    trainer.train(resume_from=args.resume)
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
        "loss": loss_name,
        "loss_kwargs": loss_kwargs(loss),
        "dataset": args.dataset,
        "label_names": list(getattr(test_ds, "label_names", [])),
        "training_config": config.to_dict(),
    }
    final = Path(args.output_dir) / "final"
    trainer.save_final(
        final,
        metrics=after,
        summary=summary,
        metadata=metadata,
        hub_config=hub_config or None,
        plots=not args.no_plots,
        repo_id=args.hub_model_id or f"{loss_name.lower()}-{Path(args.output_dir).name}",
    )
    total = time.perf_counter() - t_start
    accelerator.print(
        f"final model, model card, metrics and plots in {final} ({total:.0f} s in all, {train_time:.0f} s of training)"
    )
    pushed_ok = True
    if args.push_to_hub and accelerator.is_main_process:
        pushed_ok = push(args, final)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not pushed_ok:
        sys.exit(1)
    return summary


def _one_column(metrics: dict[str, float]) -> str:
    keys = [k for k in ("h_ap", "ndcg", "asi") if k in metrics]
    keys += sorted(k for k in metrics if k.startswith("ap_level"))
    keys += [k for k in ("ap", "map_at_r", "recall_at_1", "precision_at_1") if k in metrics]
    return "\n".join(f"{k:<16}{metrics[k]:>10.4f}" for k in keys)


def loss_kwargs(loss: torch.nn.Module) -> dict[str, Any]:
    """The scalar hyper-parameters of a loss, for config.json."""
    return {k: v for k, v in vars(loss).items() if not k.startswith("_") and isinstance(v, (int, float, str, bool))}


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
