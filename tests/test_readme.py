"""The README quick start runs as written."""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(name: str) -> str:
    text = README.read_text()
    start = text.index(f"<!-- section:{name} -->")
    return text[start : text.index(f"<!-- /section:{name} -->")]


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
