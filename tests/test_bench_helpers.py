"""Tests of the benchmark helpers: the profiler counts of ``benchmarks/_bench_common.py``, the naive ``B × N × N``
hierarchical baselines of ``benchmarks/bench_hierarchical.py`` (same value and gradient as the losses, float64) and
``bench_losses.py --settings`` validation. No timing, no ``torch.compile`` (slow): tiny tensors only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pml_suprank import losses

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    """The benchmark modules, imported with ``benchmarks/`` on ``sys.path`` (as when run as scripts)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        names = ("_bench_common", "bench_hierarchical", "bench_losses")
        yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("_bench_common", "bench_hierarchical", "bench_losses"):
            sys.modules.pop(name, None)


def test_profile_counts_top_level_compute_and_sync_ops(bench):
    common = bench["_bench_common"]
    x = torch.randn(8, 3)
    no_sync = common.profile_counts(lambda: (x.t() * 2).sum())
    assert no_sync == {"aten_ops": 3, "compute_ops": 2, "syncs": 0}  # t (a view: not a launch), mul, sum
    with_sync = common.profile_counts(lambda: (x * 2).sum().item())
    assert with_sync["syncs"] == 1  # item and its nested _local_scalar_dense count once


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
@pytest.mark.parametrize("name", ["SupHAPLoss", "SupNDCGLoss", "HAPPIERLoss"])
def test_naive_hierarchical_baselines_match_the_losses(bench, name, kernel):
    hier = bench["bench_hierarchical"]
    emb, labels, num_fine = hier.make_batch(16, 2, 8, "random", seed=0)
    emb = emb.double()
    proxies = torch.nn.Parameter(torch.randn(num_fine, 8, dtype=torch.float64))
    ours = hier._kernel_fn(name, kernel, num_fine, 8, proxies)
    naive = hier._kernel_fn(name, "naive dense", num_fine, 8, proxies)
    grads = []
    for fn in (ours, naive):
        x = emb.clone().requires_grad_(True)
        value = fn(x, labels)
        value.backward()
        grads.append((value.detach(), x.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-9, atol=1e-12)


def test_kernel_fn_builds_the_requested_kernel(bench):
    fn = bench["bench_hierarchical"]._kernel_fn("SupNDCGLoss", "dense compiled", 4, 8, None)
    emb = F.normalize(torch.randn(16, 8), dim=1)
    labels = torch.stack([torch.arange(16) // 4, torch.arange(16) // 8], 1)
    expected = losses.SupNDCGLoss(kernel="dense")(emb, labels)
    torch.testing.assert_close(fn(emb, labels), expected)


@pytest.mark.parametrize("mode", [[], ["--crossover"]])
def test_bench_losses_rejects_unknown_settings(bench, mode):
    with pytest.raises(ValueError, match="--settings"):  # raised before anything is timed
        bench["bench_losses"].main([*mode, "--settings", "in-batch B=7", "--rows", "SupAP"])
