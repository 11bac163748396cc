"""Issue 13 on a CUDA device (skipped without one): the dense losses and the evaluator's device path run without a
host synchronisation (``torch.cuda.set_sync_debug_mode("error")`` raises on any), the sorted flat losses read the
device once per call, the compiled dense loss matches the eager one, and a non-finite embedding fails the
device-side check. Run with ``python -m pytest -m gpu``."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from pml_suprank import losses
from pml_suprank.metrics import RetrievalEvaluator

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FLAT = ["SupAPLoss", "SmoothAPLoss", "ROADMAPLoss", "SupRecallLoss"]
HIERARCHICAL = ["SupHAPLoss", "SupNDCGLoss", "HAPPIERLoss", "RODNDCGLoss"]


def _make(name: str, kernel: str, dim: int):
    kw = {"num_classes": 64, "embedding_size": dim} if name in ("HAPPIERLoss", "RODNDCGLoss") else {}
    return getattr(losses, name)(kernel=kernel, **kw)


def _batch(name: str, batch: int = 256, dim: int = 64, device: str = "cuda"):
    g = torch.Generator().manual_seed(0)
    emb = F.normalize(torch.randn(batch, dim, generator=g), dim=1)
    fine = torch.arange(batch) // 4
    labels = torch.stack([fine, fine // 4], 1) if name in HIERARCHICAL else fine
    return emb.to(device), labels.to(device)


@pytest.mark.parametrize("name", FLAT + HIERARCHICAL)
def test_dense_loss_has_no_host_sync_on_cuda(name):
    emb, labels = _batch(name)
    loss_fn = _make(name, "dense", emb.shape[1]).cuda()
    x = emb.clone().requires_grad_(True)
    loss_fn(x, labels).backward()  # warm-up: lazy initialisations may synchronise once
    x.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        value = loss_fn(x, labels)
        value.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu_fn = _make(name, "dense", emb.shape[1])
    cpu_fn.load_state_dict({k: v.cpu() for k, v in loss_fn.state_dict().items()})
    x_cpu = emb.cpu().requires_grad_(True)
    expected = cpu_fn(x_cpu, labels.cpu())
    expected.backward()
    torch.testing.assert_close(value.cpu(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", FLAT)
@pytest.mark.parametrize("memory", [None, 4096])
def test_sorted_flat_loss_reads_the_device_once_on_cuda(name, memory):
    emb, labels = _batch(name)
    loss_fn = _make(name, "sorted", emb.shape[1]).cuda()
    kwargs = {}
    if memory is not None:
        g = torch.Generator().manual_seed(1)
        kwargs = {
            "ref_emb": F.normalize(torch.randn(memory, emb.shape[1], generator=g), dim=1).cuda(),
            "ref_labels": (torch.arange(memory) // 5).cuda(),
        }
    x = emb.clone().requires_grad_(True)
    loss_fn(x, labels, **kwargs).backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss_fn(x, labels, **kwargs).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    assert len(syncs) <= 2, [str(w.message) for w in syncs]  # the pair counts' one read (+ a copy of its size)


def test_evaluator_device_path_matches_the_cpu_and_syncs_do_not_grow_with_blocks():
    g = torch.Generator().manual_seed(2)
    emb = F.normalize(torch.randn(2048, 32, generator=g), dim=1)
    fine = torch.randint(0, 200, (2048,), generator=g)
    labels = torch.stack([fine, fine % 10], 1)
    cpu = RetrievalEvaluator(k_values=(1, 10)).evaluate(emb, labels)
    counts = {}
    for blocks in (1, 8):
        evaluator = RetrievalEvaluator(k_values=(1, 10), chunk_size=2048 // blocks, counting="dense")
        result = evaluator.evaluate(emb.cuda(), labels.cuda())
        for key, value in cpu.items():
            if isinstance(value, float):
                assert result[key] == pytest.approx(value, abs=1e-3), key  # GPU matmul rounding may swap near-ties
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                evaluator.evaluate(emb.cuda(), labels.cuda())
        finally:
            torch.cuda.set_sync_debug_mode("default")
        counts[blocks] = len([w for w in caught if "synchroniz" in str(w.message).lower()])
    assert counts[1] == counts[8], counts


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SupAPLoss", "ROADMAPLoss", "HAPPIERLoss"])
def test_compiled_dense_loss_on_cuda_matches_eager(name):
    torch._dynamo.reset()
    emb, labels = _batch(name)
    loss_fn = _make(name, "dense", emb.shape[1]).cuda()
    compiled = torch.compile(loss_fn, fullgraph=True)
    torch.testing.assert_close(compiled(emb, labels), loss_fn(emb, labels), rtol=1e-4, atol=1e-5)


def test_non_finite_embeddings_fail_the_device_side_check():
    code = (
        "import torch; from pml_suprank import losses\n"
        "e = torch.randn(8, 4, device='cuda'); e[0, 0] = float('nan')\n"
        "loss = losses.SupAPLoss(kernel='dense')(e, torch.arange(8, device='cuda') // 2)\n"
        "torch.cuda.synchronize()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "assert" in proc.stderr.lower(), proc.stderr[-2000:]
