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
from dataclasses import Field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from .._safe_json import loads_json
from ..losses.registry import registered_losses
from .config import field_default
from .hub_config import merge_hub_configs, read_hub_config
from .options import loss_keys, option_fields, recipe_options
from .run_spec import FIELD_PARTS, PARTS, RunSpec

__all__ = [
    "add_option_arguments",
    "build_recipe_parser",
    "int_list",
    "json_dict",
    "losses_listing",
    "parse_run_spec",
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
# the training command line → RunSpec
# ---------------------------------------------------------------------------------------------------------------------
_PART_TITLES = {"run": "run", "data": "data", "model": "model", "loss": "loss (SupRank H⁻ and decomposability)",
                "train": "training"}  # fmt: skip


def losses_listing() -> str:
    """Every loss the training command trains: the registered ones (with their labels and options), the installed
    plugins and the other spellings of ``--loss``."""
    from ..losses.registry import ENTRY_POINT_GROUP, installed_plugins

    lines = ["registered losses (--loss NAME):"]
    for name, entry in registered_losses().items():
        labels = "hierarchical labels (N, L)" if entry.hierarchical else "fine labels (N,)"
        extra = ", multi-label" if entry.multilabel else ""
        options = ", ".join(loss_keys(name, entry))
        lines.append(f"  {name:<10} {entry.cls.__name__:<15} {labels}{extra}; options: {options}")
    plugins = [name for name in installed_plugins() if name not in registered_losses()]
    if plugins:
        lines.append(f"installed plugins (entry-point group {ENTRY_POINT_GROUP}): {', '.join(plugins)}")
    lines += [
        "pytorch-metric-learning baselines: --loss pml:ClassName (e.g. pml:MultiSimilarityLoss, pml:ArcFaceLoss), "
        "arguments by --loss_kwargs",
        "your own loss class: --loss package.module:ClassName (imported from the working directory or PYTHONPATH; "
        "typed on the command line only, never read from a --config file)",
    ]
    return "\n".join(lines)


class _ListLosses(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=kwargs.get("help"))

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        print(losses_listing())  # noqa: T201 - the command's answer, as --help
        parser.exit()


class RecipeParser(argparse.ArgumentParser):
    """The parser of the training command: one flag per :class:`~pml_suprank.training.RunSpec` option (no default
    of its own: an option not given keeps ``run_defaults``, the preset's no-argument run, then the field default)."""

    run_defaults: dict[str, Any]


def build_recipe_parser(
    description: str, defaults: Mapping[str, Any], losses: Sequence[str] | None = None
) -> RecipeParser:
    """The training command's parser: ``--config``, ``--list_losses`` and one flag per
    :class:`~pml_suprank.training.RunSpec` field.

    Args:
        description: The command's one-line description.
        defaults: The preset's no-argument run (replacing the dataclass defaults, shown by ``--help``).
        losses: Unused (every loss is a ``--loss`` value); kept for callers of the former per-recipe parsers.
    """
    parser = RecipeParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog=losses_listing())  # fmt: skip
    parser.run_defaults = dict(defaults)
    parser.add_argument(
        "--config",
        action="append",
        default=None,
        help="hub_config: a bundled name (e.g. happier_sop; pml_suprank.training.hub_config.bundled_hub_configs()) "
        "or a YAML file; repeat it to lay partial override files over a base; command-line flags override the files",
    )
    parser.add_argument("--list_losses", action=_ListLosses, help="list every loss --loss takes, and exit")
    for part, cls in PARTS.items():
        group = parser.add_argument_group(_PART_TITLES[part])
        add_option_arguments(group, cls, defaults=defaults)
    for action in parser._actions:  # an option not given is absent from the namespace: the layers decide
        if action.dest in FIELD_PARTS:
            action.help = f"{action.help} (default: {action.default})"
            action.default = argparse.SUPPRESS
            if action.choices is not None:  # the field's check decides (the same message as a file's value)
                action.metavar, action.choices = "{" + ",".join(map(str, action.choices)) + "}", None
    return parser


def parse_run_spec(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> RunSpec:
    """The :class:`~pml_suprank.training.RunSpec` of an invocation: ``argv`` parsed once, each ``--config`` file read
    once, the spec built once and validated once.

    Precedence: dataclass defaults < the preset's defaults (``parser.run_defaults``) < the ``--config`` hub_config(s)
    (several files are laid over each other in order, each may be partial) < the flags given.
    ``virtual_batch_size`` is another name of ``batch_size`` (:func:`~pml_suprank.training.rules.merge_option_layers`).
    Any inconsistency is a ``parser.error`` (exit 2, nothing built).
    """
    namespace = parser.parse_args(argv)
    flags = {k: v for k, v in vars(namespace).items() if k in FIELD_PARTS}
    paths = namespace.config or []
    try:
        files = [read_hub_config(path, partial=True) for path in paths]
    except (ValueError, FileNotFoundError) as e:
        parser.error(f"--config: {e}")
    layers = [("defaults", getattr(parser, "run_defaults", {}))]
    layers += [(f"--config {path}", recipe_options(cfg)) for path, cfg in zip(paths, files, strict=True)]
    layers.append(("flags", flags))
    try:
        spec = RunSpec.from_layers(layers, merge_hub_configs(*files), files=range(1, len(files) + 1), search_cwd=True)
        return spec.validate()
    except ValueError as e:
        parser.error(str(e))
