"""Every command of the ```bash blocks of README.md and docs/*.md: its flags parse with the recipe's own parser, and it
runs as written (offline, in a temporary folder, at small sizes through the recipes' documented flags appended to it),
unless it is on :data:`NOT_RUN`, the allow-list of commands that cannot run here, each with its reason.

A page's blocks run in order, python and bash alike, in one folder, as a reader runs them top to bottom (a command may
read what an earlier one wrote). A training command already run in this session with the same recipe and arguments is
not run again: a page that repeats it names the same run in another form (``accelerate launch``, ``python``, a console
script), and another page gets a copy of its output folder.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))

#: commands that are not run, by pattern (``re.search`` on the command as written), with the reason; their recipe
#: flags are still parsed. Every entry must match a command of the docs (no stale entry).
NOT_RUN: tuple[tuple[str, str], ...] = (
    (r"^pip install", "installs from PyPI (network)"),
    (r"^python -m venv", "creates a virtual environment and installs from PyPI (network)"),
    (r"^\. \.venv/bin/activate", "activates the virtual environment of the line (the test runs in this one)"),
    (r"^python -m pytest", "the test suite itself"),
    (r"^mkdocs build", "the docs build: tests/test_docs.py::test_mkdocs_build_strict"),
    (r"^tensorboard ", "starts a server that does not exit"),
    (r"^python benchmarks/", "a benchmark: long runs on real-sized data (its own tests run it small)"),
    (r"--multi_gpu", "needs several GPUs"),
    (r"--data_root (DIR|/data/)", "needs a paper benchmark's archive (a dataset download)"),
    (r"^python recipes/prepare_dataset\.py", "needs a paper benchmark's archive (a dataset download)"),
    (r"--push_to_hub true", "uploads to the Hugging Face Hub (network, an account)"),
    (r"^pml-suprank-push ", "uploads to the Hugging Face Hub (network, an account; tests/test_push_preflight.py)"),
    (r"^pml-suprank-demo ", "serves a web page until stopped (tests/test_demo.py runs it, in a browser too)"),
    (r"--report_to wandb", "logs to Weights & Biases (network, an account, pip install wandb)"),
    (r"path/to/", "a placeholder for the reader's folder (the tutorial runs the same commands on a generated one)"),
    (r"--model DIR\b", "a placeholder for the reader's model folder"),
    (r"<hub id or folder>", "a placeholder for the reader's data"),
)

#: commands of pages owned elsewhere that fail as written, with the reason: they must keep failing (a strict xfail:
#: remove the entry once the page is fixed)
KNOWN_BROKEN: dict[tuple[str, str], str] = {}

RECIPES = (
    "train", "train_happier", "train_roadmap", "evaluate", "search", "fit_heat", "ood_benchmark", "prepare_dataset",
    "ood_score", "push", "demo",
)  # fmt: skip
TRAINING = ("train", "train_happier", "train_roadmap")
_FIT_HEAT_DATA = ["--num_per_class", "3", "--num_test_per_class", "2", "--num_noise", "12", "--train_epochs", "1",
                  "--max_samples", "64"]  # fmt: skip
#: appended to a command that runs (the last value of a flag wins): the recipes' documented size flags
SMALL_FLAGS: dict[str, list[str]] = {
    "train": ["--max_train_steps", "3", "--skip_initial_eval", "true", "--report_to", "none"],
    "train_happier": ["--max_train_steps", "3", "--skip_initial_eval", "true", "--report_to", "none"],
    "train_roadmap": ["--max_train_steps", "3", "--skip_initial_eval", "true", "--report_to", "none"],
    "evaluate": [],
    "search": [],
    "fit_heat": [*_FIT_HEAT_DATA, "--heat_epochs", "1", "--knn_k", "3", "--threads", "1", "--progress", "false"],
    "ood_benchmark": ["--heat_epochs", "1", "--threads", "1", "--progress", "false"],
    "ood_score": [],
    "push": [],
    "demo": [],
}
#: appended when ood_benchmark extracts its own features (no --features)
OOD_EXTRACT_FLAGS = _FIT_HEAT_DATA


@dataclass
class Command:
    """One command of a bash block."""

    page: str
    text: str  # as written (continuations joined, comment removed)
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)  # without the leading VAR=value assignments
    recipe: str | None = None  # pml_suprank.recipes.<recipe>, when the command runs one
    args: list[str] = field(default_factory=list)  # the recipe's own arguments

    @property
    def not_run_reason(self) -> str | None:
        return next((why for pattern, why in NOT_RUN if re.search(pattern, self.text)), None)


def _recipe_call(argv: list[str]) -> tuple[str | None, list[str]]:
    """``(recipe, args)`` of ``python recipes/X.py``, ``python -m pml_suprank.recipes.X``, ``pml-suprank-X`` or
    ``accelerate launch [launcher flags] <either form>``; ``(None, [])`` for any other command."""
    if argv[:2] == ["accelerate", "launch"]:
        rest = argv[2:]
        start = next((i for i, t in enumerate(rest) if t == "-m" or t.endswith(".py")), None)
        return _recipe_call(["python", *rest[start:]]) if start is not None else (None, [])
    if argv[0].startswith("pml-suprank-"):
        return argv[0][len("pml-suprank-") :].replace("-", "_"), argv[1:]
    if argv[0] == "python" and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2 and argv[2].startswith("pml_suprank.recipes."):
            return argv[2].rsplit(".", 1)[1], argv[3:]
        if argv[1].startswith("recipes/") and argv[1].endswith(".py"):
            return Path(argv[1]).stem, argv[2:]
    return None, []


def bash_commands(page: str) -> list[Command]:
    """The commands of the page's ```bash blocks, in order (continuation lines joined, ``&&`` chains split)."""
    return [c for kind, item in page_steps(page) if kind == "bash" for c in item]


def page_steps(page: str) -> list[tuple[str, object]]:
    """The page's fenced blocks in order: ``("python", source)`` or ``("bash", [Command, ...])``."""
    steps: list[tuple[str, object]] = []
    for lang, body in re.findall(r"```(python|bash)\n(.*?)```", (ROOT / page).read_text(), flags=re.S):
        if lang == "python":
            steps.append(("python", body))
            continue
        commands = []
        for line in body.replace("\\\n", " ").splitlines():
            for part in line.split(" && "):
                # a <placeholder> of the docs is one word (its spaces are not the shell's)
                tokens = shlex.split(re.sub(r"<[^<>]+>", lambda m: m.group(0).replace(" ", "_"), part), comments=True)
                if not tokens:
                    continue
                env = {}
                while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
                    key, value = tokens.pop(0).split("=", 1)
                    env[key] = value
                text = part.split(" #", 1)[0].strip()
                command = Command(page, text, env, tokens)
                command.recipe, command.args = _recipe_call(tokens)
                commands.append(command)
        steps.append(("bash", commands))
    return steps


def all_commands() -> list[Command]:
    return [c for page in PAGES for c in bash_commands(page)]


def _make_flags():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_flags", ROOT / "docs" / "hooks" / "make_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_recipe_flags(recipe: str, args: list[str]) -> argparse.Namespace:
    """Parse ``args`` with the parser the recipe builds (the one ``--help`` prints and docs/flags.md lists): flag
    names, types and choices, nothing run or read; argparse exits (status 2) on a bad flag."""
    parser = _make_flags().recipe_parser(recipe)
    if recipe != "ood_benchmark":
        try:
            return parser.parse_args(args)
        except SystemExit as e:
            if e.code not in (0, None):
                raise
            return argparse.Namespace()  # an action that ends the command (--list_losses): the flags were valid
    namespace, rest = parser.parse_known_args(args)  # the rest goes to fit_heat's extraction
    if rest:
        _make_flags().recipe_parser("fit_heat").parse_args(rest)
    return namespace


# ---------------------------------------------------------------------------------------------------------------------
# quick checks: the commands are found, classified and their flags parse
# ---------------------------------------------------------------------------------------------------------------------
def test_docs_have_bash_commands_and_every_recipe_is_run_somewhere():
    commands = all_commands()
    assert len(commands) >= 30
    assert {"README.md", "docs/tutorial.md", "docs/ood.md", "docs/search.md"} <= {c.page for c in commands}
    run = {c.recipe for c in commands if c.recipe and c.not_run_reason is None}
    assert set(RECIPES) - {"prepare_dataset", "push", "demo"} <= run, run  # network / a server: their own tests


def test_every_command_is_a_recipe_or_on_the_allow_list():
    for c in all_commands():
        assert c.recipe in (None, *RECIPES), f"{c.page}: unknown recipe in {c.text!r}"
        assert c.recipe is not None or c.not_run_reason, f"{c.page}: {c.text!r} is neither a recipe nor on NOT_RUN"


def test_the_allow_list_has_no_stale_entry():
    texts = [c.text for c in all_commands()]
    for page, text in KNOWN_BROKEN:
        assert any(c.page == page and c.text == text for c in all_commands()), f"stale KNOWN_BROKEN: {text!r}"
    for pattern, why in NOT_RUN:
        assert any(re.search(pattern, t) for t in texts), f"NOT_RUN entry {pattern!r} ({why}) matches no command"
        assert len(why) > 10


@pytest.mark.parametrize("page", [p for p in PAGES if any(c.recipe for c in bash_commands(p))])
@pytest.mark.slow
def test_recipe_flags_parse(page, monkeypatch, capsys):
    """Every recipe command's flags are valid for the recipe's parser, run or not (``--help``-free parse)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for c in bash_commands(page):
        if c.recipe is None:
            continue
        try:
            assert parse_recipe_flags(c.recipe, c.args) is not None
        except SystemExit:
            pytest.fail(f"{page}: the flags of {c.text!r} do not parse:\n{capsys.readouterr().err[-1500:]}")


def test_the_parser_check_catches_a_wrong_flag(capsys):
    with pytest.raises(SystemExit):
        parse_recipe_flags("search", ["--model", "m", "--gallery", "synthetic", "--output_dir", "o", "--top_k", "3"])
    assert "--top_k" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_recipe_flags("train_happier", ["--max_steps", "3"])


def test_commands_are_read_as_a_shell_reads_them():
    steps = [c for c in all_commands() if c.env]
    assert any(c.env.get("WANDB_PROJECT") == "my-project" and c.recipe == "train_happier" for c in steps)
    readme = bash_commands("README.md")
    assert any(c.argv[:3] == ["python", "-m", "venv"] for c in readme)  # a `&&` chain is split
    assert any(c.argv[:2] == ["pip", "install"] for c in readme)
    launch = [c for c in bash_commands("docs/recipes.md") if c.argv[:2] == ["accelerate", "launch"]]
    assert any(c.recipe == "train_happier" and c.args == [] and "--num_processes" in c.argv for c in launch)


# ---------------------------------------------------------------------------------------------------------------------
# the slow part: the pages' commands run
# ---------------------------------------------------------------------------------------------------------------------
#: pages whose commands use what another page's command wrote (a reader follows the guide in order): that command runs
#: first, in the page's folder (from this session's cache when it ran already)
REQUIRES: dict[str, str] = {"docs/search.md": "accelerate launch recipes/train_happier.py"}


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    """The training runs of this session, shared between pages: ``(recipe, *args)`` -> a copy of the output folder
    as the run left it, and the folder the copies go in."""
    return {"runs": {}, "cache": tmp_path_factory.mktemp("docs_trained_runs")}


def _output_dir(c: Command) -> str:
    """The command's ``--output_dir``, or the recipe's default one."""
    given = getattr(parse_recipe_flags(c.recipe, c.args), "output_dir", None)
    if given is not None:
        return str(given)
    make_flags = _make_flags()
    (action,) = [a for a in make_flags.recipe_parser(c.recipe)._actions if a.dest == "output_dir"]
    return str(make_flags.action_default(action))


def _run_command(c: Command, cwd: Path, trained: dict) -> None:
    broken = (c.page, c.text) in KNOWN_BROKEN
    key = (c.recipe, *c.args)
    out = cwd / _output_dir(c) if c.recipe in TRAINING else None
    if not broken and out is not None and key in trained["runs"]:
        if out.exists() and any(out.iterdir()):
            return  # the page names the same run again in another form (`accelerate launch`, `python`, a script)
        shutil.copytree(trained["runs"][key], out, symlinks=True)  # the run of another page: as it wrote it
        return
    small = list(SMALL_FLAGS[c.recipe])
    if c.recipe == "ood_benchmark" and "--features" not in c.args:
        small += OOD_EXTRACT_FLAGS
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **c.env}  # noqa: TID251
    argv = [sys.executable, "-m", f"pml_suprank.recipes.{c.recipe}", *c.args, *small]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if broken:
        assert proc.returncode != 0, f"{c.page}: {c.text!r} runs now: remove it from KNOWN_BROKEN"
        return
    assert proc.returncode == 0, f"{c.page}: {c.text}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    if out is not None and out.is_dir() and key not in trained["runs"]:  # (--list_losses writes nothing)
        trained["runs"][key] = trained["cache"] / f"run{len(trained['runs'])}"
        shutil.copytree(out, trained["runs"][key], symlinks=True)


def run_page(page: str, cwd: Path, trained: dict) -> list[Command]:
    """Run the page's blocks in order in ``cwd``; returns the commands that ran."""
    ran = []
    if page in REQUIRES:
        (first,) = [c for c in all_commands() if c.text == REQUIRES[page]][:1]
        _run_command(first, cwd, trained)
    namespace: dict = {"__name__": f"docs_{Path(page).stem}"}
    for kind, item in page_steps(page):
        if kind == "python":
            if item.lstrip().startswith("# not runnable offline:"):
                continue
            exec(compile(item, f"{page}#python", "exec"), namespace)
            continue
        for c in item:
            if c.recipe is not None and c.not_run_reason is None:
                _run_command(c, cwd, trained)
                ran.append(c)
    return ran


def _pages_with_runs() -> list[str]:
    return [p for p in PAGES if any(c.recipe and c.not_run_reason is None for c in bash_commands(p))]


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_runs())
def test_shell_blocks_run(page, tmp_path, monkeypatch, trained_runs):
    """The page's blocks run from a checkout's root, top to bottom; the tutorial's outputs are where it says."""
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    torch.manual_seed(0)
    ran = run_page(page, tmp_path, trained_runs)
    assert ran
    if page == "docs/tutorial.md":
        final = tmp_path / "runs" / "photos" / "final"
        for name in ("README.md", "model.safetensors", "training_curves.png", "precision_recall.png",
                     "embedding_map.png", "data_spec.json"):  # fmt: skip
            assert (final / name).is_file(), name
        assert (tmp_path / "runs" / "search" / "results.html").is_file()
        assert "<img" in (tmp_path / "runs" / "search" / "results.html").read_text()
