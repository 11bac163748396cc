"""JSON for files the package reads (checkpoints, ``run.json``, lock records, ``index.json``, ``config.json``, data
annotations): one reader with bounded cost and one kind of error.

``json.loads`` recurses once per nesting level (``"[" * 100000`` raises ``RecursionError``), converts integers of any
length (a 5000-digit number raises a ``ValueError`` that names no file) and reads files of any size. :func:`load_json`
and :func:`loads_json` refuse, with a ``ValueError`` naming the file: a file larger than ``max_bytes`` (before
reading it), text that is not UTF-8 or not JSON, nesting deeper than ``max_depth``, an integer of more than
``max_int_digits`` digits and, when ``expected`` is given, a top-level value of another type.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "atomic_write",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "json_depth",
    "load_json",
    "loads_json",
]

#: largest JSON text read (bytes / characters); a caller reading a large annotation file passes its own bound
MAX_JSON_BYTES = 64 * 2**20
#: deepest nesting of arrays / objects (``json`` recurses once per level)
MAX_JSON_DEPTH = 100
#: most digits of one integer (int64 has 19; Python's own limit, 4300, raises an error naming no file)
MAX_JSON_INT_DIGITS = 100

_TYPE_NAMES = {dict: "a JSON object", list: "a JSON array", str: "a JSON string", int: "an integer",
               float: "a number", bool: "true or false"}  # fmt: skip


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON ``text`` (brackets inside strings do not count): array operations
    over the text, no recursion, linear time (a regular expression for strings backtracks quadratically on
    ``"\\"\\"\\"…``, which never closes). A ``"`` opens or closes a string unless an odd number of backslashes
    precede it (exact wherever ``json`` parses: a backslash is valid only inside a string)."""
    code = np.frombuffer(text.encode(), dtype=np.uint8)
    index = np.arange(code.size, dtype=np.int32 if code.size < 2**31 else np.int64)
    backslash = code == ord("\\")
    run = index - np.maximum.accumulate(np.where(backslash, -1, index))  # backslashes ending at each position
    escaped = np.concatenate(([False], run[:-1] % 2 == 1))  # after an odd run of backslashes
    outside = np.cumsum((code == ord('"')) & ~escaped) % 2 == 0  # after an even number of string quotes
    opens = ((code == ord("[")) | (code == ord("{"))) & outside
    closes = ((code == ord("]")) | (code == ord("}"))) & outside
    return int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))


def loads_json(
    text: str | bytes,
    source: Any,
    max_depth: int = MAX_JSON_DEPTH,
    what: str = "file",
    *,
    expected: type | tuple[type, ...] | None = None,
    max_bytes: int = MAX_JSON_BYTES,
    max_int_digits: int = MAX_JSON_INT_DIGITS,
) -> Any:
    """The value of the JSON ``text`` (``bytes``: UTF-8) read from ``source`` (a path or a name, named by every error)
    with bounded cost: at most ``max_bytes`` characters, ``max_depth`` levels of nesting and ``max_int_digits``
    digits per integer, a top-level value of the type(s) ``expected`` (``None``: any). ``what`` names the text in
    messages (``"config.json"``, ``"checkpoint state"``).

    Raises:
        ValueError: naming ``source``: too large, not UTF-8, not valid JSON, nested deeper than ``max_depth``, an
            integer too long, or a top-level value other than ``expected``.
    """
    if len(text) > max_bytes:
        raise ValueError(f"{source} is {len(text)} characters long; a JSON {what} read here may have {max_bytes}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{source} is not valid JSON (corrupt {what}): not UTF-8 text ({e})") from None

    def parse_int(digits: str) -> int:
        if len(digits.lstrip("-")) > max_int_digits:
            raise ValueError(f"an integer of {len(digits.lstrip('-'))} digits; at most {max_int_digits} are allowed")
        return int(digits)

    depth = json_depth(text)  # before parsing: json.loads recurses once per level
    if depth > max_depth:
        raise ValueError(f"{source} nests JSON {depth} levels deep; at most {max_depth} are allowed (corrupt {what}?)")
    try:
        value = json.loads(text, parse_int=parse_int)
    except ValueError as e:  # json.JSONDecodeError, or parse_int's refusal
        raise ValueError(f"{source} is not valid JSON (corrupt {what}): {str(e)[:200]}") from None
    kinds = expected if isinstance(expected, tuple) or expected is None else (expected,)
    if kinds is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
        want = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        got = "null" if value is None else _TYPE_NAMES.get(type(value), type(value).__name__)
        raise ValueError(f"{source} must hold {want} (corrupt {what}?); got {got}")
    return value


def load_json(path: str | Path, *, what: str | None = None, max_bytes: int = MAX_JSON_BYTES, **bounds: Any) -> Any:
    """The value of the JSON file ``path`` through :func:`loads_json` (``bounds``: its ``expected``, ``max_depth``,
    ``max_int_digits``), the size checked before the file is read. ``OSError`` when the file cannot be opened
    (``FileNotFoundError`` when it does not exist); ``ValueError`` naming the file as :func:`loads_json`."""
    p = Path(path)
    what = what or p.name
    size = p.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{p} is {size} bytes long; a JSON {what} read here may have {max_bytes}")
    return loads_json(p.read_bytes(), p, what=what, max_bytes=max_bytes, **bounds)


def atomic_write(path: str | Path, write: Callable[[str], Any]) -> None:
    """Write ``path`` all at once: ``write(tmp)`` fills ``.<name>.<random>.tmp`` beside it, which is then renamed into
    place (``os.replace``); on any error the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
