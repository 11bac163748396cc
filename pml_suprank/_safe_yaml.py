"""YAML for files the user did not write (hub_configs, ``--config`` files): bounded cost before any value is built.

:func:`load_yaml` refuses, naming the file and (where YAML knows it) the key and the line: a file over
:data:`MAX_YAML_BYTES` (before reading it), aliases (``*name``: a few hundred bytes of nested aliases expand into
gigabytes) and nesting deeper than :data:`MAX_YAML_DEPTH` (while composing), a key given twice in one mapping (YAML
would silently keep the last), an integer of more than :data:`MAX_YAML_INT_DIGITS` digits and a value that is no JSON
value (a date — ``2026-12-01`` unquoted —, bytes, a set).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ._validation import shorten

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_INT_DIGITS", "load_yaml"]

#: largest configuration file read (bytes)
MAX_YAML_BYTES = 1 << 20
#: deepest nesting of mappings / sequences in a configuration file
MAX_YAML_DEPTH = 32
#: most digits of an integer in a configuration file (2**64 has 20)
MAX_YAML_INT_DIGITS = 100
_TAG = "tag:yaml.org,2002:"
#: YAML types that are no JSON value, refused so that every reader (the run fingerprint, ``config.json``) can write
#: a file's values back
_NOT_JSON = {"timestamp": "a date or time (quote it to keep it as text)", "binary": "binary data", "set": "a set",
             "omap": "an ordered map", "pairs": "a list of pairs"}  # fmt: skip


class _Refused(yaml.YAMLError):
    """A value a configuration file may not hold (its message names the key and the line)."""


def _line(node: Any) -> str:
    return f"line {node.start_mark.line + 1}"


def _check_int(node: Any, what: str) -> None:
    if isinstance(node, yaml.ScalarNode) and node.tag == f"{_TAG}int":
        digits = sum(c.isdigit() for c in node.value)
        if digits > MAX_YAML_INT_DIGITS:
            raise _Refused(f"{what} ({_line(node)}): an integer of {digits} digits; a configuration value has at "
                           f"most {MAX_YAML_INT_DIGITS}")  # fmt: skip


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the refusals of :func:`load_yaml`."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{event.anchor}) are not allowed in a configuration file", event.start_mark
            )
        if self.depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nesting deeper than {MAX_YAML_DEPTH} levels",
                                              event.start_mark)  # fmt: skip
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        first: dict[Any, Any] = {}
        for key_node, value_node in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == f"{_TAG}merge" or not isinstance(key_node, yaml.ScalarNode):
                continue  # merges (only inline ones: aliases are refused) and complex keys: SafeLoader's rules
            key = self.construct_object(key_node)
            if key in first:
                raise _Refused(f"key {shorten(repr(key), 80)} is given twice in one mapping ({_line(first[key])} and "
                               f"{_line(key_node)}); remove one (YAML would silently keep the last)")  # fmt: skip
            first[key] = key_node
            _check_int(value_node, f"key {shorten(repr(key), 80)}")
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        _check_int(node, "a value")
        return super().construct_yaml_int(node)


def _refuse(loader: Any, node: Any) -> Any:
    kind = node.tag.removeprefix(_TAG)
    value = shorten(repr(node.value), 80) if isinstance(node.value, str) else kind
    raise _Refused(f"{_line(node)}: {value} is {_NOT_JSON[kind]}; a configuration value is a string, a number, a "
                   "bool, null, a list or a mapping")  # fmt: skip


_BoundedLoader.add_constructor(f"{_TAG}int", _BoundedLoader.construct_yaml_int)
for _kind in _NOT_JSON:
    _BoundedLoader.add_constructor(f"{_TAG}{_kind}", _refuse)


def load_yaml(path: str | Path) -> Any:
    """The plain data of the YAML file ``path`` (``yaml.safe_load`` semantics), with bounded cost.

    Raises:
        ValueError: a refusal of the module docstring, a file that is not UTF-8 or not valid YAML (naming the file).
    """
    p = Path(path)
    size = p.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ValueError(f"{p}: {size} bytes; a configuration file may hold at most {MAX_YAML_BYTES} bytes")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e})") from e
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as e:
        raise ValueError(f"{p}: {e}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML: {shorten(str(e), 500)}") from e
    finally:
        loader.dispose()
