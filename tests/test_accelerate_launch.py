"""The single-process launch command documented in docs/recipes.md passes every value `accelerate launch` would
otherwise default with a warning, when the user has no Accelerate config file (an empty HF_HOME here)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[1]
WARNING = "had defaults used instead"


def _launch(words: list[str], home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the tests
    env.update({"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    assert words[:2] == ["accelerate", "launch"], words
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", *words[1:], "--help"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two launcher + recipe start-ups
def test_documented_single_process_command_launches_without_the_defaults_warning(tmp_path):
    text = (ROOT / "docs" / "recipes.md").read_text()
    lines = re.findall(r"^accelerate launch --num_processes 1 .*$", text, flags=re.M)
    assert lines, "docs/recipes.md documents the single-process launch command"
    words = shlex.split(lines[0].split("#")[0])
    quiet = _launch(words, tmp_path / "hf")
    assert quiet.returncode == 0, quiet.stderr
    assert "--auto_augment" in quiet.stdout  # the recipe ran (its --help)
    assert WARNING not in quiet.stderr, quiet.stderr
    bare = _launch(["accelerate", "launch", "recipes/train_happier.py"], tmp_path / "hf")
    assert bare.returncode == 0 and WARNING in bare.stderr  # what the flags avoid
