"""The model, data, loss, run and model-use options of the recipes (declared with
:func:`~pml_suprank.training.config.option`), and the one loss builder :func:`build_loss`."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from .._validation import OptionCheck, is_choice, is_finite, is_int, is_number, is_str, list_of, optional
from ..data.benchmarks.registry import BENCHMARKS
from ..losses.registry import LossEntry, check_loss_name, entry_options, resolve_loss
from .config import MAX_SCALE, OptionError, TrainingConfig, in_section, option, validate_options
from .trackers import REPORT_TO

__all__ = ["LOCATIONS", "OPTION_CLASSES", "SECTIONS", "DataOptions", "LossOptions", "ModelOptions", "ModelUseOptions",
           "RunOptions", "build_loss", "config_layer", "loss_keys", "loss_option_names"]  # fmt: skip

#: bounds of a ``loss_kwargs`` mapping: keys, magnitude of a number, length of a string or a list
MAX_LOSS_KWARGS, MAX_KWARG_NUMBER, MAX_KWARG_LEN = 32, 1e6, 256
_KWARG_NUMBER, _FRACTION = is_number(-MAX_KWARG_NUMBER, high=MAX_KWARG_NUMBER), is_number(0, strict=True, high=1)
_UNIT = is_number(0, high=1)


def _kwarg_value(v: Any, depth: int = 0) -> bool:
    if isinstance(v, (list, tuple)):
        return depth == 0 and len(v) <= MAX_KWARG_LEN and all(_kwarg_value(x, 1) for x in v)
    return v is None or isinstance(v, bool) or _KWARG_NUMBER(v) or (isinstance(v, str) and len(v) <= MAX_KWARG_LEN)


_KWARGS = OptionCheck(
    lambda v: v is None or (isinstance(v, dict) and len(v) <= MAX_LOSS_KWARGS
                            and all(isinstance(k, str) and k.isidentifier() and _kwarg_value(x) for k, x in v.items())),
    f"null or a mapping (at most {MAX_LOSS_KWARGS} keys) of keyword arguments of the loss class, each a finite number "
    f"of magnitude <= {MAX_KWARG_NUMBER:g}, a bool, null, a string or a list of those")  # fmt: skip


def _torch_device(name: Any) -> bool:
    """``name`` parses as a ``torch.device`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...); nothing is initialised."""
    try:
        torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return False
    return isinstance(name, str)


def _known_backbone(name: Any) -> bool:
    from ..models import check_backbone_name  # imports timm: only when a backbone is checked

    try:
        check_backbone_name(name)
    except (ValueError, TypeError):
        return False
    return True


@in_section("model")
@dataclass
class ModelOptions:
    """Options of :class:`pml_suprank.models.RetrievalModel` (``image_size`` is a data option)."""

    __post_init__ = validate_options
    backbone: str = option("test_resnet", "any timm model name", OptionCheck(
        _known_backbone, "a timm model name (timm.list_models(); e.g. resnet50, test_resnet)"))  # fmt: skip
    pretrained: bool = option(False, "load timm pretrained weights (downloads)")
    pooling: str = option("avg", "global pooling", is_choice("avg", "gem", "max"))
    embedding_size: int = option(128, "embedding dimension", is_int(1, 65536))
    layer_norm: bool = option(True, "LayerNorm (no affine) before the projection")
    projection_init: str = option("random", "projection init: random, or pca (PCA of the training features, once at "
                                  "the start of a fresh run)", is_choice("random", "pca"))  # fmt: skip
    backbone_kwargs: dict | None = option(
        None, 'extra timm.create_model kwargs as JSON, e.g. \'{"img_size": 64}\' for a ViT', OptionCheck(
            lambda v: v is None or isinstance(v, dict), "null or a mapping of timm.create_model kwargs"))  # fmt: skip
    crop_pct: float | None = option(None, "evaluation crop fraction (unset: the backbone's)", _FRACTION)
    crop_mode: str | None = option(None, "evaluation crop: center, squash or border (unset: the backbone's)",
                                   is_choice("center", "squash", "border"))  # fmt: skip


@in_section("data")
@dataclass
class DataOptions:
    """The training and test sets: SyntheticShapes, a paper benchmark read from its archive or a retrieval dataset."""

    __post_init__ = validate_options
    dataset: str = option(
        "synthetic", "'synthetic' (built-in SyntheticShapes), a benchmark name read from its archive under --data_root "
        f"({', '.join(sorted(BENCHMARKS))}), a Hub dataset id, a local image folder, parquet files or a save_to_disk "
        "folder", is_str("'synthetic', a benchmark name, a Hub dataset id or a local path"))  # fmt: skip
    data_root: str | None = option(None, "benchmark datasets: the folder the archive was extracted to (e.g. "
                                   "/data/Stanford_Online_Products)",
                                   is_str("the folder of the benchmark archive"))  # fmt: skip
    label_columns: list[str] | None = option(
        None, "label columns fine -> coarse for a Hub/local dataset, e.g. fine_label,coarse_label (benchmarks: "
        "optional, their own label names)",
        list_of(is_str(), "a non-empty list of column names (fine → coarse)"))  # fmt: skip
    train_split: str | None = option(None, "split used for training ('a+b' concatenates; unset: 'train', or the "
                                     "benchmark's training split)", is_str("a split name"))  # fmt: skip
    test_split: str | None = option(None, "split used for evaluation (unset: 'test', or the benchmark's test split)",
                                    is_str("a split name"))  # fmt: skip
    num_per_class: int = option(32, "SyntheticShapes: images per fine class", is_int(1, 100_000))
    image_size: int = option(48, "training/test resolution", is_int(8, 4096))
    crop_scale: list[float] = option(
        [0.5, 1.0], "area range of the RandomResizedCrop (reference: 0.16,1.0)", OptionCheck(
            lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(_FRACTION, v)) and v[0] <= v[1],
            "two numbers 0 < low <= high <= 1"))  # fmt: skip
    auto_augment: str | None = option(None, "timm augmentation policy for training, e.g. rand-m9-mstd0.5 (RandAugment)",
                                      is_str("a timm policy string"))  # fmt: skip
    re_prob: float = option(0.0, "random erasing probability (training)", _UNIT)
    open_set: bool = option(False, "Hub/local data: train and test fine classes disjoint (error if they overlap)")
    train_classes_per_coarse: int | None = option(None, "open-set rule: the first N fine classes of every coarse class "
                                                  "are for training", is_int(1))  # fmt: skip
    train_class_fraction: float | None = option(
        None, "open-set rule: this fraction of the fine classes is for training",
        is_number(0, strict=True, high=1, open_high=True))  # fmt: skip


@in_section("loss")
@dataclass
class LossOptions:
    """The rank loss and SupRank H⁻ / decomposability hyper-parameters (``alpha``: a :class:`TrainingConfig` field)."""

    __post_init__ = validate_options
    loss: str = option(
        "HAPPIER", "the loss: a registered name (--list_losses), pml:ClassName (a pytorch-metric-learning loss, e.g. "
        "pml:MultiSimilarityLoss), package.module:ClassName (your own class) or an installed plugin's name",
        OptionCheck(lambda v: check_loss_name(v) is None,  # nothing imported; a file's reader refuses module:Class
                    "a registered loss (--list_losses), an installed plugin, pml:ClassName or module:ClassName"),
        key="name")  # fmt: skip
    loss_kwargs: dict | None = option(
        None, 'further keyword arguments of the loss class, as JSON / a YAML mapping, e.g. \'{"margin": 0.2}\' '
        "(checked against its signature)", _KWARGS, key="kwargs")  # fmt: skip
    decomposability: str = option("calibration", "L_DG on pairs (ROADMAP, NeurIPS 2021) or ClusterLoss proxies "
                                  "(SupRank, TPAMI 2025)", is_choice("calibration", "proxy"))  # fmt: skip
    decomposability_weight: float = option(0.1, "weight λ of the decomposability term", _UNIT)
    tau: float = option(0.01, "SupRank sigmoid temperature τ", is_number(0, strict=True, high=100))
    rho: float = option(100.0, "SupRank slope ρ of the linear branch", is_number(0, high=MAX_SCALE))
    delta: float | None = option(None, "SupRank δ (unset: the loss default 0.05)", is_number(0, high=100))
    start: float | None = option(None, "SupRank start of the linear branch (unset: the loss default 0.5)", _UNIT)
    offset: float | None = option(None, "SupRank offset (unset: the continuous σ(δ/τ) + start; the SOP reference "
                                  "uses 1.44)", optional(is_number(0, high=100)))  # fmt: skip
    kernel: str = option("auto", "rank-loss kernel: 'dense' (blocked B×N×N, no host sync), 'sorted' (sorted "
                         "thresholds), 'auto' (by device and size)", is_choice("auto", "dense", "sorted"))  # fmt: skip


def run_rules(v: Mapping[str, Any]) -> list[str]:
    """Flag combinations that would only fail after training (also the ``fit_heat`` spec's, which has no resume)."""
    push, repo = v["push_to_hub"], v["hub_model_id"]
    errors = ["--push_to_hub true needs --hub_model_id (e.g. your-name/happier-synthetic)"] if push and not repo else []
    if repo is not None:  # also without --push_to_hub: the model card's usage line names it
        from ..hub.transport import check_repo_id

        try:
            check_repo_id(repo)
        except ValueError as e:
            errors.append(f"--hub_model_id: {e}")
    if v.get("resume_ignore_config") and v.get("resume") is None:
        errors.append("--resume_ignore_config true needs --resume (a checkpoint folder or 'latest')")
    if v["overwrite_output_dir"] and v.get("resume") is not None:
        errors.append("--overwrite_output_dir true starts a new run: it cannot be combined with --resume")
    return errors


@dataclass
class RunOptions:
    """Options of one recipe invocation (hardware, tracking, resume, outputs, publishing)."""

    mixed_precision: str | None = option(None, "override the `accelerate launch` mixed precision setting",
                                         is_choice("no", "fp16", "bf16"), "training")  # fmt: skip
    cpu: bool = option(False, "run on the CPU even if an accelerator is available")
    compile_loss: bool = option(False, "torch.compile the loss module (with --kernel dense on an accelerator: one "
                                "fused graph, no host sync; the first steps compile)")  # fmt: skip
    with_tracking: bool = option(True, "log to the --report_to trackers (false: no tracker, as --report_to none)")
    report_to: str = option("tensorboard", "experiment trackers through Accelerate: none, tensorboard (under "
                            "<output_dir>/logs; skipped when not installed unless given explicitly), wandb, mlflow or "
                            "all (every installed one)", is_choice(*REPORT_TO))  # fmt: skip
    resume: str | None = option(None, "checkpoint folder to continue from, or 'latest' (newest in output_dir)",
                                is_str("a checkpoint folder or 'latest'"))  # fmt: skip
    resume_ignore_config: bool = option(False, "with --resume: continue from a checkpoint written with another "
                                        "configuration (other run fingerprint; this run's learning rates, weight "
                                        "decays and momentum apply)")  # fmt: skip
    overwrite_output_dir: bool = option(False, "without --resume: delete a previous run's checkpoints and final/ in "
                                        "--output_dir before starting")  # fmt: skip
    skip_initial_eval: bool = option(False, "do not evaluate before training")
    no_plots: bool = option(False, "do not draw the plots of the final folder")
    push_to_hub: bool = option(False, "upload the final folder to the Hub (needs --hub_model_id)", file=False)
    hub_model_id: str | None = option(None, "repo id for --push_to_hub, e.g. user/happier-sop",
                                      is_str("a Hub repo id such as user/happier-sop"), file=False)  # fmt: skip
    hub_private: bool = option(False, "create the Hub repo as private", file=False)

    def __post_init__(self) -> None:
        validate_options(self, run_rules)


@dataclass
class ModelUseOptions:
    """Options of the recipes that use a trained model (``evaluate``, ``search``, ``fit_heat``, ``ood_score``)."""

    model: str | None = option(None, "a model folder (RUN/final) or its Hub id (required)",
                               optional(is_str("a model folder or a Hub id")), file=False)  # fmt: skip
    batch_size: int = option(64, "images per batch (embedding, scoring)", is_int(1, 65_536))
    ood_threshold: float | None = option(None, "OOD when the guard's score > this (unset: the guard's calibrated "
                                         "threshold; needs a model with an OOD guard)",
                                         optional(is_finite()))  # fmt: skip
    embedding_cache: str | None = option(None, "folder of the embedding cache (safetensors shards keyed by the "
                                         "weights, the data and the transform); off when unset",
                                         optional(is_str("a folder path")))  # fmt: skip
    device: str | None = option(None, "default: cuda when available, else cpu", optional(OptionCheck(
        _torch_device, "a torch device such as cpu, cuda or cuda:1", kind="str")))  # fmt: skip
    model_data: dict | None = option(None, "the model's recorded data spec (set by parse, never a flag)", cli=False)


#: every option class of a training run, in --help order
OPTION_CLASSES: tuple[type, ...] = (RunOptions, DataOptions, ModelOptions, LossOptions, TrainingConfig)
#: ``(hub_config section, key)`` of every file option → ``(option class, field name)``
LOCATIONS = {(f.metadata["section"], f.metadata["key"] or f.name): (c, f.name)
             for c in OPTION_CLASSES for f in fields(c) if f.metadata["section"] is not None}  # fmt: skip
#: the hub_config sections holding options, in file order
SECTIONS = ("model", "data", "loss", "optimizer", "scheduler", "sampler_options", "memory", "training", "evaluation")


def config_layer(config: Mapping[str, Any], source: str | None = None) -> dict[str, tuple[str, Any]]:
    """The options of a (schema-checked) hub_config as a layer of :func:`~pml_suprank.training.spec.parse`:
    ``{option name: ("<source>: section.key", value)}`` (``loss.name`` is ``loss``; metadata is left out)."""
    prefix = f"{source}: " if source else ""
    return {LOCATIONS[(section, k)][1]: (f"{prefix}{section}.{k}", v) for section in SECTIONS
            for k, v in (config.get(section) or {}).items() if (section, k) in LOCATIONS}  # fmt: skip


def loss_option_names() -> tuple[str, ...]:
    """The options of the hub_config ``loss`` section (``loss``, ``loss_kwargs``, ``tau``, ..., ``alpha``)."""
    return tuple(f.name for c in (LossOptions, TrainingConfig) for f in fields(c) if f.metadata["section"] == "loss")


def loss_keys(name: str, entry: LossEntry | None = None) -> tuple[str, ...]:
    """The loss options the loss ``name`` takes: its registry entry's ``options``, or those its constructor names."""
    return entry_options(entry or resolve_loss(name), loss_option_names())


def build_loss(name: str, values: Mapping[str, Any], num_classes: int, embedding_size: int, *,
               entry: LossEntry | None = None, **extra: Any) -> torch.nn.Module:  # fmt: skip
    """The one loss builder: the loss ``name`` (:func:`pml_suprank.losses.resolve_loss`) from the option ``values``
    it takes (``None``: the loss's default; ``values["loss_kwargs"]`` passed on whole) and ``extra`` keyword arguments
    (e.g. ``relevance="multilabel"``, ``hierarchy=``). ``num_classes`` and ``embedding_size`` go to a constructor that
    requires them, a hierarchical loss or ``decomposability="proxy"``. Raises ``ValueError`` (an unknown loss) or
    :class:`OptionError` (the constructor refused the arguments; the field blamed: ``loss_kwargs`` when given, else
    ``loss``)."""
    entry = entry or resolve_loss(name)
    kwargs = {k: values[k] for k in loss_keys(name, entry) if values.get(k) is not None}
    params = inspect.signature(entry.cls.__init__).parameters
    wanted = entry.hierarchical or kwargs.get("decomposability") == "proxy"  # else only where required
    sizes = {"num_classes": num_classes, "embedding_size": embedding_size}
    kwargs |= {k: v for k, v in sizes.items() if k in params and (wanted or params[k].default is params[k].empty)}
    kwargs = {**kwargs, **(values.get("loss_kwargs") or {}), **extra}
    try:
        return entry.cls(**kwargs)
    except TypeError as e:  # OptionError: a ValueError (bad input) and still the constructor's TypeError
        call = f"{entry.cls.__name__}(**{kwargs})"
        if given := values.get("loss_kwargs"):  # the flags' values were checked when parsed: blame the free ones
            raise OptionError([("loss_kwargs", f"{given} refused by {call}: {e}")]) from e
        raise OptionError([("loss", f"{name}: {call} refused its arguments: {e}")]) from e
