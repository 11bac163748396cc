"""``choose_kernel``'s cost model against the grids it was fitted to (the two H200 grids in tests/data) and its CPU
rules (flat, and per number of hierarchy levels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import DATA

from pml_suprank.ranking import KernelCosts, choose_kernel, kernel_costs, predicted_costs
from pml_suprank.ranking.dense import (
    CPU_DENSE_MAX_WORK,
    CPU_HIERARCHICAL_DENSE_MAX_WORK,
    CUDA_FLAT_COSTS,
    CUDA_HIERARCHICAL_COSTS,
)

GRIDS = (DATA / "h200_2026-11-26_grid.jsonl", DATA / "h200_2026-11-28_grid.jsonl")
LEVELS = {"SupAPLoss": 1, "SmoothAPLoss": 1, "SupHAPLoss": 2}  # the grid's Sup-H-AP has 2 levels


def _grid(path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["section"] == "grid"]


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.stem)
def test_grid_file_is_the_h200_measurement(path):
    meta = json.loads(path.read_text().splitlines()[0])
    assert meta["name"] == "NVIDIA H200" and meta["torch"].startswith("2.11")
    rows = _grid(path)
    assert len(rows) == 72 and {r["loss"] for r in rows} == set(LEVELS)


def test_cuda_auto_is_dense_where_the_2026_11_28_grid_measured_dense_faster_for_sup_hap():
    """The three points of the second H200 grid whose ``auto`` column (computed there without ``levels=2``, i.e. by
    the flat model) said sorted: the hierarchical model the losses use picks dense, the faster one."""
    for b, n, dense_ms, sorted_ms in ((32, 2048, 18.4, 30.8), (64, 1024, 9.9, 30.0), (256, 512, 9.8, 16.9)):
        assert sorted_ms > 1.3 * dense_ms
        assert choose_kernel("auto", "cuda", b, n, levels=2) == "dense"
        dense, sorted_ = predicted_costs("cuda", b, n, levels=2)
        assert dense == pytest.approx(dense_ms, rel=0.3) and dense < sorted_


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.stem)
def test_cuda_auto_picks_the_faster_kernel_wherever_the_grid_separates_them_by_1_3x(path):
    decided = 0
    for r in _grid(path):
        slow, fast = max(r["dense"], r["sorted"]), min(r["dense"], r["sorted"])
        if slow < 1.3 * fast:
            continue
        faster = "dense" if r["dense"] < r["sorted"] else "sorted"
        picked = choose_kernel("auto", "cuda", r["B"], r["N"], levels=LEVELS[r["loss"]])
        assert picked == faster, (r["B"], r["N"], r["loss"], r["dense"], r["sorted"])
        decided += 1
    assert decided >= 60  # most of the 72 points are far apart; the close ones may go either way


@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 32, 256, 4096])
def test_cuda_auto_is_sorted_against_a_60000_item_memory(batch, levels):
    assert choose_kernel("auto", "cuda", batch, 60_000, levels=levels) == "sorted"
    assert choose_kernel("auto", torch.device("cuda", 0), batch, 60_000, levels=levels) == "sorted"


def test_cuda_auto_examples_of_the_docstring():
    assert choose_kernel("auto", "cuda", 256, 256) == "dense"  # in-batch
    assert choose_kernel("auto", "cuda", 256, 1024) == "sorted"
    assert choose_kernel("auto", "cuda", 32, 1024) == "dense"
    assert choose_kernel("auto", "cuda", 256, 4096, levels=2) == "sorted"
    assert choose_kernel("auto", "cuda", 128, 1024, levels=2) == "dense"
    assert choose_kernel("auto", "cuda", 512, 512, levels=2) == "sorted"


def test_cost_model_values_are_the_fitted_lines():
    dense, sorted_ = predicted_costs("cuda", 256, 4096)
    c = CUDA_FLAT_COSTS
    assert dense == pytest.approx(c.dense_ms + c.dense_per_elem * 256 * 4096**2)
    assert sorted_ == pytest.approx(c.sorted_ms + c.sorted_per_pair * 256 * 4096)
    # the fit reproduces the measured times within a factor of two at the large points (ms)
    assert dense == pytest.approx(313.6, rel=0.5) and sorted_ == pytest.approx(9.0, rel=0.5)
    h_dense, h_sorted = predicted_costs("cuda", 256, 4096, levels=2)
    assert h_dense == pytest.approx(518.2, rel=0.5) and h_sorted == pytest.approx(26.7, rel=0.5)


def test_more_levels_scale_the_size_terms():
    two, three = kernel_costs("cuda", 2), kernel_costs("cuda", 3)
    assert isinstance(two, KernelCosts) and two == CUDA_HIERARCHICAL_COSTS
    assert three.dense_per_elem == pytest.approx(2 * two.dense_per_elem)
    assert three.sorted_per_ref == pytest.approx(2 * two.sorted_per_ref)
    assert three.dense_ms == two.dense_ms and three.sorted_ms == two.sorted_ms


@pytest.mark.parametrize("levels, threshold", [(2, 1 << 17), (3, 1 << 19), (4, 1 << 20), (6, 1 << 20)])
def test_cpu_hierarchical_threshold_per_number_of_levels(levels, threshold):
    """Measured for 2, 3 and 4 levels (more levels keep the 4-level threshold): dense iff B·N² <= threshold."""
    assert CPU_HIERARCHICAL_DENSE_MAX_WORK[min(levels, 4)] == threshold
    n = int((threshold // 64) ** 0.5)
    assert choose_kernel("auto", "cpu", 64, n, levels=levels) == "dense"
    assert choose_kernel("auto", "cpu", 64, n + 1, levels=levels) == "sorted"
    assert choose_kernel("auto", "cpu", 40, 40, levels=levels) == "dense"  # 6.4e4: dense 1.6-3× faster (2 levels)
    assert choose_kernel("auto", "cpu", 80, 80, levels=2) == "sorted"  # 5.1e5: sorted 2.1× faster
    assert choose_kernel("auto", "cpu", 256, 60_000, levels=levels) == "sorted"


def test_cpu_flat_rule_keeps_its_measured_threshold():
    levels = 1
    n = int((CPU_DENSE_MAX_WORK // 64) ** 0.5)
    assert choose_kernel("auto", "cpu", 16, 16, levels=levels) == "dense"
    assert choose_kernel("auto", "cpu", 32, 32, levels=levels) == "dense"  # B·N² = 2^15
    assert choose_kernel("auto", "cpu", 64, 64, levels=levels) == "sorted"
    assert choose_kernel("auto", "cpu", 64, n, levels=levels) == "dense"
    assert choose_kernel("auto", "cpu", 64, n + 1, levels=levels) == "sorted"
    assert choose_kernel("auto", "cpu", 256, 60_000, levels=levels) == "sorted"


def test_forced_kernels_and_invalid_options():
    assert choose_kernel("dense", "cuda", 10**6, 10**6, levels=3) == "dense"
    assert choose_kernel("sorted", "cpu", 2, 2) == "sorted"
    with pytest.raises(ValueError, match="kernel must be one of"):
        choose_kernel("Dense", "cpu", 2, 2)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="levels must be a positive int"):
            choose_kernel("auto", "cuda", 2, 2, levels=bad)
        with pytest.raises(ValueError, match="levels must be a positive int"):
            kernel_costs("cpu", bad)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("auto", "blah", 2, 2), ValueError, "device must be a valid torch device string"),
        (("auto", None, 2, 2), TypeError, "device must be a str or a torch.device; got NoneType"),
        (("dense", 3, 2, 2), TypeError, "device must be a str or a torch.device; got int"),
        (("auto", "cpu", -1, 2), ValueError, "num_queries must be an int >= 0; got -1"),
        (("auto", "cpu", 2, -5), ValueError, "num_refs must be an int >= 0; got -5"),
        (("auto", "cpu", 2.5, 2), TypeError, "num_queries must be an int >= 0; got float"),
        (("auto", "cpu", True, 2), TypeError, "num_queries must be an int >= 0; got bool"),
    ],
)
def test_invalid_device_and_sizes_are_named(args, error, match):
    """Was torch's RuntimeError/TypeError for a bad device, and any size (negative, float, bool) was accepted."""
    with pytest.raises(error, match=match):
        choose_kernel(*args)


def _doc_number(cell: str) -> float:
    cell = cell.strip()
    return float(2 ** int(cell[2:])) if cell.startswith("2^") else float(cell)


def test_the_constants_table_of_the_performance_page_is_the_code():
    """docs/performance.md lists the constants of ``kernel_costs`` row by row: every number is the code's."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "performance.md").read_text()
    rows = [line.split("|")[1:-1] for line in page.splitlines() if line.startswith(("| CUDA (any", "| CPU |"))]
    cases = {
        ("CUDA", "flat"): [("cuda", 1)],
        ("CUDA", "hierarchical"): [("cuda", 2)],
        ("CPU", "flat"): [("cpu", 1)],
        ("CPU", "hierarchical"): [("cpu", 2), ("cpu", 3), ("cpu", 4), ("cpu", 7)],
    }
    seen = set()
    for cells in rows:
        key = (cells[0].split()[0], "flat" if "flat" in cells[1] else "hierarchical")
        seen.add(key)
        for i, (device, levels) in enumerate(cases[key]):
            expected = kernel_costs(device, levels)
            # a cell "a / b / c" lists one value per number of levels (the last one for every larger number)
            got = [_doc_number(c.split("/")[min(i, len(c.split("/")) - 1)]) for c in cells[2:7]]
            assert got == pytest.approx(list(expected), rel=1e-12, abs=0), (key, levels)
    assert seen == set(cases)
