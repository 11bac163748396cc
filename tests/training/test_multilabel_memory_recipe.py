"""The cross-batch memory stores multi-label label sets: the training command trains the multi-label
SyntheticMultiShapes with a memory (RankingMemory of (M, W) label sets), as the memory's docstring says."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from pml_suprank.training import RunSpec
from pml_suprank.training import recipe as common

TINY = [
    "--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "4", "--embedding_size", "8",
    "--batch_size", "16", "--eval_batch_size", "64", "--with_tracking", "false", "--cpu", "--no_plots",
    "--max_train_steps", "3", "--skip_initial_eval",
]  # fmt: skip


def test_a_memory_is_no_refusal_for_multilabel_data():
    spec = RunSpec.from_values({"dataset": "synthetic_multilabel", "loss": "HAPPIER", "memory_size": 64})
    assert spec.train.memory_size == 64


@pytest.mark.slow  # a 3-step training run (~15 s on 2 CPU cores)
def test_multilabel_data_trains_with_a_memory_of_label_sets(tmp_path):
    out = tmp_path / "run"
    argv = ["--dataset", "synthetic_multilabel", "--memory_size", "64", *TINY, "--output_dir", str(out)]
    summary = common.main(argv, "test", common.PRESETS["train"])
    assert summary["steps"] == 3 and all(torch.isfinite(torch.tensor(v)) for v in summary["after"].values())
    state = load_file(str(out / "checkpoints" / "step_00000003" / "model.safetensors"))
    labels, filled = state["memory.labels"], state["memory.filled"]
    assert labels.shape[0] == 64 and labels.shape[1] > 1  # (M, W) label sets, padded with -1
    stored = labels[filled.bool()]
    assert len(stored) == 48 and ((stored >= 0).sum(1) > 1).any() and (stored == -1).any()
    assert json.loads((out / "final" / "config.json").read_text())["training"]["loss"] == "HAPPIER"
