"""``benchmarks/gpu_report.py --device cpu --small`` (the dry run of the one GPU report) and the generator that turns
its JSON into the GPU section of ``docs/performance.md``."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MODULES = ("_bench_common", "gpu_report", "report_to_docs")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name) for name in MODULES}
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in MODULES:
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def dry_run(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.json"
    report = bench["gpu_report"].main(["--device", "cpu", "--small", "--out", str(out)])
    return report, out


@pytest.mark.slow
def test_dry_run_writes_every_section_with_device_torch_and_commit(dry_run):
    report, out = dry_run
    assert json.loads(out.read_text()) == report
    meta = report["meta"]
    assert meta["device"] == "cpu" and meta["small"] and meta["torch"] and meta["commit"] and meta["date"]
    assert report["skipped"] == []
    grid = report["grid"]
    assert {(r["B"], r["N"]) for r in grid} == {(8, 8), (8, 64), (16, 16), (16, 128)}
    assert {(r["loss"], r["levels"]) for r in grid} == {("SupAPLoss", 1), ("SmoothAPLoss", 1), ("SupHAPLoss", 2)}
    for r in grid:
        assert r["dense_s"] > 0 and r["sorted_s"] > 0 and r["auto"] in ("dense", "sorted") and "error" not in r
        assert r["BN2"] == r["B"] * r["N"] ** 2
    memory = report["memory"]
    assert {r["N"] for r in memory} == {256, 1024} and {r["group"] for r in memory} == {"flat", "hierarchical"}
    assert not [r for r in memory if r["N"] == 1024 and r["kernel"] == "dense"]  # beyond the dense limit
    assert all(r["time_s"] > 0 and r["x_matmul"] > 0 for r in memory)
    assert [r["levels"] for r in report["eval"]] == [2, 3]
    assert all(r["max_abs_diff"] <= 1e-6 and 0 <= r["h_ap"] <= 1 for r in report["eval"])
    ops = {(r["loss"], r["kernel"]): r for r in report["ops"]}
    assert len(ops) == 7 * 3
    assert ops[("SupAPLoss", "dense")]["syncs"] == 0 and ops[("SupAPLoss", "sorted")]["syncs"] == 1


@pytest.mark.slow
def test_generator_replaces_only_the_gpu_section(bench, dry_run, tmp_path):
    report, out = dry_run
    gen = bench["report_to_docs"]
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\nCPU tables.\n\n{gen.BEGIN}\nold\n{gen.END}\n\nAfter.\n")
    gen.main([str(out), "--docs", str(page)])
    text = page.read_text()
    assert text.startswith("# Performance\n\nCPU tables.\n\n") and text.endswith("\n\nAfter.\n")
    assert "old" not in text and text.count(gen.BEGIN) == 1
    assert report["meta"]["commit"] in text and report["meta"]["torch"] in text and "dry run" in text
    assert text.count("| SupHAPLoss (2) |") == 4 and "| SupNDCGLoss | sorted |" in text
    gen.main([str(out), "--docs", str(page)])  # idempotent
    assert page.read_text() == text


def test_generator_appends_a_section_to_a_page_without_markers(bench):
    gen = bench["report_to_docs"]
    meta = {"device_name": "cuda (NVIDIA H200)", "torch": "2.11.0", "commit": "abc1234", "date": "2026-11-26"}
    grid = [
        {
            "B": 256,
            "N": 4096,
            "BN2": 256 * 4096**2,
            "loss": "SupAPLoss",
            "levels": 1,
            "dense_s": 0.3136,
            "sorted_s": 0.009,
            "faster": "sorted",
            "ratio": 34.8,
            "auto": "sorted",
        }
    ]
    report = {"meta": meta, "grid": grid, "memory": [], "eval": [], "ops": [], "skipped": []}
    text = gen.update("# Performance\n", report)
    assert text.startswith("# Performance\n\n" + gen.BEGIN) and text.rstrip().endswith(gen.END)
    assert "| 256 | 4096 | 4.3e+09 | SupAPLoss (1) | 313.60 | 9.00 | sorted 34.80× | sorted | yes |" in text
    assert "NVIDIA H200" in text and "abc1234" in text
