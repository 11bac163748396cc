"""Every ```python block of the README runs as written (offline), except the few marked as needing the network."""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
OFFLINE_MARK = "# not runnable offline:"
MAX_OFFLINE_BLOCKS = 2


def _section(name: str) -> str:
    text = README.read_text()
    start = text.index(f"<!-- section:{name} -->")
    return text[start : text.index(f"<!-- /section:{name} -->")]


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _runnable() -> list[tuple[int, str]]:
    return [(i, b) for i, b in enumerate(_blocks()) if not b.lstrip().startswith(OFFLINE_MARK)]


def test_at_most_two_blocks_are_not_runnable_and_they_say_why():
    skipped = [b for b in _blocks() if b.lstrip().startswith(OFFLINE_MARK)]
    assert len(skipped) <= MAX_OFFLINE_BLOCKS
    for block in skipped:
        reason = block.lstrip()[len(OFFLINE_MARK) :].splitlines()[0].strip()
        assert len(reason) > 10, "a block that is not run must say why"
    assert len(_runnable()) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("index", [i for i, _ in _runnable()])
def test_readme_python_block_runs(index, tmp_path, monkeypatch, capsys):
    block = dict(_runnable())[index]
    monkeypatch.chdir(tmp_path)  # blocks write under outputs/
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    namespace: dict = {"__name__": f"readme_block_{index}"}
    exec(compile(block, f"README.md#block{index}", "exec"), namespace)
    loss = namespace.get("loss")
    if isinstance(loss, torch.Tensor):
        assert torch.isfinite(loss).all()


@pytest.mark.slow
def test_quickstart_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", _section("quickstart"), flags=re.S)
    assert blocks, "the quickstart section must contain a python block"
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md#quickstart", "exec"), namespace)
    assert torch.isfinite(namespace["loss"])
    assert "ROADMAP loss after one epoch" in capsys.readouterr().out


def test_losses_table_lists_every_flat_loss():
    section = _section("losses")
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
