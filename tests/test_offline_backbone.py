"""A pretrained backbone requested while offline (``HF_HUB_OFFLINE=1``, an empty ``HF_HOME``): a message naming the
ways out (``--pretrained false``, the offline setting with a cached copy, a local checkpoint), never the Hub client's
raw ``LocalEntryNotFoundError``; and the local checkpoint it suggests does load offline.

Run in a subprocess: ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` and ``HF_HOME`` when it is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("timm")
pytest.importorskip("huggingface_hub")

REPO = Path(__file__).resolve().parents[1]


def _offline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,  # noqa: TID251 - the child process's environment is the point of the test
        "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty_hf_home"),
        "TORCH_HOME": str(tmp_path / "empty_torch_home"), "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE",
    }  # fmt: skip
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


CODE = """
import sys, timm, torch
from safetensors.torch import save_file
from pml_suprank.models import RetrievalModel
try:
    RetrievalModel("test_resnet", pretrained=True)
except ValueError as e:
    print("ValueError:", e)
weights = timm.create_model("test_resnet", num_classes=0)
save_file(weights.state_dict(), sys.argv[1])
overlay = {"pretrained_cfg_overlay": {"file": sys.argv[1]}}
local = RetrievalModel("test_resnet", pretrained=True, backbone_kwargs=overlay)
print("local checkpoint loaded:", torch.equal(local.backbone.conv1[0].weight, weights.conv1[0].weight))
"""


@pytest.mark.slow
def test_a_pretrained_backbone_while_offline_names_the_ways_out(tmp_path):
    done = _offline(tmp_path, "-c", CODE, str(tmp_path / "weights.safetensors"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    expected = "could not get the pretrained weights of timm backbone 'test_resnet' (LocalEntryNotFoundError"
    assert f"ValueError: {expected}" in out
    assert "--pretrained false" in out and "set HF_HUB_OFFLINE=1" in out and "'pretrained_cfg_overlay'" in out
    assert "local checkpoint loaded: True" in out  # the suggested local checkpoint works offline


@pytest.mark.slow
def test_the_training_command_refuses_it_with_the_message(tmp_path):
    args = ["-m", "pml_suprank.recipes.train_happier", "--backbone", "test_resnet", "--pretrained", "true", "--cpu",
            "--output_dir", str(tmp_path / "run"), "--max_train_steps", "1", "--no_plots"]  # fmt: skip
    done = _offline(tmp_path, *args)
    assert done.returncode == 2
    assert "error: --backbone test_resnet: could not get the pretrained weights" in done.stderr
    assert "--pretrained false" in done.stderr and "Traceback" not in done.stderr
