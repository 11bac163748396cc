"""Rank losses under mixed precision: inside ``torch.autocast`` (bfloat16 / float16) every loss, eager and
``torch.compile``\\ d, equals its float32 value and gradient to float32 precision (the scores, the rank math and the
proxy / calibration terms run in float32; see :mod:`pml_suprank._precision`).

Issue 20 item 7: bf16 + a compiled dense HAPPIER trained a much worse model (its scores / gradients were bfloat16).
"""

from __future__ import annotations

import pytest
import torch

from pml_suprank import losses
from pml_suprank.training.loss_module import LossModule

B, D, C = 24, 16, 4


def _fp16_cpu_autocast() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    except (RuntimeError, ValueError):
        return False


DTYPES = [torch.bfloat16] + ([torch.float16] if _fp16_cpu_autocast() else [])

FLAT = {
    "smooth_ap": lambda: losses.SmoothAPLoss(),
    "sup_ap": lambda: losses.SupAPLoss(),
    "sup_ap_dense": lambda: losses.SupAPLoss(kernel="dense"),
    "roadmap": lambda: losses.ROADMAPLoss(),
    "sup_recall": lambda: losses.SupRecallLoss(k=(1, 2, 4)),
    "rod_recall": lambda: losses.RODRecallLoss(k=(1, 2, 4)),
    "calibration": lambda: losses.CalibrationLoss(),
    "cluster": lambda: losses.ClusterLoss(num_classes=C, embedding_size=D),
}
HIERARCHICAL = {
    "happier": lambda: losses.HAPPIERLoss(num_classes=C, embedding_size=D),
    "happier_dense": lambda: losses.HAPPIERLoss(num_classes=C, embedding_size=D, kernel="dense"),
    "sup_hap": lambda: losses.SupHAPLoss(),
    "sup_ndcg": lambda: losses.SupNDCGLoss(),
    "rod_ndcg": lambda: losses.RODNDCGLoss(num_classes=C, embedding_size=D),
    "csl": lambda: losses.CSLLoss(num_classes=C, embedding_size=D, margins=(0.25, 0.35)),
}


def _inputs(hierarchical: bool):
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(B, D, generator=g)
    fine = torch.arange(B) % C
    labels = torch.stack([fine, fine // 2], 1) if hierarchical else fine
    return emb, labels


def _value_and_grad(loss, emb, labels, dtype=None):
    x = emb.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        value = loss(x, labels)
    (grad,) = torch.autograd.grad(value, x)
    return value.detach(), grad


def _build(factory):
    torch.manual_seed(1)  # the same proxies for every copy
    return factory()


def _check_equal(loss, emb, labels, dtype):
    ref_value, ref_grad = _value_and_grad(loss, emb, labels)  # float32
    value, grad = _value_and_grad(loss, emb, labels, dtype)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, ref_value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", [*FLAT, *HIERARCHICAL])
def test_loss_under_autocast_equals_the_float32_loss(name, dtype):
    factory = FLAT.get(name) or HIERARCHICAL[name]
    emb, labels = _inputs(name in HIERARCHICAL)
    _check_equal(_build(factory), emb, labels, dtype)


def test_low_precision_embeddings_are_scored_in_float32():
    emb, labels = _inputs(True)
    loss = _build(HIERARCHICAL["happier"])
    value = loss(emb.bfloat16(), labels)
    ref = loss(emb.bfloat16().float(), labels)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, ref, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["happier_dense", "roadmap"])
def test_compiled_loss_under_autocast_equals_the_float32_loss(name):
    # the first call is the autocast one: the graph (forward and the custom backward) is traced under bfloat16
    factory = FLAT.get(name) or HIERARCHICAL[name]
    emb, labels = _inputs(name in HIERARCHICAL)
    eager = _build(factory)
    compiled = _build(factory)
    compiled.compile()
    ref_value, ref_grad = _value_and_grad(eager, emb, labels)
    value, grad = _value_and_grad(compiled, emb, labels, torch.bfloat16)
    torch.testing.assert_close(value, ref_value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_compiled_loss_inside_the_training_module_under_autocast():
    # the recipe's path: Trainer._step runs LossModule under accelerator.autocast(), the loss compiled in place
    emb, labels = _inputs(True)
    torch.manual_seed(0)
    net = torch.nn.Linear(D, D)
    loss = _build(HIERARCHICAL["happier_dense"])
    loss.compile()
    module = LossModule(net, loss, hierarchical_labels=True)
    ref_loss = _build(HIERARCHICAL["happier_dense"])
    x = emb.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = module(x, labels)
    grads = torch.autograd.grad(value, [net.weight])
    # reference: the same bfloat16 network output, the loss in float32 eagerly
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    ref_value = ref_loss(out.float(), labels)
    ref_grads = torch.autograd.grad(ref_value, [net.weight])
    torch.testing.assert_close(value, ref_value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grads[0], ref_grads[0], rtol=1e-3, atol=1e-5)
