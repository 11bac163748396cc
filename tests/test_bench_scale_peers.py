"""Dry runs of ``benchmarks/bench_scale.py`` and ``benchmarks/bench_peers.py`` (tiny sizes): every part runs and
prints the keys the performance page reads. No timing is asserted (benchmarks print ratios)."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name) for name in ("bench_scale", "bench_peers")}
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("bench_scale", "bench_peers", "bench_search"):
            sys.modules.pop(name, None)


def test_scale_data_and_identity_check(bench):
    scale = bench["bench_scale"]
    emb, labels = scale.labelled(200, 8, seed=1)
    assert emb.shape == (200, 8) and labels.shape == (200, 2)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(200))
    assert torch.equal(labels[:, 1], labels[:, 0] // 10)
    assert [scale._tag(n) for n in (200_000, 1_000_000, 1234)] == ["200k", "1m", "1234"]
    summary = {"num_queries": 3, "ap": 0.5}
    per_query = {"ap": np.array([0.5, float("nan"), 0.25])}
    same = (dict(summary), {"ap": per_query["ap"].copy()})
    assert scale.identical((summary, per_query), same)
    assert not scale.identical((summary, per_query), ({**summary, "num_queries": 2}, per_query))
    assert not scale.identical((summary, per_query), (summary, {"ap": np.array([0.5, float("nan"), 0.25 + 1e-9])}))
    assert scale.identical((summary, per_query), (summary, {"ap": np.array([0.5, float("nan"), 0.25 + 1e-13])}))


def test_peers_dry_run_prints_every_key(bench, capsys):
    out = bench["bench_peers"].main(["--dry-run"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(out))
    assert out["dry_run"] and out["torch"] == torch.__version__ and out["commit"] and out["date"]
    for key in ("ours_s", "pml_s", "torchmetrics_s", "mapr_abs_diff", "p1_abs_diff", "ap_abs_diff_torchmetrics"):
        assert out[f"eval_300_{key}"] >= 0, key
    assert out["mapr_abs_diff"] < 1e-6  # the same embeddings, L2-normalised: PML's k-NN agrees with the ranking
    names = ("ours_SmoothAPLoss", "ours_SupAPLoss", "pml_SmoothAPLoss", "pml_FastAPLoss", "pml_MultiSimilarityLoss")
    for name in names:
        assert out[f"loss_{name}_b32_s"] > 0
        assert out[f"loss_{name}_m500_s"] is None or out[f"loss_{name}_m500_s"] > 0
    assert out["loss_ours_SmoothAPLoss_m500_s"] > 0 and out["loss_ours_SupAPLoss_m500_s"] > 0


@pytest.mark.slow
def test_scale_dry_run_prints_every_key():
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_scale.py"), "--dry-run"], capture_output=True,
                          text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dry_run"] and out["eval_2proc_identical"] is True
    assert out["eval_2proc_speedup"] > 0 and math.isfinite(out["eval_2proc_speedup"])
    assert out["eval_600_floor_ratio"] > 0 and out["eval_600_peak_rss_gb_over_embeddings"] >= 0
    assert 0 <= out["search_3k_recall_at_10"] <= 1 and out["search_3k_qps"] > 0
