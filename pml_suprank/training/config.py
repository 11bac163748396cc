"""The training options: :class:`TrainingConfig`, the single source of every training hyper-parameter.

Every field carries its help text, its hub_config section and a value check in its ``metadata`` (see
:func:`option`); the recipes' command line (:mod:`pml_suprank.training.spec`) and the hub_config schema
(:mod:`pml_suprank.training.hub_config`) are generated from these fields, so an option is written exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from typing import Any, Literal, get_args

import numpy as np

from .._validation import shorten

__all__ = [
    "OptionCheck",
    "OptionError",
    "TrainingConfig",
    "field_default",
    "is_bool",
    "is_choice",
    "is_finite",
    "is_int",
    "is_number",
    "is_str",
    "list_of",
    "option",
    "optional",
    "validate_options",
]

OptimizerType = Literal["adam", "adamw", "sgd"]
SchedulerType = Literal["cosine", "constant"]
SamplerType = Literal["m_per_class", "hierarchical"]


# ---------------------------------------------------------------------------------------------------------------------
# option metadata and value checks (used by the hub_config schema)
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OptionCheck:
    """A value check of a configuration file: ``fn(value) -> bool`` and the expectation, e.g. ``"an int >= 1"``.

    ``choices`` lists the valid values of a closed set (also the argparse ``choices=``); ``kind`` (``"int"``,
    ``"number"``, ``"bool"``, ``"choice"``, ``"str"`` or ``None``) and ``bounds`` (``(low, high, strict,
    open_high)``) describe the check for tools and tests (its boundary values), never re-check a value.
    """

    fn: Callable[[Any], bool]
    expected: str
    choices: tuple[Any, ...] | None = None
    kind: str | None = None
    bounds: tuple[float, float, bool, bool] | None = None

    def __call__(self, value: Any) -> bool:
        return bool(self.fn(value))


def is_bool() -> OptionCheck:
    """A YAML boolean (not 0/1)."""
    return OptionCheck(lambda v: isinstance(v, bool), "a bool", kind="bool")


def is_str(expected: str = "a non-empty string") -> OptionCheck:
    """A non-empty string; ``expected`` is what the error message says."""
    return OptionCheck(lambda v: isinstance(v, str) and bool(v), expected, kind="str")


#: the largest integer a configuration value may hold unless its option sets a tighter bound: values that size work
#: (epochs, batch sizes, memory slots, steps) stay within 32-bit counts, so a loaded file cannot ask for unbounded work
MAX_CONFIG_INT = 2**31 - 1


def is_int(low: int = 0, high: int = MAX_CONFIG_INT) -> OptionCheck:
    """An int (not a bool) with ``low <= value <= high``."""
    expected = f"an int >= {low}" if high == MAX_CONFIG_INT else f"an int in [{low}, {high}]"
    return OptionCheck(
        lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high, expected, kind="int",
        bounds=(low, high, False, False),
    )  # fmt: skip


def is_number(
    low: float = 0.0, *, strict: bool = False, high: float = math.inf, open_high: bool = False
) -> OptionCheck:
    """A finite real number ``>= low`` (``> low`` if ``strict``) and ``<= high`` (``< high`` if ``open_high``)."""

    def check(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            return False
        return (v > low if strict else v >= low) and (v < high if open_high else v <= high)

    lo = f"{'>' if strict else '>='} {low:g}"
    if high == math.inf:
        expected = f"a number {lo}"
    else:
        expected = f"a number in {'(' if strict else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    return OptionCheck(check, expected, kind="number", bounds=(low, high, strict, open_high))


def is_finite() -> OptionCheck:
    """Any finite real number (not a bool; e.g. an OOD threshold, which may be negative)."""
    return replace(is_number(-math.inf), expected="a finite number")


def is_choice(*values: Any) -> OptionCheck:
    """One of ``values`` (also the argparse ``choices=``)."""
    return OptionCheck(lambda v: v in values, f"one of {', '.join(map(str, values))}", tuple(values), kind="choice")


def optional(check: OptionCheck) -> OptionCheck:
    """``None`` (YAML ``null``) or a value passing ``check``."""
    return OptionCheck(
        lambda v: v is None or check(v), f"null or {check.expected}", check.choices, check.kind, check.bounds
    )


def list_of(check: OptionCheck, expected: str, min_len: int = 1) -> OptionCheck:
    """A list (or tuple) of at least ``min_len`` items passing ``check``."""
    return OptionCheck(lambda v: isinstance(v, (list, tuple)) and len(v) >= min_len and all(map(check, v)), expected)


def option(
    default: Any,
    help: str,
    *,
    section: str | None = None,
    key: str | None = None,
    check: OptionCheck | None = None,
    cli: bool = True,
) -> Any:
    """A dataclass field with its documentation: the one place an option is described.

    Args:
        default: Default value (a list is copied per instance).
        help: One-line help shown by ``--help`` (with the default) and used in error messages.
        section: hub_config section holding the key (``None``: command line only).
        key: Key inside the section (default: the field name).
        check: Value check of a configuration file (type and range).
        cli: Expose the option on the recipes' command line.
    """
    metadata = {"help": help, "section": section, "key": key, "check": check, "cli": cli}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def field_default(f: Field) -> Any:
    """The default of a dataclass field (calling its factory)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


#: the largest learning rate an option accepts: larger ones overflow the weights at the first step (float32 holds
#: 3.4e38; the reference recipes use <= 10, the ClusterLoss proxies' rate)
MAX_LR = 100.0
#: the largest weight decay (a multiple of the weights subtracted per step: more diverges)
MAX_WEIGHT_DECAY = 10.0
#: the largest H-AP relevance exponent (HAPPIER_F uses a few units; 2**alpha stays finite in float32 far beyond)
MAX_ALPHA = 100.0
#: the largest scale of a scalar hyper-parameter (gradient clip, SupRank rho): finite in float32 after products
MAX_SCALE = 1e6


def _rate() -> OptionCheck:
    return is_number(0, high=MAX_LR)


def _pos(low: int) -> OptionCheck:
    return is_int(low)


class _DefaultInt(int):
    """An int default that says it was not given (``TrainingConfig.batch_size``: ``virtual_batch_size`` sets it)."""


class OptionError(ValueError, TypeError):
    """Option values refused by their checks (a ``ValueError`` and, for a wrong type, a ``TypeError``): the message
    names each option, what it expects and what it got. ``problems`` lists them as ``(field name or None, text)``;
    :meth:`located` names each field where its value came from (``--flag``, ``file: section.key``)."""

    def __init__(self, problems: str | Sequence[str | tuple[str | None, str]]) -> None:
        items = [problems] if isinstance(problems, str) else list(problems)
        self.problems = [(None, p) if isinstance(p, str) else (p[0], p[1]) for p in items]
        super().__init__(self.located({}))

    def located(self, where: Mapping[str, str]) -> str:
        """The message with each field named by ``where`` (field name → flag or file and key)."""
        return "; ".join(text if name is None else f"{where.get(name, name)} {text}" for name, text in self.problems)


def _plain(value: Any) -> Any:
    """Tuples as lists and numpy scalars as Python numbers, as a YAML file or the command line would give them."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def field_problem(f: Field, value: Any) -> str | None:
    """Why the option field ``f`` refuses ``value`` (``"must be ...; got ..."``; ``None``: accepted) — the field's
    metadata ``check`` is the only check of a single value; ``None`` is accepted where it is the field's default."""
    check = f.metadata.get("check")
    if check is None or (value is None and field_default(f) is None) or check(_plain(value)):
        return None
    return f"must be {check.expected}; got {shorten(repr(value), 200)}"


def validate_options(obj: Any, rules: Callable[[dict[str, Any]], list[str]] | None = None) -> None:
    """Check an option dataclass instance (its ``__post_init__``): every field against its metadata check, then
    ``rules`` (the rules between its own fields) on its values.

    Raises:
        OptionError: naming every refused field (or the broken rules).
    """
    problems: list[Any] = [(f.name, p) for f in fields(obj) if (p := field_problem(f, getattr(obj, f.name)))]
    if not problems and rules is not None:
        problems = rules({f.name: getattr(obj, f.name) for f in fields(obj)})
    if problems:
        raise OptionError(problems)


# ---------------------------------------------------------------------------------------------------------------------
# the training configuration
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class TrainingConfig:
    """Hyper-parameters of a training run (plain values; recipes fill it from the command line and ``--config``).

    Every field is documented by the ``help`` of its metadata (``python recipes/train_happier.py --help`` lists them
    with their defaults). The global batch of a step is ``num_processes * batch_size``; ``warmup_epochs`` freezes the
    backbone (no gradient, no step) and holds the schedule; the cosine schedule decays each group's learning rate to
    ``min_lr_ratio`` times its initial value; ``stop_after_steps`` ends one invocation (after a checkpoint) for jobs
    with a time limit, to be continued with ``resume``.

    Exact large batches (``docs/large-batches.md``): ``virtual_batch_size`` is the batch the sampler draws and the loss
    ranks (per process; it replaces ``batch_size``, which must then be equal); ``chunk_size`` embeds and
    back-propagates it that many images at a time with :func:`~pml_suprank.training.cached_backward` (the same
    gradient as the whole batch at once). Both are part of the run fingerprint: a resume with another value of either
    is refused like any other hyper-parameter change (``resume_ignore_config`` continues anyway; another
    ``chunk_size`` then changes only the floating-point summation order of the gradient).
    """

    output_dir: str = option("outputs/run", "folder for checkpoints, the final model and the plots",
                             check=is_str("a folder path"))  # fmt: skip
    seed: int = option(0, "seed of the model init, samplers and per-item augmentation", section="training",
                       check=_pos(0))  # fmt: skip
    epochs: int = option(10, "number of epochs (one pass of the batch sampler)", section="training", check=_pos(1))
    max_train_steps: int | None = option(
        None, "stop after N optimizer steps (also shortens the cosine schedule)", section="training",
        check=optional(_pos(1)),
    )  # fmt: skip
    batch_size: int = option(
        _DefaultInt(64), "images per step per process (the ranking batch; --virtual_batch_size is another name of it)",
        section="sampler_options", check=_pos(2),
    )  # fmt: skip
    virtual_batch_size: int | None = option(
        None, "the ranking batch: images the sampler draws and the loss ranks per step and process; replaces "
        "--batch_size (with --chunk_size it need not fit in memory)", section="sampler_options",
        check=optional(_pos(2)),
    )  # fmt: skip
    chunk_size: int | None = option(
        None, "gradient caching: embed and back-propagate the batch this many images at a time (exact: the gradient "
        "of the whole batch; needs --freeze_batch_norm true with a BatchNorm backbone); none: all at once",
        section="training", check=optional(_pos(1)),
    )  # fmt: skip
    samples_per_class: int = option(4, "images per class in a batch (m)", section="sampler_options", check=_pos(2))
    sampler: SamplerType = option(
        "m_per_class", "batch sampler (hierarchical = the SOP sampler over pairs of super-classes, needs 2-D labels)",
        section="sampler_options", check=is_choice(*get_args(SamplerType)),
    )  # fmt: skip
    batches_per_super_tuple: int = option(4, "hierarchical sampler: batches per pair of super-classes",
                                          section="sampler_options", check=_pos(1))  # fmt: skip
    super_classes_per_batch: int = option(2, "hierarchical sampler: super-classes per batch",
                                          section="sampler_options", check=_pos(1))  # fmt: skip
    optimizer: OptimizerType = option("adam", "optimizer (sgd: Nesterov with --momentum)", section="optimizer",
                                      check=is_choice(*get_args(OptimizerType)))  # fmt: skip
    lr_backbone: float = option(1e-4, "learning rate of the timm trunk", section="optimizer", check=_rate())
    lr_head: float = option(2e-4, "learning rate of pooling (GeM p), projection and classifier", section="optimizer",
                            check=_rate())  # fmt: skip
    lr_proxies: float = option(10.0, "learning rate of the loss proxies (ClusterLoss)", section="optimizer",
                               check=_rate())  # fmt: skip
    weight_decay: float = option(1e-4, "weight decay of the backbone and head groups", section="optimizer",
                                 check=is_number(0, high=MAX_WEIGHT_DECAY))  # fmt: skip
    proxies_weight_decay: float = option(0.0, "weight decay of the loss proxies", section="optimizer",
                                         check=is_number(0, high=MAX_WEIGHT_DECAY))  # fmt: skip
    momentum: float = option(0.9, "SGD momentum (Nesterov)", section="optimizer", check=is_number(0, high=1))
    scheduler: SchedulerType = option("cosine", "learning-rate schedule", section="scheduler",
                                      check=is_choice(*get_args(SchedulerType)))  # fmt: skip
    min_lr_ratio: float = option(0.0, "final lr of the cosine schedule as a fraction of each group's initial lr",
                                 section="scheduler", check=is_number(0, high=1))  # fmt: skip
    warmup_epochs: int = option(0, "first epochs with the backbone frozen and no scheduler step", section="training",
                                check=_pos(0))  # fmt: skip
    freeze_batch_norm: bool = option(False, "keep the backbone's BatchNorm layers in eval mode (ResNet-50 recipes)",
                                     section="model", check=is_bool())  # fmt: skip
    pca_samples: int = option(10000, "projection_init=pca: training images whose features give the PCA",
                              section="model", check=_pos(2))  # fmt: skip
    grad_clip: float | None = option(None, "clip the gradient norm to this value", section="training",
                                     check=optional(is_number(0, strict=True, high=MAX_SCALE)))  # fmt: skip
    max_nonfinite_steps: int = option(
        10, "steps in a row with a non-finite loss or gradient that are skipped (no update, as fp16's GradScaler "
        "does) before the run stops with an error and a checkpoint of the last good state (0: stop at the first)",
        section="training", check=_pos(0),
    )  # fmt: skip
    memory_size: int = option(0, "cross-batch memory size (0: none)", section="memory", check=_pos(0))
    memory_warmup_steps: int = option(0, "steps before the memory loss is used", section="memory", check=_pos(0))
    hierarchical_labels: bool = option(
        True, "give the loss all label columns (N, L) instead of the fine labels (N,)", cli=False, check=is_bool()
    )
    eval_every: int = option(1, "evaluate every N epochs (0: only at the end)", section="evaluation", check=_pos(0))
    eval_batch_size: int = option(128, "evaluation batch size per process", section="evaluation", check=_pos(1))
    k_values: Sequence[int] = option((1, 10), "Recall@k values, e.g. 1,10,100", section="evaluation",
                                     check=list_of(_pos(1), "a non-empty list of ints >= 1"))  # fmt: skip
    alpha: float = option(1.0, "H-AP relevance exponent of the evaluator and of HAPPIER (alpha > 1: HAPPIER_F)",
                          section="loss", check=is_number(0, strict=True, high=MAX_ALPHA))  # fmt: skip
    checkpoint_every: int = option(0, "checkpoint every N steps (0: at the end of every epoch)", section="training",
                                   check=_pos(0))  # fmt: skip
    keep_checkpoints: int = option(2, "most recent checkpoints kept (0: all)", section="training", check=_pos(0))
    num_workers: int = option(0, "DataLoader worker processes", section="training", check=_pos(0))
    log_every: int = option(10, "log the loss every N steps", section="training", check=_pos(1))
    stop_after_steps: int | None = option(
        None, "end this invocation after N steps with a checkpoint (time-limited jobs; continue with --resume)",
        check=optional(_pos(1)),
    )

    def __post_init__(self) -> None:
        # virtual_batch_size is another name of the batch size: it sets batch_size unless that was given too
        if isinstance(self.batch_size, _DefaultInt):
            self.batch_size = int(self.batch_size) if self.virtual_batch_size is None else self.virtual_batch_size
        from .rules import training_problems

        validate_options(self, training_problems)
        self.k_values = tuple(self.k_values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingConfig:
        """Build from a dict, rejecting unknown keys with the list of valid ones."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown TrainingConfig keys {unknown}; valid keys: {sorted(names)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["k_values"] = list(self.k_values)
        return d
