"""examples/accelerate_loop.py, the plain Accelerate loop beside the hardened recipe, runs and learns."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("timm")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_loop.py"


def _example():
    spec = importlib.util.spec_from_file_location("accelerate_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a short training run (~20 s on 2 CPU cores)
def test_the_plain_accelerate_loop_trains_and_evaluates():
    example = _example()
    argv = ["--cpu", "--image_size", "16", "--num_per_class", "8", "--embedding_size", "16", "--epochs", "2",
            "--max_steps", "8", "--memory_size", "64"]  # fmt: skip
    result = example.main(argv)
    assert set(result) == {"before", "after"}
    for metrics in result.values():
        assert set(metrics) == {"h_ap", "ndcg", "recall_at_1", "recall_at_10"}
        assert all(0.0 <= v <= 1.0 and math.isfinite(v) for v in metrics.values())
    assert result["after"] != result["before"]  # the weights moved


def test_the_example_stays_readable():
    lines = EXAMPLE.read_text().splitlines()
    assert len(lines) <= 180  # about 150 lines: one file to read top to bottom
    text = "\n".join(lines)
    for name in ("HAPPIERLoss", "MPerClassBatchSampler", "RankingMemory", "RetrievalEvaluator", "Accelerator"):
        assert name in text
