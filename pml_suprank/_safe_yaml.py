"""YAML for files the user did not write (hub_configs, ``--config`` files): bounded cost before any value is built.

:func:`load_yaml` refuses, naming the file and (where known) the key and the line: a file over :data:`MAX_YAML_BYTES`;
aliases (a few hundred bytes of nested ``*name`` expand into gigabytes) and nesting deeper than :data:`MAX_YAML_DEPTH`
(seen in the parse events); in the composed nodes, a key given twice in one mapping (YAML would keep the last), an
integer of over :data:`MAX_YAML_INT_DIGITS` digits and a value that is no JSON value (an unquoted date, bytes, a set).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ._validation import shorten

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_INT_DIGITS", "load_yaml"]

MAX_YAML_BYTES = 1 << 20  #: largest configuration file read (bytes)
MAX_YAML_DEPTH = 32  #: deepest nesting of mappings / sequences in a configuration file
MAX_YAML_INT_DIGITS = 100  #: most digits of an integer in a configuration file (2**64 has 20)
_TAG = "tag:yaml.org,2002:"
_DIGITS = frozenset("0123456789abcdefABCDEF")  #: the digits of a YAML int (decimal, 0x, 0o, 0b, sexagesimal)
#: YAML types that are no JSON value (refused: every reader, e.g. the run fingerprint, must write the values back)
_NOT_JSON = {"timestamp": "a date or time (quote it to keep it as text)", "binary": "binary data", "set": "a set",
             "omap": "an ordered map", "pairs": "a list of pairs"}  # fmt: skip


def _check(node: yaml.Node, what: str, loader: yaml.SafeLoader, path: Path) -> None:
    """Refuse the values of the module docstring in ``node`` and below (``what``: how an integer ``node`` is named)."""
    kind, line = node.tag.removeprefix(_TAG), f"line {node.start_mark.line + 1}"
    if kind in _NOT_JSON:
        value = shorten(repr(node.value), 80) if isinstance(node.value, str) else kind
        raise ValueError(f"{path}: {line}: {value} is {_NOT_JSON[kind]}; a configuration value is a string, a "
                         "number, a bool, null, a list or a mapping")  # fmt: skip
    # hexadecimal digits count too: 0xfff... of 5000 digits is an int of 6000 decimal digits
    digits = sum(c in _DIGITS for c in node.value) if kind == "int" and isinstance(node, yaml.ScalarNode) else 0
    if digits > MAX_YAML_INT_DIGITS:
        raise ValueError(f"{path}: {what} ({line}): an integer of {digits} digits; a configuration value has at "
                         f"most {MAX_YAML_INT_DIGITS}")  # fmt: skip
    for item in node.value if isinstance(node, yaml.SequenceNode) else ():
        _check(item, "a value", loader, path)
    first: dict[Any, int] = {}
    for key_node, value_node in node.value if isinstance(node, yaml.MappingNode) else ():
        _check(key_node, "a value", loader, path)
        name = "a value"
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != f"{_TAG}merge":  # else: YAML's own rules
            key, at = loader.construct_object(key_node), key_node.start_mark.line + 1
            name = f"key {shorten(repr(key), 80)}"
            if key in first:
                raise ValueError(f"{path}: {name} is given twice in one mapping (line {first[key]} and line {at}); "
                                 "remove one (YAML would silently keep the last)")  # fmt: skip
            first[key] = at
        _check(value_node, name, loader, path)


def _at(mark: yaml.Mark) -> str:
    """``line:column`` of a PyYAML mark, 1-based (PyYAML counts from 0)."""
    return f"{mark.line + 1}:{mark.column + 1}"


def _syntax_error(path: Path, text: str, error: yaml.YAMLError) -> str:
    """One line for PyYAML's multi-line ``error``: ``<file>:<line>:<column>: invalid YAML: <problem> (<context> at
    <line>:<column>)``, 1-based as editors count; PyYAML's own excerpt of the file (``in "<unicode string>"``) left
    out."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem:
        mark = error.problem_mark or error.context_mark
        where = f"{path}:{_at(mark)}" if mark is not None else str(path)
        context = f" ({error.context}{f' at {_at(error.context_mark)}' if error.context_mark else ''})"
        message = f"{where}: invalid YAML: {error.problem}{context if error.context else ''}"
    elif isinstance(error, yaml.reader.ReaderError):  # a character YAML does not allow: its position in the text
        line, column = text.count("\n", 0, error.position) + 1, error.position - text.rfind("\n", 0, error.position)
        message = f"{path}:{line}:{column}: invalid YAML: character #x{error.character:04x}: {error.reason}"
    else:
        message = f"{path}: invalid YAML: {error}"
    return shorten(" ".join(message.split()), 500)


def load_yaml(path: str | Path) -> Any:
    """The plain data of the YAML file ``path`` (``yaml.safe_load`` semantics), with bounded cost; ``ValueError``
    naming the file for a refusal of the module docstring and a file that is not UTF-8 or not valid YAML (one line:
    the file, line:column and the problem)."""
    p = Path(path)
    if (size := p.stat().st_size) > MAX_YAML_BYTES:
        raise ValueError(f"{p}: {size} bytes; a configuration file may hold at most {MAX_YAML_BYTES} bytes")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e})") from e
    depth = 0
    try:
        loader = yaml.SafeLoader(text)  # refuses a character YAML does not allow (ReaderError)
        for event in yaml.parse(text, Loader=yaml.SafeLoader):  # linear in the file size: aliases never expand here
            if isinstance(event, yaml.AliasEvent):
                raise ValueError(f"{p}: line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not "
                                 "allowed in a configuration file")  # fmt: skip
            if isinstance(event, yaml.NodeEvent) and depth >= MAX_YAML_DEPTH:
                raise ValueError(f"{p}: line {event.start_mark.line + 1}: nesting deeper than {MAX_YAML_DEPTH} levels")
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
        if (node := loader.get_single_node()) is None:
            return None
        _check(node, "a value", loader, p)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ValueError(_syntax_error(p, text, e)) from e
