"""The one spec engine of the recipes: ``parse(SpecClass, argv)`` turns a command line into a recipe's spec.

A spec is a dataclass of :func:`~pml_suprank.training.config.option` fields, one flag each (booleans ``--flag
true/false`` or bare ``--flag``; lists comma- or space-separated; dicts as JSON). ``parse`` reads ``argv`` and each
``--config`` file once and lays the values over each other: field defaults < the recipe's defaults < the model's
recorded data spec (:func:`model_data`) < ``--config`` files < flags; the spec is then built once, a refused value
named where it came from (``--flag``, ``file: section.key``).

Optional attributes of a spec class: ``DESCRIPTION``; ``FLAGS`` (other flag strings of a field); ``GROUPS``
(``(title, first field)`` of the ``--help`` groups; an option class's ``GROUP``); ``option_classes()`` (the dataclasses
holding its flags); ``read_config(path)`` (a ``--config`` file as ``(file as read, layer)``; ``CONFIG_APPEND``: the
flag repeats; ``CONFIG_HELP``); ``add_arguments(parser)``; ``MODEL_DATA`` (fields naming a dataset in place of the
model's recorded one; the ``model_data`` field receives the data spec); ``from_options(values, given=, where=,
files=)`` (default: ``cls(**values)`` checked by :func:`~pml_suprank.training.config.validate_options`, its
``REQUIRED`` fields set, then ``RULES(values) -> [problem]``, the rules between its fields).
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from .._safe_json import loads_json
from .._validation import optional, shorten
from ..data.data_spec import DATA_SPEC_FILE, read_data_spec
from .config import (
    OptionError,
    TrainingConfig,
    field_default,
    field_problem,
    option,
    validate_options,
)
from .options import DataOptions

__all__ = [
    "build_parser",
    "merge_layers",
    "model_data",
    "parse",
    "read_sections",
    "section_problems",
    "shared",
    "str2bool",
]

S = TypeVar("S")
#: a layer of option values: ``{field name: (where it came from, value)}``
Layer = Mapping[str, tuple[str, Any]]
_KEEP = object()
_EXAMPLES = {int: "1,10", float: "0.5,1.0", str: "a,b"}


def shared(cls: type, name: str, default: Any = _KEEP, help: str | None = None) -> Any:
    """The option ``name`` of the option dataclass ``cls`` (its help and check) as a field of another spec: one
    declaration; ``default`` / ``help`` replace the original's where the recipe means something else."""
    f = {f.name: f for f in fields(cls)}[name]
    check, default = f.metadata.get("check"), field_default(f) if default is _KEEP else default
    check = optional(check) if default is None and check is not None and not check(None) else check
    metadata = {k: f.metadata[k] for k in ("section", "key", "cli", "file")}
    return option(default, help or f.metadata["help"], check=check, **metadata)


# -- flags -------------------------------------------------------------------------------------------------------------
def str2bool(value: str | bool) -> bool:
    """``true/false``, ``yes/no``, ``1/0``, ``on/off`` (any case)."""
    text = str(value).lower()
    if text in ("1", "true", "yes", "y", "on"):
        return True
    if text in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false); got {value!r}")


def _items(kind: type) -> Callable[[str], list[Any]]:
    def parse_items(value: str) -> list[Any]:
        try:
            return [kind(v) for v in str(value).replace(" ", "").split(",") if v]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected comma-separated values such as {_EXAMPLES[kind]}; "
                                             f"got {value!r}") from e  # fmt: skip

    return parse_items


def _json_dict(value: str) -> dict[str, Any]:
    try:
        return loads_json(value, "the value", what="option value", expected=dict)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a JSON object such as {{"img_size": 64}}; got {value!r}') from None


class _FlattenList(argparse.Action):
    """``--k 1,10 100`` → ``[1, 10, 100]`` (comma- and space-separated items)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, [x for v in values for x in v])


def _argparse_kwargs(tp: Any) -> dict[str, Any]:
    """The ``add_argument`` keywords of a field annotation (``X | None`` as ``X``; a ``Literal`` of names is a str)."""
    args = [a for a in get_args(tp) if a is not type(None)]
    tp = args[0] if get_origin(tp) in (Union, types.UnionType) and len(args) == 1 else tp
    origin = get_origin(tp) or tp
    if tp is bool:
        return {"type": str2bool, "nargs": "?", "const": True, "metavar": "{true,false}"}
    if origin in (list, tuple, Sequence):
        item = (get_args(tp) or (str,))[0]
        return {"type": _items(item if item in _EXAMPLES else str), "nargs": "+", "action": _FlattenList}
    if origin is dict:
        return {"type": _json_dict}
    return {"type": tp if tp in (int, float, str) else str}


def _option_fields(spec_cls: type) -> list[tuple[type, Field]]:
    classes = spec_cls.option_classes() if hasattr(spec_cls, "option_classes") else (spec_cls,)
    return [(cls, f) for cls in classes for f in fields(cls) if f.metadata.get("cli", True)]


def build_parser(
    spec_cls: type, defaults: Mapping[str, Any] | None = None, description: str | None = None, *, config: bool = False
) -> argparse.ArgumentParser:
    """The parser of ``spec_cls``: ``--config`` when it reads one (or ``config``), its own actions, one flag per
    option field (no default of its own: an option not given is absent from the namespace; ``--help`` shows the
    default, ``defaults`` replacing the field's)."""
    parser = argparse.ArgumentParser(description=description or getattr(spec_cls, "DESCRIPTION", None),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    if config or hasattr(spec_cls, "read_config"):
        help = getattr(spec_cls, "CONFIG_HELP", "a bundled config name or a YAML file; flags win")
        parser.add_argument("--config", action="append" if getattr(spec_cls, "CONFIG_APPEND", False) else "store",
                            help=help)  # fmt: skip
    if hasattr(spec_cls, "add_arguments"):
        spec_cls.add_arguments(parser)
    defaults, flags = dict(defaults or {}), getattr(spec_cls, "FLAGS", {})
    starts = {first: title for title, first in getattr(spec_cls, "GROUPS", ())}
    group, previous = parser, None
    for cls, f in _option_fields(spec_cls):
        if f.name in starts or (cls is not previous and hasattr(cls, "GROUP")):
            group = parser.add_argument_group(starts.get(f.name) or cls.GROUP)
        previous, default, check = cls, defaults.get(f.name, field_default(f)), f.metadata.get("check")
        default = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        kwargs = _argparse_kwargs(get_type_hints(cls)[f.name])
        if check is not None and check.choices is not None:  # the field's check decides the metavar
            kwargs.setdefault("metavar", "{" + ",".join(map(str, check.choices)) + "}")
        group.add_argument(*flags.get(f.name, [f"--{f.name}"]), dest=f.name, default=argparse.SUPPRESS,
                           help=f"{f.metadata['help']} (default: {default})", **kwargs)  # fmt: skip
    return parser


# -- layers ------------------------------------------------------------------------------------------------------------
def merge_layers(layers: Sequence[Layer]) -> tuple[dict[str, Any], dict[str, str]]:
    """Lay ``layers`` over each other in order (a later one wins); return ``(values, where)``. ``virtual_batch_size``
    is another name of ``batch_size``: a layer giving it alone drops an earlier layer's batch size (two different
    values are refused by :class:`~pml_suprank.training.config.TrainingConfig`, naming both flags)."""
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for layer in layers:
        if layer.get("virtual_batch_size", (None, None))[1] is not None and "batch_size" not in layer:
            values.pop("batch_size", None), where.pop("batch_size", None)
        for name, (source, value) in layer.items():
            values[name], where[name] = value, source
    return values, where


def _recorded_problems(spec: Mapping[str, Any]) -> list[str]:
    """The values of a data spec against the checks of the flags that set them (``--num_per_class``, ...)."""
    data, train = ({f.name: f for f in fields(c)} for c in (DataOptions, TrainingConfig))
    problems = [f"unknown key 'data.{k}' (valid: {sorted(data)})" for k in spec["data"] if k not in data]
    problems += [f"data.{k} {p}" for k, v in spec["data"].items() if k in data and (p := field_problem(data[k], v))]
    return problems + [f"{k} {p}" for k in ("seed", "k_values", "alpha")
                       if k in spec and (p := field_problem(train[k], spec[k])) is not None]  # fmt: skip


def model_data(model: str, dataset: str | None = None, data_root: str | None = None) -> dict[str, Any] | None:
    """The data spec recorded in the model folder ``model`` (:func:`pml_suprank.data.data_spec.read_data_spec`),
    each value held to the check of the flag that sets it; ``dataset`` / ``data_root``: what the user typed."""
    return read_data_spec(model, dataset=dataset, data_root=data_root, problems=_recorded_problems)


def parse(spec_cls: type[S], argv: list[str] | None = None, *, defaults: Mapping[str, Any] | None = None,
          description: str | None = None, rest: list[str] | None = None,
          read_config: Callable[[str], tuple[Any, Layer]] | None = None) -> S:  # fmt: skip
    """The spec of one invocation (see the module docstring). Any refusal is one ``error:`` line naming the flag or
    the file and key, exit status 2. ``defaults``: the preset's values; ``rest``: a list receiving the tokens that are
    no flag of the spec (default: refused); ``read_config``: the ``--config`` reader (default: the class's)."""
    read_config = read_config or getattr(spec_cls, "read_config", None)
    parser = build_parser(spec_cls, defaults, description, config=read_config is not None)
    namespace, unknown = parser.parse_known_args(argv) if rest is not None else (parser.parse_args(argv), [])
    (rest if rest is not None else []).extend(unknown)
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    layers: list[Layer] = [{k: (k, v) for k, v in (defaults or {}).items()}]
    files, paths = [], vars(namespace).pop("config", None) or []
    flag_only = {f.name for _, f in _option_fields(spec_cls) if not f.metadata.get("file", True)}
    try:
        for path in [paths] if isinstance(paths, str) else paths:
            raw, layer = read_config(path)  # type: ignore[misc]
            for name in sorted(flag_only & set(layer)):  # files are data: they never upload nor choose weights
                raise OptionError(f"{layer[name][0]}: a config file cannot set {name}; give --{name} on the command "
                                  "line if you mean it")  # fmt: skip
            files.append(raw)
            layers.append(layer)
    except (ValueError, FileNotFoundError) as e:
        parser.error(f"--config: {e}")
    layers.append({k: (flags.get(k, k), v) for k, v in vars(namespace).items()})
    given, where = frozenset(n for layer in layers[1:] for n in layer), {}
    try:
        values, where = merge_layers(layers)
        if getattr(spec_cls, "MODEL_DATA", None) and values.get("model"):
            typed = next((values[n] for n in spec_cls.MODEL_DATA if values.get(n) is not None), None)
            try:
                recorded = model_data(values["model"], typed, values.get("data_root"))
            except ValueError as e:
                parser.error(f"--model: {e}")
            if recorded is not None:
                names, source = {f.name for f in fields(spec_cls)}, f"{values['model']}/{DATA_SPEC_FILE}:"
                layers.insert(1, {k: (f"{source} {k}", recorded[k]) for k in ("seed", "k_values", "alpha")
                                  if k in recorded and k in names})  # fmt: skip
                values, where = merge_layers(layers)
                values["model_data"] = recorded
        if hasattr(spec_cls, "from_options"):
            return spec_cls.from_options(values, given=given, where=where, files=files)
        spec = spec_cls(**values)
        validate_options(spec, getattr(spec_cls, "RULES", None))  # once, when built: replace() does not check again
        return spec
    except OptionError as e:
        parser.error(e.located(where))
    except (ValueError, TypeError) as e:
        parser.error(str(e))


# -- --config files ----------------------------------------------------------------------------------------------------
def section_problems(
    cfg: Mapping[str, Any], keys: Mapping[str, Mapping[str, Any]], metadata: Mapping[str, Any] = ()
) -> tuple[list[str], dict[str, tuple[str, Any]]]:
    """The problems of a configuration mapping (unknown sections and keys, a section that is no mapping, a metadata
    value its check refuses) and its options ``{field name: ("section.key", value)}``. ``keys``: ``{section: {key:
    field name, or the check of a metadata key}}``; ``metadata``: top-level keys holding no option ``{key: check or
    None}``."""
    errors: list[str] = []
    out: dict[str, tuple[str, Any]] = {}

    def check(name: str, check: Any, value: Any) -> None:
        if check is not None and not check(value):
            errors.append(f"'{name}' must be {check.expected}; got {shorten(repr(value), 200)}")

    for section, body in cfg.items():
        if section in metadata:
            check(section, metadata[section], body)
        elif section not in keys:
            errors.append(f"unknown top-level key '{section}' (valid: {sorted([*metadata, *keys])})")
        elif body is not None and not isinstance(body, dict):
            errors.append(f"section '{section}' must be a mapping; got {type(body).__name__}")
        else:
            for key, value in (body or {}).items():
                name = keys[section].get(key)
                if name is None:
                    errors.append(f"unknown key '{section}.{key}' (valid keys of '{section}': {sorted(keys[section])})")
                elif isinstance(name, str):
                    out[name] = (f"{section}.{key}", value)
                else:
                    check(f"{section}.{key}", name, value)
    return errors, out


def read_sections(path: str | Path, keys: Mapping[str, Mapping[str, Any]], *, metadata: Mapping[str, Any] = (),
                  checks: Callable[[dict[str, Any]], list[str]] | None = None, kind: str = "configuration file",
                  ) -> tuple[dict[str, Any], dict[str, tuple[str, Any]]]:  # fmt: skip
    """The one reader of a configuration file (a hub_config, a ``fit_heat`` / ``ood_benchmark`` ``--config``):
    bounded safe YAML (:func:`pml_suprank._safe_yaml.load_yaml`), a mapping of sections (:func:`section_problems`;
    ``checks``: the file kind's further rules). Returns ``(raw mapping, {field name: ("<file>: section.key", value)})``;
    raises ``OptionError`` naming the file, the ``kind`` and the problems (the first 20).
    """
    from .._safe_yaml import load_yaml  # PyYAML: the recipes extra

    cfg = load_yaml(path)  # aliases, deep nesting and oversized files refused before any value is built
    cfg = {} if cfg is None else cfg
    if not isinstance(cfg, dict):
        raise OptionError(f"{path}: a {kind} must be a YAML mapping of sections; got {type(cfg).__name__}")
    errors, values = section_problems(cfg, keys, metadata)
    errors += checks(cfg) if checks else []
    if errors:
        shown = [shorten(e) for e in errors[:20]] + ([f"... {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise OptionError(f"{path}: invalid {kind}: {shown[0]}" if len(shown) == 1 else
                          f"{path}: invalid {kind}:\n  - " + "\n  - ".join(shown))  # fmt: skip
    return cfg, {name: (f"{path}: {where}", value) for name, (where, value) in values.items()}
