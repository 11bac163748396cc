"""A Griffe extension for the API reference: Sphinx cross-reference roles in docstrings become links.

The docstrings cite other objects the Sphinx way (``:class:`~pml_suprank.losses.SupAPLoss```, ``:func:`x```). MkDocs
renders them with mkdocstrings, which knows no roles; this extension rewrites every role once the package is loaded:

* a target inside the package (``pml_suprank.…``, or a name relative to the object's module or class) becomes an
  optional autorefs link (``<autoref identifier=… optional>``): a link where that object is rendered, plain code
  where it is not (an internal helper), never a broken link or a build warning;
* any other target (``torch.Tensor``, PML's classes) becomes inline code.

``~`` keeps the last component only, as in Sphinx. Two more reST habits are turned into markdown code blocks (so
they render as code, with the theme's copy button, instead of nested blockquotes or a literal ``::``):

* doctest examples (``>>>`` lines with their continuation and output lines) become fenced ``pycon`` blocks;
* a paragraph ending in ``::`` followed by an indented block ends in ``:`` and the block becomes a fenced block.

Loaded by ``mkdocs.yml`` (``extensions: [docs/hooks/griffe_roles.py:RoleLinks]``).
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|paramref):`(?P<tilde>~?)(?P<target>[^`]+?)`"
)
PACKAGE = "pml_suprank"


def _lookup(pkg: griffe.Module, path: str) -> Any | None:
    """The object at the dotted ``path`` (``pml_suprank.x.y``) in ``pkg``, or None."""
    if path != PACKAGE and not path.startswith(PACKAGE + "."):
        return None
    obj: Any = pkg
    for part in path.split(".")[1:]:
        try:
            obj = obj.all_members[part] if obj.is_class else obj.members[part]  # methods may be inherited
        except (KeyError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None  # not in the package, or an alias of an object outside it (an import of torch)
    return obj


def _resolve(pkg: griffe.Module, obj: Any, target: str) -> str | None:
    """The full path of ``target`` as written in ``obj``'s docstring: absolute, or relative to ``obj``, its class
    or its module."""
    if _lookup(pkg, target) is not None:
        return target
    scope = obj
    while scope is not None:
        candidate = f"{scope.path}.{target}"
        if _lookup(pkg, candidate) is not None:
            return candidate
        scope = scope.parent
    return None


def rewrite(text: str, pkg: griffe.Module, obj: Any) -> str:
    """``text`` with every role replaced by an optional autoref (package targets) or inline code (others)."""

    def one(match: re.Match) -> str:
        target = match["target"].strip().rstrip("()")
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
        path = _resolve(pkg, obj, target)
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{html.escape(path)}" optional><code>{html.escape(shown)}</code></autoref>'

    return ROLE.sub(one, text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def fence_code(text: str) -> str:
    """``text`` with doctest runs and reST literal blocks (``::`` + indented block) as fenced code blocks, at the
    indentation they had (so they stay inside their docstring section); existing fences are left alone."""
    lines = text.split("\n")
    out: list[str] = []
    i, in_fence = 0, False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            out.append(line)
            i += 1
            continue
        if stripped.startswith(">>>"):
            indent = _indent(line)
            j = i
            while j < len(lines) and lines[j].strip() and _indent(lines[j]) >= indent:
                j += 1
            pad = " " * indent
            out += [pad + "```pycon", *(row[indent:] and pad + row[indent:] for row in lines[i:j]), pad + "```"]
            i = j
            continue
        if stripped.endswith("::") and not stripped.startswith(("..", ":")):
            indent = _indent(line)
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            k = j
            while k < len(lines) and (not lines[k].strip() or _indent(lines[k]) > indent):
                k += 1
            while k > j and not lines[k - 1].strip():
                k -= 1
            if k > j:  # an indented block follows: a literal block
                head = line.rstrip()[:-1]
                out.append(head if head.strip() else "")
                inner = min(_indent(row) for row in lines[j:k] if row.strip())
                pad = " " * indent
                out += ["", pad + "```text", *(pad + row[inner:] if row.strip() else "" for row in lines[j:k]),
                        pad + "```"]  # fmt: skip
                i = k
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class RoleLinks(griffe.Extension):
    """Rewrite the roles of every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, pkg, set())

    def _walk(self, pkg: griffe.Module, obj: Any, seen: set[str]) -> None:
        if obj.path in seen or obj.is_alias:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = fence_code(rewrite(obj.docstring.value, pkg, obj))
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(pkg, member, seen)
