"""YAML for files the user did not write (hub_configs, ``--config`` overrides): bounded cost before any value is
built.

A YAML alias (``*name``) re-uses an anchored node, so a few hundred bytes of nested aliases expand into gigabytes
(the "billion laughs" pattern); a deeply nested document exhausts the recursion of the composer. Configuration files
need neither: :func:`load_yaml` refuses aliases and nesting deeper than ``max_depth`` while composing, and files
larger than ``max_bytes`` before reading them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "load_yaml", "shorten"]

#: largest configuration file read (bytes)
MAX_YAML_BYTES = 1 << 20
#: deepest nesting of mappings / sequences in a configuration file
MAX_YAML_DEPTH = 32


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


def load_yaml(path: str | Path, *, max_bytes: int = MAX_YAML_BYTES, max_depth: int = MAX_YAML_DEPTH) -> Any:
    """The plain data of the YAML file ``path`` (``yaml.safe_load`` semantics), with bounded cost.

    Raises:
        ValueError: the file is larger than ``max_bytes``, is not UTF-8 or not valid YAML, uses an alias, or nests
            deeper than ``max_depth`` (the message names the file and, where YAML knows it, the line).
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
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML: {shorten(str(e), 500)}") from e
    finally:
        loader.dispose()


def shorten(text: str, limit: int = 300) -> str:
    """``text`` cut to at most ``limit`` characters, with the number of characters left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"
