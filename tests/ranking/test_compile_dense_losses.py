"""Every loss with a dense kernel compiles with ``torch.compile(fullgraph=True)`` — one graph, no break — and the
compiled call equals the eager one (value and gradient). Run on both ends of the supported torch range (``.ci/run``'s
second venv holds the oldest): a graph break there (``bool(dict)`` under torch 2.11, ``Tensor.is_complex()`` under
2.1) fails here. The ``aot_eager`` backend traces forward and backward (dynamo + AOT autograd) without building C++
kernels, so the whole file takes seconds; the inductor compile is tested in ``tests/losses/test_*_dense_ops.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pml_suprank import losses

FLAT = ("SupAPLoss", "SmoothAPLoss", "ROADMAPLoss", "SupRecallLoss", "RODRecallLoss")
HIERARCHICAL = ("SupHAPLoss", "HAPPIERLoss", "SupNDCGLoss", "RODNDCGLoss")
WITH_HEAD = ("HAPPIERLoss", "RODNDCGLoss", "RODRecallLoss")  # a proxy classifier: num_classes / embedding_size


def _make(name: str, dim: int):
    kwargs = {"kernel": "dense"}
    if name in WITH_HEAD:
        kwargs.update(num_classes=8, embedding_size=dim)
    return getattr(losses, name)(**kwargs)


def _batch(name: str, batch: int = 32, dim: int = 16):
    g = torch.Generator().manual_seed(0)
    emb = F.normalize(torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=1)
    fine = torch.arange(batch) // 4
    labels = torch.stack([fine, fine // 2], 1) if name in HIERARCHICAL else fine
    return emb, labels


@pytest.mark.parametrize("memory", [False, True], ids=["in-batch", "memory"])
@pytest.mark.parametrize("name", FLAT + HIERARCHICAL)
def test_dense_loss_compiles_as_one_graph_and_matches_eager(name, memory):
    torch._dynamo.reset()
    emb, labels = _batch(name)
    loss_fn = _make(name, emb.shape[1]).double()
    kwargs = {}
    if memory:
        ref, ref_labels = _batch(name, batch=48)
        kwargs = {"ref_emb": ref[8:] * 0.5 + ref[:40] * 0.5, "ref_labels": ref_labels[:40]}
    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    x = emb.clone().requires_grad_(True)
    value = compiled(x, labels, **kwargs)
    value.backward()
    grad = x.grad
    x_eager = emb.clone().requires_grad_(True)
    expected = loss_fn(x_eager, labels, **kwargs)
    expected.backward()
    assert torch.isfinite(value) and 0.0 < float(value.detach()) < 2.0
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, x_eager.grad, rtol=1e-10, atol=1e-12)
    again = compiled(emb, labels, **kwargs)  # a second call reuses the graph
    torch.testing.assert_close(again, expected.detach(), rtol=1e-12, atol=1e-12)


def test_sup_recall_cut_offs_are_built_once():
    """No host-to-device copy of ``k`` per call: the cut-offs are a buffer that follows the loss, and a copy made
    once per other device (``meta`` stands for an accelerator here)."""
    loss_fn = losses.SupRecallLoss(k=(1, 4))
    assert "k_values" not in loss_fn.state_dict()  # not persistent: checkpoints are unchanged
    assert loss_fn.k_tensor(torch.zeros(3)) is loss_fn.k_values
    assert loss_fn.k_tensor(torch.zeros(3, dtype=torch.float64)).tolist() == [1.0, 4.0]
    meta = torch.zeros(3, device="meta")
    first = loss_fn.k_tensor(meta)
    assert first.device.type == "meta" and loss_fn.k_tensor(meta) is first
    moved = loss_fn.to("meta")
    assert moved.k_tensor(meta) is moved.k_values
