"""The README and the docs site: every ```python block runs as written (offline), except the ones marked as needing
the network; the README stays a short guide; the docs build with ``mkdocs build --strict`` where mkdocs is installed."""

import re
import sys
from pathlib import Path

import pytest
import torch

from pml_suprank.losses import registered_losses
from pml_suprank.losses.registry import unregister_loss

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
OFFLINE_MARK = "# not runnable offline:"
MAX_OFFLINE_BLOCKS = 3
README_MAX_BYTES = 12 * 1024


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def _all_blocks() -> list[tuple[str, int, str]]:
    return [(page.relative_to(ROOT).as_posix(), i, b) for page in _pages() for i, b in enumerate(_blocks(page))]


def _runnable() -> list[tuple[str, int, str]]:
    return [item for item in _all_blocks() if not item[2].lstrip().startswith(OFFLINE_MARK)]


#: pages whose python blocks prepare the data of their shell commands: they run with them, in page order, in
#: tests/test_docs_shell.py
SHELL_RUN_PAGES = ("docs/tutorial.md", "docs/reject-unknown.md")


def test_few_blocks_are_not_runnable_and_they_say_why():
    skipped = [b for _, _, b in _all_blocks() if b.lstrip().startswith(OFFLINE_MARK)]
    assert len(skipped) <= MAX_OFFLINE_BLOCKS
    for block in skipped:
        reason = block.lstrip()[len(OFFLINE_MARK) :].splitlines()[0].strip()
        assert len(reason) > 10, "a block that is not run must say why"
    assert len(_runnable()) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted({p for p, _, _ in _runnable()} - set(SHELL_RUN_PAGES)))
def test_python_blocks_run(page, tmp_path, monkeypatch, capsys):
    """A page's runnable blocks run in order in one namespace, as a reader would run them."""
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")  # blocks run from a checkout's root and write under outputs/
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    torch.manual_seed(0)
    namespace: dict = {"__name__": f"docs_{Path(page).stem}"}
    registered = set(registered_losses())
    try:
        for _, index, block in (item for item in _runnable() if item[0] == page):
            exec(compile(block, f"{page}#block{index}", "exec"), namespace)
            loss = namespace.get("loss")
            if isinstance(loss, torch.Tensor):
                assert torch.isfinite(loss).all()
    finally:
        for name in set(registered_losses()) - registered:  # a page may register an example loss
            unregister_loss(name)


@pytest.mark.slow
def test_quickstart_runs(capsys):
    text = README.read_text()
    section = text[text.index("<!-- section:quickstart -->") : text.index("<!-- /section:quickstart -->")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the quickstart section must contain a python block"
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md#quickstart", "exec"), namespace)
    assert torch.isfinite(namespace["loss"])
    assert "ROADMAP loss after one epoch" in capsys.readouterr().out


def test_readme_is_a_short_guide():
    text = README.read_text()
    assert len(text.encode()) <= README_MAX_BYTES
    for heading in ("## Install", "## Set up and run the main job", "## Run the tests"):
        assert heading in text
    assert 'python -m pytest -m "slow or not slow"' in text  # .ci/run calls the README's test command
    # user docs, not a development log
    for page in _pages():
        body = page.read_text()
        assert not re.search(r"\bissue \d+|\bthis round\b|\bbefore issue\b", body, flags=re.I), page.name


def test_readme_and_docs_links_resolve():
    for page in _pages():
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith("http"):
                continue
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_losses_page_lists_every_flat_loss():
    section = (DOCS / "losses.md").read_text()
    for name in (
        "SmoothAPLoss",
        "SupAPLoss",
        "CalibrationLoss",
        "ClusterLoss",
        "ROADMAPLoss",
        "SupRecallLoss",
        "RODRecallLoss",
    ):
        assert f"`{name}(" in section


# ---------------------------------------------------------------------------------------------------------------------
# the flag reference: generated from the recipes' parsers, never stale
# ---------------------------------------------------------------------------------------------------------------------
def _make_flags():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_flags", DOCS / "hooks" / "make_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flag_reference_is_up_to_date():
    make_flags = _make_flags()
    assert (DOCS / "flags.md").read_text() == make_flags.render(), (
        f"docs/flags.md is stale: run `{make_flags.COMMAND}` from the checkout's root and commit the page"
    )


def test_flag_reference_lists_every_flag_of_every_recipe():
    make_flags = _make_flags()
    page = (DOCS / "flags.md").read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", page, flags=re.S | re.M))
    assert list(sections) == [name for name, _ in make_flags.RECIPES]
    for name, _ in make_flags.RECIPES:
        parser = make_flags.recipe_parser(name)
        flags = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
        assert len(flags) >= 5, name
        listed = set(re.findall(r"`(--[\w-]+)`", sections[name].split("|---|", 1)[1]))
        assert flags <= listed, f"{name}: {sorted(flags - listed)} missing from docs/flags.md"
    happier = sections["train_happier"]
    assert "| `--max_train_steps` |" in happier and "| `--epochs` | `12` |" in happier  # the recipe's own default
    assert "| `--model` | required |" in sections["search"] or "| `--model` | — |" in sections["search"]
