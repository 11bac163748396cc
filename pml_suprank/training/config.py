"""The option machinery (:func:`option`, :func:`validate_options`) and :class:`TrainingConfig`: every option is one
dataclass field whose ``metadata`` holds its help, hub_config section and value check
(:class:`~pml_suprank._validation.OptionCheck`); the command line (:mod:`.spec`) and the hub_config schema
(:mod:`.hub_config`) are generated from them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal, get_args

import numpy as np

from .._validation import OptionCheck, is_bool, is_choice, is_int, is_number, is_str, list_of, optional, shorten

__all__ = ["OptionError", "TrainingConfig", "field_default", "option", "validate_options"]

OptimizerType = Literal["adam", "adamw", "sgd"]
SchedulerType = Literal["cosine", "constant"]
SamplerType = Literal["m_per_class", "hierarchical"]
#: bounds of learning rates, weight decays, the H-AP exponent and scalar scales (finite in float32 after products)
MAX_LR, MAX_WEIGHT_DECAY, MAX_ALPHA, MAX_SCALE = 100.0, 10.0, 100.0, 1e6


def option(default: Any, help: str, check: OptionCheck | None = None, section: str | None = None, *,
           key: str | None = None, cli: bool = True, file: bool = True) -> Any:  # fmt: skip
    """A dataclass field with its documentation, the one place an option is described: ``help`` (``--help``, with
    the default), the value ``check`` (a bool default: :func:`is_bool`), the hub_config ``section`` and ``key``
    (default: the field name; no section: command line only, or the class's :func:`in_section`), whether it is a
    flag (``cli``) and whether a ``--config`` file may set it (``file=False``: it sends data out or names weights to
    read; :func:`~pml_suprank.training.spec.parse` refuses it from any file). A list default is copied per instance."""
    check = is_bool() if check is None and isinstance(default, bool) else check
    metadata = {"help": help, "section": section, "key": key, "check": check, "cli": cli, "file": file}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def in_section(section: str) -> Callable[[type], type]:
    """Class decorator (above ``@dataclass``): the hub_config ``section`` of the option fields that name none."""

    def apply(cls: type) -> type:
        for f in fields(cls):
            f.metadata = MappingProxyType({**f.metadata, "section": f.metadata["section"] or section})
        return cls

    return apply


def field_default(f: Field) -> Any:
    """The default of a dataclass field (calling its factory; ``None`` when it has none)."""
    return f.default_factory() if f.default_factory is not MISSING else None if f.default is MISSING else f.default


class OptionError(ValueError, TypeError):
    """Refused option values (a ``ValueError`` and, for a wrong type, a ``TypeError``). ``problems``: ``(field name or
    None, text)``; :meth:`located` names each field where its value came from (``--flag``, ``file: section.key``)."""

    def __init__(self, problems: str | Sequence[str | tuple[str | None, str]]) -> None:
        items = [problems] if isinstance(problems, str) else list(problems)
        self.problems = [(None, p) if isinstance(p, str) else (p[0], p[1]) for p in items]
        super().__init__(self.located({}))

    def located(self, where: Mapping[str, str]) -> str:
        return "; ".join(text if name is None else f"{where.get(name, name)} {text}" for name, text in self.problems)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def field_problem(f: Field, value: Any) -> str | None:
    """Why the option field ``f`` refuses ``value`` (``None``: accepted; ``None`` is accepted where it is the
    default). Tuples are checked as lists and numpy scalars as numbers, as a file or a flag gives them."""
    check = f.metadata.get("check")
    if check is None or (value is None and field_default(f) is None) or check(_plain(value)):
        return None
    return f"must be {check.expected}; got {shorten(repr(value), 200)}"


def validate_options(obj: Any, rules: Callable[[dict[str, Any]], Sequence[Any]] | None = None) -> None:
    """Check an option dataclass instance: each field by its check, then its class's ``REQUIRED`` fields set, then
    ``rules`` (between its fields: texts or ``(field name, text)``); raise an :class:`OptionError` naming the problems
    of the first step that fails."""
    problems: list[Any] = [(f.name, p) for f in fields(obj) if (p := field_problem(f, getattr(obj, f.name)))]
    problems = problems or [f"--{n} is required" for n in getattr(obj, "REQUIRED", ()) if getattr(obj, n) is None]
    problems = problems or (rules({f.name: getattr(obj, f.name) for f in fields(obj)}) if rules else [])
    if problems:
        raise OptionError(problems)


class _DefaultInt(int):
    """The default of ``batch_size``: not given, so ``virtual_batch_size`` (another name of it) sets it."""


def _training_rules(v: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """``warmup_epochs < epochs``; the batch a whole number of the sampler's groups (``samples_per_class`` images per
    class, times ``super_classes_per_batch`` with the hierarchical sampler). Each problem is ``(the field to change,
    text)``: :meth:`OptionError.located` names where its value came from."""
    b, m, vb = v["batch_size"], v["samples_per_class"], v["virtual_batch_size"]
    k = v["super_classes_per_batch"] if v["sampler"] == "hierarchical" else 1
    if v["warmup_epochs"] > 0 and 0 < v["epochs"] <= v["warmup_epochs"]:
        return [("warmup_epochs", f"must be < epochs = {v['epochs']}; got {v['warmup_epochs']}")]
    if vb is not None and vb != b:
        return [(None, f"--virtual_batch_size {vb} and --batch_size {b} differ: --virtual_batch_size is the batch the "
                 "sampler draws and the loss ranks, it replaces --batch_size; give one of them (or the same value to "
                 "both)")]  # fmt: skip
    if vb is not None and vb % (g := k * m):  # g: images per group of classes
        group = f"super_classes_per_batch {k} x samples_per_class {m}" if k > 1 else f"samples_per_class {m}"
        return [("virtual_batch_size", f"{vb} is not a whole number of the sampler's groups ({group} = {g} images "
                 f"per group of classes); use a multiple of {g}, {_multiples_near(vb, g)}")]  # fmt: skip
    if b % m:
        return [("batch_size", f"must be a multiple of samples_per_class = {m}; got {b} (use {_multiples_near(b, m)})")]
    return []


def _multiples_near(n: int, g: int) -> str:
    """``"e.g. HIGH or LOW"``: the multiples of ``g`` around ``n`` (only ``g`` when ``n < g``)."""
    low = n // g * g
    return f"e.g. {low + g} or {low}" if low else f"e.g. {g}"


_RATE, _DECAY = is_number(0, high=MAX_LR), is_number(0, high=MAX_WEIGHT_DECAY)


@dataclass
class TrainingConfig:
    """Hyper-parameters of a training run; each field's help says what it does (``pml-suprank-train --help``). The
    global batch of a step is ``num_processes * batch_size``. Exact large batches (``docs/large-batches.md``):
    ``virtual_batch_size`` is another name of ``batch_size`` (per process; giving it alone sets both), and
    ``chunk_size`` embeds and back-propagates it that many images at a time
    (:func:`~pml_suprank.training.cached_backward`: the gradient of the whole batch). Both are in the run fingerprint.
    """

    output_dir: str = option("outputs/run", "folder of the checkpoints, final model and plots", is_str("a folder path"))
    seed: int = option(0, "seed of the model init, samplers and per-item augmentation", is_int(0), "training")
    epochs: int = option(10, "number of epochs (one pass of the batch sampler)", is_int(1), "training")
    max_train_steps: int | None = option(None, "stop after N optimizer steps (also shortens the cosine schedule)",
                                         optional(is_int(1)), "training")  # fmt: skip
    batch_size: int = option(_DefaultInt(64), "images per step per process (the ranking batch; --virtual_batch_size is "
                             "another name of it)", is_int(2), "sampler_options")  # fmt: skip
    virtual_batch_size: int | None = option(
        None, "the ranking batch: images the sampler draws and the loss ranks per step and process; replaces "
        "--batch_size (with --chunk_size it need not fit in memory)", optional(is_int(2)), "sampler_options",
    )  # fmt: skip
    chunk_size: int | None = option(
        None, "gradient caching: embed and back-propagate the batch this many images at a time (exact: the gradient "
        "of the whole batch; needs --freeze_batch_norm true with a BatchNorm backbone); none: all at once",
        optional(is_int(1)), "training")  # fmt: skip
    samples_per_class: int = option(4, "images per class in a batch (m)", is_int(2), "sampler_options")
    sampler: SamplerType = option(
        "m_per_class", "batch sampler (hierarchical = the SOP sampler over pairs of super-classes, needs 2-D labels)",
        is_choice(*get_args(SamplerType)), "sampler_options")  # fmt: skip
    batches_per_super_tuple: int = option(4, "hierarchical sampler: batches per pair of super-classes", is_int(1),
                                          "sampler_options")  # fmt: skip
    super_classes_per_batch: int = option(2, "hierarchical sampler: super-classes per batch", is_int(1),
                                          "sampler_options")  # fmt: skip
    optimizer: OptimizerType = option("adam", "optimizer (sgd: Nesterov with --momentum)",
                                      is_choice(*get_args(OptimizerType)), "optimizer")  # fmt: skip
    lr_backbone: float = option(1e-4, "learning rate of the timm trunk", _RATE, "optimizer")
    lr_head: float = option(2e-4, "learning rate of pooling (GeM p), projection and classifier", _RATE, "optimizer")
    lr_proxies: float = option(10.0, "learning rate of the loss proxies (ClusterLoss)", _RATE, "optimizer")
    weight_decay: float = option(1e-4, "weight decay of the backbone and head groups", _DECAY, "optimizer")
    proxies_weight_decay: float = option(0.0, "weight decay of the loss proxies", _DECAY, "optimizer")
    momentum: float = option(0.9, "SGD momentum (Nesterov)", is_number(0, high=1), "optimizer")
    scheduler: SchedulerType = option("cosine", "lr schedule", is_choice(*get_args(SchedulerType)), "scheduler")
    min_lr_ratio: float = option(0.0, "final lr of the cosine schedule as a fraction of each group's initial lr",
                                 is_number(0, high=1), "scheduler")  # fmt: skip
    warmup_epochs: int = option(0, "first epochs with the backbone frozen and no scheduler step", is_int(0), "training")
    freeze_batch_norm: bool = option(False, "backbone BatchNorm layers in eval mode (ResNet-50 recipes)", None, "model")
    pca_samples: int = option(10000, "projection_init=pca: training images used for the PCA", is_int(2), "model")
    grad_clip: float | None = option(None, "clip the gradient norm to this value",
                                     optional(is_number(0, strict=True, high=MAX_SCALE)), "training")  # fmt: skip
    max_nonfinite_steps: int = option(
        10, "steps in a row with a non-finite loss or gradient that are skipped (no update, as fp16's GradScaler "
        "does) before the run stops with an error and a checkpoint of the last good state (0: stop at the first)",
        is_int(0), "training")  # fmt: skip
    memory_size: int = option(0, "cross-batch memory size (0: none)", is_int(0), "memory")
    memory_warmup_steps: int = option(0, "steps before the memory loss is used", is_int(0), "memory")
    hierarchical_labels: bool = option(True, "loss gets all label columns (N, L), not the fine labels (N,)", cli=False)
    eval_every: int = option(1, "evaluate every N epochs (0: only at the end)", is_int(0), "evaluation")
    eval_batch_size: int = option(128, "evaluation batch size per process", is_int(1), "evaluation")
    k_values: Sequence[int] = option((1, 10), "Recall@k values, e.g. 1,10,100",
                                     list_of(is_int(1), "a non-empty list of ints >= 1"), "evaluation")  # fmt: skip
    alpha: float = option(1.0, "H-AP relevance exponent of the evaluator and of HAPPIER (alpha > 1: HAPPIER_F)",
                          is_number(0, strict=True, high=MAX_ALPHA), "loss")  # fmt: skip
    checkpoint_every: int = option(0, "checkpoint every N steps (0: at the end of every epoch)", is_int(0), "training")
    keep_checkpoints: int = option(2, "most recent checkpoints kept (0: all)", is_int(0), "training")
    num_workers: int = option(0, "DataLoader worker processes", is_int(0), "training")
    log_every: int = option(10, "log the loss every N steps", is_int(1), "training")
    stop_after_steps: int | None = option(None, "end this invocation after N steps with a checkpoint (time-limited "
                                          "jobs; continue with --resume)", optional(is_int(1)))  # fmt: skip

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, _DefaultInt):  # not given: virtual_batch_size names the batch
            self.batch_size = int(self.batch_size) if self.virtual_batch_size is None else self.virtual_batch_size
        validate_options(self, _training_rules)
        self.k_values = tuple(self.k_values)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "k_values": list(self.k_values)}
