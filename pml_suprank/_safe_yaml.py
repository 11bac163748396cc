"""YAML for files the user did not write (hub_configs, ``--config`` overrides): bounded cost before any value is
built.

A YAML alias (``*name``) re-uses an anchored node, so a few hundred bytes of nested aliases expand into gigabytes
(the "billion laughs" pattern); a deeply nested document exhausts the recursion of the composer. Configuration files
need neither: :func:`load_yaml` refuses aliases and nesting deeper than ``max_depth`` while composing, and files
larger than ``max_bytes`` before reading them. While the values are built it also refuses a key given twice in one
mapping (YAML's "last one wins" would silently drop the first value) and an integer of more than
:data:`MAX_YAML_INT_DIGITS` digits (Python refuses to parse 4,300 or more with an error naming neither the file nor
the key), and a value that is no JSON value (a date, bytes, a set: ``2026-12-01`` unquoted is a date in YAML),
each with the file, the key and the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ._validation import shorten

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_INT_DIGITS", "load_yaml", "shorten"]

#: largest configuration file read (bytes)
MAX_YAML_BYTES = 1 << 20
#: deepest nesting of mappings / sequences in a configuration file
MAX_YAML_DEPTH = 32
#: most digits of an integer in a configuration file (2**64 has 20)
MAX_YAML_INT_DIGITS = 100
_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(yaml.YAMLError):
    """A value a configuration file may not hold (its message names the key and the line)."""


def _line(node: Any) -> str:
    return f"line {node.start_mark.line + 1}"


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases and nesting deeper than ``max_depth`` while composing nodes."""

    def __init__(self, stream: str, max_depth: int) -> None:
        super().__init__(stream)
        self.max_depth = max_depth
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{event.anchor}) are not allowed in a configuration file", event.start_mark
            )
        self.depth += 1
        try:
            if self.depth > self.max_depth:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {self.max_depth} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """``SafeLoader``'s mapping, after refusing a key given twice and an over-long integer value (by key)."""
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                    continue  # merges (only inline ones: aliases are refused) and complex keys: SafeLoader's rules
                key = self.construct_object(key_node)
                if key in first:
                    raise _Refused(
                        f"key {shorten(repr(key), 80)} is given twice in one mapping ({_line(first[key])} and "
                        f"{_line(key_node)}); remove one (YAML would silently keep the last)"
                    )
                first[key] = key_node
                _check_int(value_node, f"key {shorten(repr(key), 80)}")
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        _check_int(node, "a value")
        return super().construct_yaml_int(node)


def _check_int(node: Any, what: str) -> None:
    if isinstance(node, yaml.ScalarNode) and node.tag == _INT_TAG:
        digits = sum(c.isdigit() for c in node.value)
        if digits > MAX_YAML_INT_DIGITS:
            raise _Refused(
                f"{what} ({_line(node)}): an integer of {digits} digits; a configuration value has at most "
                f"{MAX_YAML_INT_DIGITS}"
            )


_BoundedLoader.add_constructor(_INT_TAG, _BoundedLoader.construct_yaml_int)

#: YAML types that are no JSON value (a date, bytes, a set, ordered pairs): refused with their line, so a file's
#: values are the plain data every reader (the run fingerprint, ``config.json``) can write back
_NOT_JSON = {"timestamp": "a date or time (quote it to keep it as text)", "binary": "binary data", "set": "a set",
             "omap": "an ordered map", "pairs": "a list of pairs"}  # fmt: skip


def _refuse(kind: str) -> Any:
    def construct(loader: Any, node: Any) -> Any:
        raise _Refused(f"{_line(node)}: {shorten(repr(node.value), 80) if isinstance(node.value, str) else kind} is "
                       f"{_NOT_JSON[kind]}; a configuration value is a string, a number, a bool, null, a list or a "
                       "mapping")  # fmt: skip

    return construct


for _kind in _NOT_JSON:
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_kind}", _refuse(_kind))


def load_yaml(path: str | Path, *, max_bytes: int = MAX_YAML_BYTES, max_depth: int = MAX_YAML_DEPTH) -> Any:
    """The plain data of the YAML file ``path`` (``yaml.safe_load`` semantics), with bounded cost.

    Raises:
        ValueError: the file is larger than ``max_bytes``, is not UTF-8 or not valid YAML, uses an alias, nests
            deeper than ``max_depth``, gives a key twice in one mapping or holds an integer of more than
            :data:`MAX_YAML_INT_DIGITS` digits (the message names the file and, where YAML knows it, the key and
            the line).
    """
    p = Path(path)
    size = p.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{p}: {size} bytes; a configuration file may hold at most {max_bytes} bytes")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e})") from e
    loader = _BoundedLoader(text, max_depth)
    try:
        return loader.get_single_data()
    except _Refused as e:
        raise ValueError(f"{p}: {e}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML: {shorten(str(e), 500)}") from e
    finally:
        loader.dispose()
