"""Every loss with a dense kernel compiles with ``torch.compile(fullgraph=True)`` — one graph, no break — and the
compiled call equals the eager one (value and gradient). Run on both ends of the supported torch range and on 2.11
(``.ci/run``'s older-torch venvs): a graph break there (``bool(dict)`` under torch 2.11, ``Tensor.is_complex()`` under
2.1) or a wrong compiled gradient (the hierarchical kernel under 2.11's dynamo) fails here. The ``aot_eager``
backend traces forward and backward (dynamo + AOT autograd) without building C++ kernels, so the whole file takes
seconds; the inductor compile is tested in ``tests/losses/test_*_dense_ops.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pml_suprank import losses
from pml_suprank.ranking.dense_hierarchical import dense_sup_hap_scores, dense_sup_ndcg_scores
from pml_suprank.relevance import Hierarchy

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


# the memory variants compile a second graph per loss (~3 s each): in the full suite only
@pytest.mark.slow
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


def _compiled_and_eager(loss_fn, emb, *args, **kwargs):
    """``(value, grad)`` of the compiled (``fullgraph=True``, ``aot_eager``) and of the eager call."""
    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    out = []
    for fn in (compiled, loss_fn):
        x = emb.clone().requires_grad_(True)
        value = fn(x, *args, **kwargs)
        value.backward()
        out.append((value.detach(), x.grad))
    return out


@pytest.mark.parametrize("name", HIERARCHICAL)
@pytest.mark.slow
def test_hierarchical_loss_with_hierarchy_table_compiles_as_one_graph(name):
    """1-D fine labels with ``hierarchy=`` (the path of PML's trainers and memories): the check that every label is
    in the table is an in-graph assert while compiling, not a host read that breaks the graph."""
    emb, labels = _batch(name)
    kwargs = {"kernel": "dense", "hierarchy": Hierarchy.from_labels(labels)}
    if name in WITH_HEAD:
        kwargs.update(num_classes=8, embedding_size=emb.shape[1])
    loss_fn = getattr(losses, name)(**kwargs).double()
    (value, grad), (expected, expected_grad) = _compiled_and_eager(loss_fn, emb, labels[:, 0])
    assert 0.0 < float(expected) < 2.0
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_compiled_loss_still_refuses_a_label_outside_the_hierarchy():
    emb, labels = _batch("SupHAPLoss")
    loss_fn = losses.SupHAPLoss(kernel="dense", hierarchy=Hierarchy.from_labels(labels))
    bad = labels[:, 0].clone()
    bad[3] = 99
    with pytest.raises(ValueError, match="fine label 99, which is not in the hierarchy"):
        loss_fn(emb, bad)
    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    assert float(compiled(emb, labels[:, 0])) > 0.0
    with pytest.raises(RuntimeError, match="not in the hierarchy"):  # the in-graph assert
        compiled(emb, bad)


@pytest.mark.parametrize(
    "case", ["level_weights", "ref_labels_equal_labels"], ids=["level_weights", "ref_labels=labels"]
)
@pytest.mark.slow
def test_dense_loss_options_compile_as_one_graph(case):
    emb, labels = _batch("SupHAPLoss")
    if case == "level_weights":
        loss_fn, args, kwargs = losses.SupHAPLoss(kernel="dense", level_weights=[1.0, 2.0]), (labels,), {}
    else:
        emb, labels = _batch("SupAPLoss")
        loss_fn, args, kwargs = losses.SupAPLoss(kernel="dense"), (labels,), {"ref_labels": labels.clone()}
    (value, grad), (expected, expected_grad) = _compiled_and_eager(loss_fn.double(), emb, *args, **kwargs)
    assert 0.0 < float(expected) < 2.0
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "budget", [2**30, pytest.param(2**20, marks=pytest.mark.slow)], ids=["one-block", "query-blocks"]
)
@pytest.mark.parametrize("kind", ["hap", "hap-hrank", "ndcg"])
def test_fused_hierarchical_scores_are_not_produced_in_place(kind, budget):
    """The output of the fused autograd function is a fresh tensor (version 0): dynamo of torch 2.11 drops the
    gradient of a custom Function output produced by an in-place op (the compiled Sup-H-AP / Sup-NDCG / HAPPIER
    embedding gradient was zero), and the compiled gradient equals eager at 48 items, 2 levels."""
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(48, 48, generator=g, dtype=torch.float64)
    fine = torch.arange(48) // 4
    levels = (fine[:, None] == fine[None, :]).long() + (fine[:, None] // 3 == fine[None, :] // 3).long()
    valid = ~torch.eye(48, dtype=torch.bool)
    relevance = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64).expand(48, 3)
    step = losses.SupHAPLoss().constant_step()  # numeric offset: what the losses pass
    hrank = losses.SupHAPLoss(with_hrank=True).hrank if kind == "hap-hrank" else None

    def score(s):
        if kind == "ndcg":
            return dense_sup_ndcg_scores(s, levels, 2, valid, step, memory_budget=budget)[0]
        return dense_sup_hap_scores(s, levels, relevance, valid, step, hrank, memory_budget=budget)[0]

    x = scores.clone().requires_grad_(True)
    out = score(x)
    assert out._version == 0
    out.sum().backward()
    torch._dynamo.reset()
    y = scores.clone().requires_grad_(True)
    torch.compile(lambda s: score(s).sum(), fullgraph=True, backend="aot_eager")(y).backward()
    assert float(x.grad.abs().max()) > 1e-3
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-10, atol=1e-12)


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
