"""The README and the docs site: every ```python block runs as written (offline), except the ones marked as needing
the network; the README stays a short guide; the docs build with ``mkdocs build --strict`` where mkdocs is installed."""

import re
import shutil
import subprocess
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


def test_few_blocks_are_not_runnable_and_they_say_why():
    skipped = [b for _, _, b in _all_blocks() if b.lstrip().startswith(OFFLINE_MARK)]
    assert len(skipped) <= MAX_OFFLINE_BLOCKS
    for block in skipped:
        reason = block.lstrip()[len(OFFLINE_MARK) :].splitlines()[0].strip()
        assert len(reason) > 10, "a block that is not run must say why"
    assert len(_runnable()) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted({p for p, _, _ in _runnable()}))
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


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists(),
    reason="mkdocs is not installed (pip install -e '.[dev]')",
)
def test_mkdocs_build_strict(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()


# ---------------------------------------------------------------------------------------------------------------------
# shell blocks: every ``python recipes/<name>.py`` command of these pages runs as written, at small sizes through the
# recipe's documented flags (appended: the last value of a flag wins)
# ---------------------------------------------------------------------------------------------------------------------
SHELL_PAGES = ("docs/ood.md",)
_FIT_HEAT_SMALL = ["--num_per_class", "3", "--num_test_per_class", "2", "--num_noise", "12", "--train_epochs", "1",
                   "--heat_epochs", "1", "--knn_k", "3", "--no_plots", "true"]  # fmt: skip
SMALL_FLAGS = {
    "fit_heat": [*_FIT_HEAT_SMALL, "--threads", "1", "--progress", "false"],
    "ood_benchmark": ["--heat_epochs", "1", "--threads", "1", "--progress", "false", "--no_plots", "true"],
    "ood_benchmark_extract": ["--num_per_class", "3", "--num_test_per_class", "2", "--num_noise", "12",
                              "--train_epochs", "1"],
}  # fmt: skip


def _shell_commands(page: str) -> list[list[str]]:
    """The ``python recipes/...`` commands of the page's ```bash blocks (continuation lines joined, comments and
    other commands left out), as argv lists."""
    import shlex

    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("python recipes/"):
                commands.append(shlex.split(line)[1:])
    return commands


def test_the_shell_pages_have_recipe_commands():
    for page in SHELL_PAGES:
        commands = _shell_commands(page)
        assert commands and all(c[0].startswith("recipes/") for c in commands), page


@pytest.mark.slow
@pytest.mark.parametrize("page", SHELL_PAGES)
def test_shell_blocks_run(page, tmp_path):
    """The page's recipe commands run in order from a checkout's root (they may read what an earlier one wrote)."""
    import os

    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # noqa: TID251
    for argv in _shell_commands(page):
        name = Path(argv[0]).stem
        small = SMALL_FLAGS.get(name, [])
        if name == "ood_benchmark" and "--features" not in argv:
            small = [*small, *SMALL_FLAGS["ood_benchmark_extract"]]
        proc = subprocess.run([sys.executable, *argv, *small], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
