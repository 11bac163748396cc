"""Names from a user's files made safe for a terminal.

A file or class name is data: a name holding a terminal escape sequence (``ESC ] 0; title BEL`` sets the window
title, ``ESC [ 2J`` clears the screen) must not act on the terminal that prints it. :func:`terminal_safe` removes
every escape sequence and replaces the remaining control characters (C0, DEL, C1, and the bidirectional overrides
that reorder what a reader sees) by ``?``. Names written into HTML go through :func:`html.escape` instead.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NoReturn

__all__ = ["refuse", "terminal_safe"]

# CSI (ESC [ ... final byte), OSC / DCS / SOS / PM / APC strings (ESC ] ... BEL or ESC \), and two-byte escapes
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x9d\x90\x98\x9e\x9f].*?(?:\x07|\x9c|\x1b\\|$)"
    r"|\x1b[@-Z\\-_]?",
    re.DOTALL,
)
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: object) -> str:
    """``str(text)`` without escape sequences, its other control characters replaced by ``?``.

    >>> terminal_safe("a\\x1b]0;owned\\x07b.png")
    'ab.png'
    """
    return _CONTROLS.sub("?", _ESCAPES.sub("", str(text)))


def refuse(message: object) -> NoReturn:
    """End a command as argparse does on a bad option: ``<prog>: error: <message>`` on one line of stderr (terminal-
    safe), exit status 2."""
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"{Path(sys.argv[0]).name}: error: {terminal_safe(line)}", file=sys.stderr)  # noqa: T201 - the report
    sys.exit(2)
