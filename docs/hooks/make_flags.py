"""Write ``docs/flags.md``, the flag reference of every recipe, from the parsers the recipes build.

Run from a checkout's root after changing a recipe's options::

    python docs/hooks/make_flags.py            # rewrites docs/flags.md
    python docs/hooks/make_flags.py --check    # exit 1 when docs/flags.md is stale

A recipe module either exposes ``build_parser()`` (``evaluate``, ``search``, ``fit_heat``, ``ood_benchmark``,
``prepare_dataset``) or, for the training recipes, the arguments of
:func:`pml_suprank.training.recipe.build_parser` (``DESCRIPTION``, ``DEFAULTS``, ``HIERARCHICAL``). The tables are
read from the parser's actions (``argparse.ArgumentParser._actions``), so they show exactly what ``--help`` shows.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "flags.md"
COMMAND = "python docs/hooks/make_flags.py"

#: (recipe module, console script), in page order
RECIPES: tuple[tuple[str, str], ...] = (
    ("train", "pml-suprank-train"),
    ("train_happier", "pml-suprank-train-happier"),
    ("train_roadmap", "pml-suprank-train-roadmap"),
    ("evaluate", "pml-suprank-evaluate"),
    ("search", "pml-suprank-search"),
    ("fit_heat", "pml-suprank-fit-heat"),
    ("ood_benchmark", "pml-suprank-ood-benchmark"),
    ("prepare_dataset", "pml-suprank-prepare-dataset"),
)

INTRO = """\
# Flag reference

Every flag of every recipe, with its default, generated from the recipes' own parsers (the same text as `--help`).
Each recipe runs as `python recipes/<name>.py`, `python -m pml_suprank.recipes.<name>`, `accelerate launch` of either,
or its console script. Boolean flags take `true`/`false` (a bare `--flag` means `true`); list flags take
space-separated values. The training recipes also read `--config` files (see
[Configuration and the loss registry](run_spec.md)); a flag given on the command line wins over a file.

This page is generated: after changing a recipe's options, run `python docs/hooks/make_flags.py`.
"""


def recipe_parser(name: str) -> argparse.ArgumentParser:
    """The parser recipe ``name`` builds (``pml_suprank.recipes.<name>``)."""
    module = importlib.import_module(f"pml_suprank.recipes.{name}")
    if hasattr(module, "build_parser"):
        return module.build_parser()
    from pml_suprank.training import recipe

    return recipe.build_parser(module.DESCRIPTION, module.DEFAULTS, module.HIERARCHICAL)


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _text(text: Any) -> str:
    """A table cell of prose: ``<placeholders>`` shown, not read as HTML tags."""
    return _cell(text).replace("<", "&lt;").replace(">", "&gt;")


_HELP_DEFAULT = re.compile(r"\s*\(default: (?P<value>.*)\)\s*$", flags=re.S)


def action_default(action: argparse.Action) -> Any:
    """The default of a flag as ``--help`` shows it: the action's default, or, when the parser keeps it out of the
    namespace (``argparse.SUPPRESS``, so that a given flag can be told from a default), the text of the help's
    trailing ``(default: ...)``."""
    if action.default is argparse.SUPPRESS:
        match = _HELP_DEFAULT.search(action.help or "")
        return match.group("value") if match else None
    return action.default


def _default(action: argparse.Action) -> str:
    value = action_default(action)
    if action.required or value is None or value == "None":
        return "required" if action.required else "—"
    if isinstance(value, (list, tuple)):
        value = " ".join(str(v) for v in value)
    elif isinstance(value, bool) or value in ("True", "False"):
        value = str(value).lower()
    return f"`{_cell(value)}`" if str(value) != "" else "`''`"


def _what(action: argparse.Action) -> str:
    text = "" if action.help in (None, argparse.SUPPRESS) else action.help
    if action.default is argparse.SUPPRESS:
        text = _HELP_DEFAULT.sub("", text)  # shown in the default column
    text = text.replace("%(default)s", str(action.default)).replace("%%", "%")
    if action.choices is not None:
        text = f"{text} (one of: {', '.join(str(c) for c in action.choices)})".strip()
    return _text(text)


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.dest}` (positional)"
    return ", ".join(f"`{s}`" for s in action.option_strings)


def recipe_table(name: str, script: str) -> str:
    """The section of recipe ``name``: its description and one row per flag, grouped as ``--help`` groups them."""
    parser = recipe_parser(name)
    lines = [f"## {name}", "", f"`python recipes/{name}.py` · `{script}` — {_text(parser.description or '')}", ""]
    if name == "ood_benchmark":
        lines += [
            "Without `--features` it also takes every flag of [fit_heat](#fit_heat) (it runs its extraction).",
            "",
        ]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            lines += [f"**{_text(group.title)}**", ""]
        lines += ["| flag | default | what |", "|---|---|---|"]
        lines += [f"| {_flag(a)} | {_default(a)} | {_what(a)} |" for a in actions]
        lines.append("")
    return "\n".join(lines)


def render() -> str:
    """The whole page."""
    return "\n".join([INTRO, *(recipe_table(name, script) for name, script in RECIPES)]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/flags.md from the recipes' parsers.")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/flags.md differs, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not PAGE.exists() or PAGE.read_text() != text
        if stale:
            print(f"docs/flags.md is stale: run `{COMMAND}`")  # noqa: T201
        return int(stale)
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
