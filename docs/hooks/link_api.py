"""MkDocs hook: the guide pages link the API objects they name.

In every page outside ``api/``, inline code naming a public object of the package — ``pml_suprank.sub.Name``,
``sub.Name`` or a bare ``Name`` that one public subpackage alone exports (its ``__all__``), optionally followed by
``(...)`` — becomes an optional autorefs link to the object's entry in the API reference: a link where the object is
rendered, plain code where it is not, never a build warning. Fenced code blocks and code already inside a link are
left alone. Loaded by ``mkdocs.yml`` (``hooks: [docs/hooks/link_api.py]``).
"""

from __future__ import annotations

import html
import importlib
import re
from functools import cache
from typing import Any

PACKAGE = "pml_suprank"
CODE = re.compile(r"(?<![\[`])`(?P<name>[A-Za-z_][\w.]*)(?P<call>\([^`]*\))?`(?![\]`(])")
FENCE = re.compile(r"^(\s*)(```|~~~)")


@cache
def targets() -> dict[str, str]:
    """``{name as written: identifier}`` of the package's public objects."""
    pkg = importlib.import_module(PACKAGE)
    full: dict[str, str] = {}
    bare: dict[str, set[str]] = {}
    for sub in getattr(pkg, "__all__", []):
        if sub.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{PACKAGE}.{sub}")
        except Exception:  # an optional dependency missing: that page links nothing
            continue
        for name in getattr(module, "__all__", []):
            ident = f"{PACKAGE}.{sub}.{name}"
            full[ident] = ident
            full[f"{sub}.{name}"] = ident
            bare.setdefault(name, set()).add(ident)
    for name, idents in bare.items():
        if len(idents) == 1 and name[:1].isupper():  # classes only: a bare function name is too often a word
            full.setdefault(name, next(iter(idents)))
    return full


def link(markdown: str) -> str:
    """``markdown`` with the public object names in inline code linked (outside fenced blocks)."""
    known = targets()
    out, fence = [], None
    for line in markdown.split("\n"):
        match = FENCE.match(line)
        if match:
            fence = None if fence == match.group(2) else (fence or match.group(2))
            out.append(line)
            continue
        if fence or line.lstrip().startswith("#"):  # code, or a heading (its anchor text stays plain)
            out.append(line)
            continue

        def one(m: re.Match) -> str:
            name = m["name"]
            ident = known.get(name)
            if ident is None:
                return m.group(0)
            shown = html.escape(name + (m["call"] or ""))
            return f'<autoref identifier="{ident}" optional><code>{shown}</code></autoref>'

        out.append(CODE.sub(one, line))
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri.startswith("api/") or page.file.src_uri == "changelog.md":
        return markdown
    return link(markdown)
