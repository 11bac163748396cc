"""Command-line options generated from the option dataclasses (:mod:`pml_suprank.training.options`), and the one
place a recipe's :class:`~pml_suprank.training.RunSpec` is built (:func:`parse_run_spec`).

One ``--<field name>`` flag per field (snake_case), with the field's help and its default shown by ``--help``
(use ``argparse.ArgumentDefaultsHelpFormatter``); booleans are ``--flag true/false`` (a bare ``--flag`` means true),
lists are comma-separated (``--k_values 1,10,100``; space-separated values are accepted too), dicts are JSON.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import Field, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from .._safe_json import loads_json
from ..losses.registry import registered_losses
from .config import field_default
from .options import loss_keys, option_fields, recipe_options
from .run_spec import FIELD_PARTS, PARTS, RunSpec

__all__ = [
    "add_option_arguments",
    "build_recipe_parser",
    "given_options",
    "int_list",
    "json_dict",
    "parse_run_spec",
    "recipe_losses",
    "str2bool",
    "str_list",
]


def str2bool(value: str | bool) -> bool:
    """``true/false``, ``yes/no``, ``1/0``, ``on/off`` (any case)."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("1", "true", "yes", "y", "on"):
        return True
    if value.lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false); got {value!r}")


def int_list(value: str) -> list[int]:
    """``"1,10,100"`` → ``[1, 10, 100]``."""
    try:
        return [int(v) for v in str(value).replace(" ", "").split(",") if v]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,10; got {value!r}") from e


def float_list(value: str) -> list[float]:
    """``"0.16,1.0"`` → ``[0.16, 1.0]``."""
    try:
        return [float(v) for v in str(value).replace(" ", "").split(",") if v]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0.5,1.0; got {value!r}") from e


def str_list(value: str) -> list[str]:
    """``"fine_label,coarse_label"`` → ``["fine_label", "coarse_label"]``."""
    return [v for v in str(value).replace(" ", "").split(",") if v]


def json_dict(value: str) -> dict[str, Any]:
    """A JSON object given on the command line."""
    try:
        out = loads_json(value, "the value", what="option value")
    except ValueError as e:
        raise argparse.ArgumentTypeError(f'expected a JSON object such as {{"img_size": 64}}; got {value!r}') from e
    if not isinstance(out, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object; got {value!r}")
    return out


class _FlattenList(argparse.Action):
    """``--k 1,10 100`` → ``[1, 10, 100]`` (comma- and space-separated items)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, [x for v in values for x in v])


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _argparse_kwargs(tp: Any, f: Field) -> dict[str, Any]:
    tp = _strip_optional(tp)
    origin = get_origin(tp)
    check = f.metadata.get("check")
    if tp is bool:
        return {"type": str2bool, "nargs": "?", "const": True, "metavar": "{true,false}"}
    if origin is Literal:
        return {"type": type(get_args(tp)[0]), "choices": list(get_args(tp))}
    if origin in (list, tuple, Sequence, typing.Sequence) or tp in (list, tuple):
        item = (get_args(tp) or (str,))[0]
        parse = {int: int_list, float: float_list}.get(item, str_list)
        return {"type": parse, "nargs": "+", "action": _FlattenList}
    if tp is dict or origin is dict:
        return {"type": json_dict}
    out: dict[str, Any] = {"type": tp if tp in (int, float, str) else str}
    if check is not None and check.choices is not None:
        out["choices"] = list(check.choices)
    return out


def add_option_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    choices: Mapping[str, Sequence[Any]] | None = None,
    flags: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """Add one flag per command-line field of the dataclass ``cls``; return the destinations added.

    Args:
        parser: An ``ArgumentParser`` or argument group.
        cls: An option dataclass (``TrainingConfig``, ``ModelOptions``, ...).
        only: Restrict to these field names (in the class order).
        exclude: Leave these fields out.
        defaults: Defaults replacing the class defaults (e.g. a recipe's no-argument run).
        choices: Narrower ``choices=`` per field (e.g. the losses one recipe trains).
        flags: Flag strings per field replacing ``--<name>`` (the first one is shown).
    """
    hints = get_type_hints(cls)
    keep = set(only) if only is not None else None
    defaults, choices, flags = dict(defaults or {}), dict(choices or {}), dict(flags or {})
    added = []
    for _, f in option_fields(cls):
        if not f.metadata.get("cli", True) or f.name in exclude or (keep is not None and f.name not in keep):
            continue
        kwargs = _argparse_kwargs(hints[f.name], f)
        if f.name in choices:
            kwargs["choices"] = list(choices[f.name])
        default = defaults.get(f.name, field_default(f))
        if isinstance(default, tuple):
            default = list(default)
        parser.add_argument(*flags.get(f.name, [f"--{f.name}"]), dest=f.name, default=default,
                            help=f.metadata["help"], **kwargs)  # fmt: skip
        added.append(f.name)
    return added


# ---------------------------------------------------------------------------------------------------------------------
# the training recipes' command line → RunSpec
# ---------------------------------------------------------------------------------------------------------------------
_PART_TITLES = {"run": "run", "data": "data", "model": "model", "loss": "loss (SupRank H⁻ and decomposability)",
                "train": "training"}  # fmt: skip


def recipe_losses(*, hierarchical: bool) -> list[str]:
    """The registered losses a training recipe trains: the hierarchical ones (``train_happier.py``) or the others
    (``train_roadmap.py``), in registration order."""
    return list(registered_losses(hierarchical=hierarchical))


def build_recipe_parser(
    description: str, defaults: Mapping[str, Any], losses: Sequence[str]
) -> argparse.ArgumentParser:
    """A training recipe's parser: ``--config`` plus one flag per :class:`~pml_suprank.training.RunSpec` field.

    Args:
        description: The recipe's one-line description.
        defaults: The recipe's no-argument run (replacing the dataclass defaults, shown by ``--help``).
        losses: The registered losses this recipe trains (``--loss`` choices, the first is the default; loss options
            that none of them takes are left out).
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(
        "--config",
        action="append",
        default=None,
        help="hub_config: a bundled name (e.g. happier_sop; pml_suprank.hub_config.bundled_hub_configs()) or a YAML "
        "file; repeat it to lay partial override files over a "
        "base; command-line flags override the files",
    )
    defaults = {"loss": losses[0], **defaults}
    accepted = {k for name in losses for k in loss_keys(name)} | {"loss"}
    for part, cls in PARTS.items():
        group = parser.add_argument_group(_PART_TITLES[part])
        if part == "loss":
            only = [f.name for f in fields(cls) if f.name in accepted]
            add_option_arguments(group, cls, only=only, defaults=defaults, choices={"loss": list(losses)})
        else:
            add_option_arguments(group, cls, defaults=defaults)
    return parser


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _explicit_flags(parser: argparse.ArgumentParser, argv: list[str] | None) -> dict[str, Any]:
    """The option values given on the command line (argparse leaves a destination that is already set alone, so
    pre-setting each one to a marker keeps the defaults out)."""
    dests = [a.dest for a in parser._actions if a.dest in FIELD_PARTS]
    namespace = parser.parse_args(argv, namespace=argparse.Namespace(**dict.fromkeys(dests, _UNSET)))
    return {d: v for d, v in vars(namespace).items() if d in FIELD_PARTS and v is not _UNSET}


def given_options(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> set[str]:
    """The options the user set: the flags given in ``argv`` and the options of its ``--config`` files (what a
    recipe must not change on its own, e.g. a batch the data cannot fill is refused rather than shrunk)."""
    from .. import hub_config as hc

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", action="append", default=None)
    known, _ = pre.parse_known_args(argv)
    given = set(_explicit_flags(parser, argv))
    for path in known.config or []:
        given |= set(recipe_options(hc.read_hub_config(path, partial=True)))
    return given


def _read_configs(parser: argparse.ArgumentParser, paths: list[str]) -> dict[str, Any]:
    """The ``--config`` files, schema-checked and merged in order (their consistency is checked with the spec)."""
    from .. import hub_config as hc

    try:
        config = hc.merge_hub_configs(*(hc.read_hub_config(path, partial=True) for path in paths))
    except (ValueError, FileNotFoundError) as e:
        parser.error(f"--config: {e}")
    actions = {a.dest: a for a in parser._actions}
    options = recipe_options(config)
    unknown = sorted(set(options) - set(actions))
    if unknown:
        parser.error(f"--config {' '.join(paths)}: option(s) {unknown} are not options of this recipe")
    for dest, value in options.items():
        choices = actions[dest].choices
        if choices is not None and value not in choices:
            parser.error(f"--config: {dest} {value!r} is not trained by this recipe (choose from {choices})")
    return config


def _virtual_batch(files: Mapping[str, Any], flags: Mapping[str, Any], batch_size: int) -> int:
    """The batch of one step per process: ``virtual_batch_size`` when set (it replaces ``batch_size``), else
    ``batch_size``. A ``--virtual_batch_size`` flag overrides the ``--config`` files' ``batch_size``; otherwise a
    ``batch_size`` and a ``virtual_batch_size`` that differ (two flags, a flag and a file, or the files) are refused."""
    v, b = flags.get("virtual_batch_size"), flags.get("batch_size")
    if v is None:
        v = files.get("virtual_batch_size")
        b = b if b is not None else files.get("batch_size")
    if v is not None and b is not None and v != b:
        raise ValueError(
            f"--virtual_batch_size {v} and --batch_size {b} differ: --virtual_batch_size is the batch the sampler "
            "draws and the loss ranks, it replaces --batch_size; give one of them (or the same value to both)"
        )
    return batch_size if v is None else v


def parse_run_spec(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> RunSpec:
    """The :class:`~pml_suprank.training.RunSpec` of a recipe invocation, built once and validated once.

    Precedence: dataclass defaults < the parser's defaults (the recipe's no-argument run) < the ``--config``
    hub_config(s) (several files are merged in order, each may be partial) < the flags given. ``virtual_batch_size``,
    when set, replaces ``batch_size`` (the batch the sampler draws and the loss ranks; two different values given
    are refused, naming both flags). Any inconsistency is a ``parser.error`` (exit 2, nothing built).
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", action="append", default=None)
    known, _ = pre.parse_known_args(argv)
    hub_config = _read_configs(parser, known.config) if known.config else {}
    defaults = {a.dest: a.default for a in parser._actions if a.dest in FIELD_PARTS}
    files, flags = recipe_options(hub_config), _explicit_flags(parser, argv)
    values = {**defaults, **files, **flags}
    try:
        values["batch_size"] = _virtual_batch(files, flags, values["batch_size"])
        return RunSpec.from_values(values, hub_config).validate()
    except ValueError as e:
        parser.error(str(e))
