"""The ``kernel=`` option of the rank losses: dense ≡ sorted (values and gradients), validation, the auto rule,
no host synchronisation in the dense kernel, and ``torch.compile`` without graph breaks."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from _helpers import profiled_ops
from pytorch_metric_learning.reducers import DoNothingReducer

from pml_suprank import losses
from pml_suprank.memory import CrossBatchMemory
from pml_suprank.ranking import KERNELS, SupRankStep, choose_kernel
from pml_suprank.ranking.dense import (
    CPU_DENSE_MAX_WORK,
    DENSE_MEMORY_BUDGET,
    dense_block_size,
    dense_query_ranks,
)
from pml_suprank.ranking.dense_hierarchical import dense_hierarchical_query_ranks, dense_hierarchical_ranks

FLAT = {
    "SmoothAP": lambda **kw: losses.SmoothAPLoss(**kw),
    "SupAP": lambda **kw: losses.SupAPLoss(**kw),
    "SupAP_inat": lambda **kw: losses.SupAPLoss(start=0.0, offset=1.0, **kw),
    "SupRecall": lambda **kw: losses.SupRecallLoss(k=(1, 2, 4), **kw),
    "ROADMAP": lambda **kw: losses.ROADMAPLoss(**kw),
    "RODRecall": lambda **kw: losses.RODRecallLoss(k=(1, 3), **kw),
}
HIERARCHICAL = {
    "SupHAP": lambda **kw: losses.SupHAPLoss(**kw),
    "SupNDCG": lambda **kw: losses.SupNDCGLoss(**kw),
    "HAPPIER": lambda **kw: losses.HAPPIERLoss(num_classes=64, embedding_size=8, **kw),
    "RODNDCG": lambda **kw: losses.RODNDCGLoss(num_classes=64, embedding_size=8, **kw),
}


def _ap(rank_plus, rank, pos):
    """Per-query mean of ``rank⁺ / rank`` over the positives (0 without any)."""
    return (rank_plus / rank * pos).sum(1) / pos.sum(1).clamp(min=1.0)


def _naive_ranks(kernel, s, pos, other, param):
    """``(rank⁺, rank)`` by plain autograd over every ``t[q, i, j] = s_qj − s_qi`` (``j = i`` included, then its
    ``H(0)``, resp. ``σ(0)``, removed from the positive sum): the definitions the dense kernel must reproduce."""
    t = s[:, None, :] - s[:, :, None]
    if kernel == "suprank":
        rank_plus = 1.0 + ((t >= 0).to(s.dtype) * pos[:, None, :]).sum(2) - pos
        return rank_plus, rank_plus + (param.value(t) * other[:, None, :]).sum(2)
    sig = torch.sigmoid(t / param)
    return 1.0 + (sig * pos[:, None, :]).sum(2) - 0.5 * pos, 1.0 + (sig * other[:, None, :]).sum(2) - 0.5 * other


def _data(seed: int, batch: int = 14, refs: int | None = None, dim: int = 8):
    g = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=1)
    emb[3] = emb[5]  # an exact tie
    emb[7] = emb[2]
    labels = torch.randint(0, 4, (batch,), generator=g)
    labels[0] = 99  # a query without any positive
    if refs is None:
        return emb, labels, None, None
    ref = F.normalize(torch.randn(refs, dim, generator=g, dtype=torch.float64), dim=1)
    ref[4] = emb[1]  # a reference tied with a query's positive
    ref_labels = torch.randint(0, 4, (refs,), generator=g)
    return emb, labels, ref, ref_labels


def _run(make, kernel: str, emb, labels, ref=None, ref_labels=None, **call):
    torch.manual_seed(0)  # proxies of the combined losses
    loss_fn = make(kernel=kernel).to(torch.float64)
    e = emb.clone().requires_grad_(True)
    r = None if ref is None else ref.clone().requires_grad_(True)
    kwargs = {} if ref is None else {"ref_emb": r, "ref_labels": ref_labels}
    loss = loss_fn(e, labels, **call, **kwargs)
    loss.backward()
    return loss.detach(), e.grad, None if r is None else r.grad


def _assert_same(make, emb, labels, ref=None, ref_labels=None, **call):
    dense = _run(make, "dense", emb, labels, ref, ref_labels, **call)
    sorted_ = _run(make, "sorted", emb, labels, ref, ref_labels, **call)
    for a, b in zip(dense, sorted_, strict=True):
        if a is None:
            assert b is None
            continue
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    assert dense[1].abs().sum() > 0  # the gradient is not trivially zero


@pytest.mark.parametrize("name", list(FLAT))
@pytest.mark.parametrize("include_self", [False, True])
def test_dense_equals_sorted_in_batch(name, include_self):
    emb, labels, _, _ = _data(0)
    _assert_same(lambda **kw: FLAT[name](include_self=include_self, **kw), emb, labels)


@pytest.mark.parametrize("name", list(FLAT))
def test_dense_equals_sorted_with_memory_reference(name):
    emb, labels, ref, ref_labels = _data(1, batch=9, refs=23)
    _assert_same(FLAT[name], emb, labels, ref, ref_labels)


@pytest.mark.parametrize("name", ["SmoothAP", "SupAP", "SupRecall"])
@pytest.mark.parametrize("form", ["pairs", "triplets"])
def test_dense_equals_sorted_with_indices_tuple(name, form):
    emb, labels, _, _ = _data(2)
    g = torch.Generator().manual_seed(5)
    a, p, n = (torch.randint(0, len(labels), (40,), generator=g) for _ in range(3))
    indices = (a, p, n) if form == "triplets" else (a, p, a.flip(0), n)
    _assert_same(FLAT[name], emb, labels, indices_tuple=indices)


@pytest.mark.parametrize("name", ["SmoothAP", "SupAP", "SupRecall"])
def test_dense_per_query_losses_and_kept_rows_match(name):
    emb, labels, _, _ = _data(3)
    out = {}
    for kernel in ("dense", "sorted"):
        loss_fn = FLAT[name](kernel=kernel, reducer=DoNothingReducer())
        out[kernel] = loss_fn(emb, labels)["loss"]
    assert torch.equal(out["dense"]["indices"], out["sorted"]["indices"])
    assert 0 not in out["dense"]["indices"].tolist()  # the query without a positive is dropped
    torch.testing.assert_close(out["dense"]["losses"], out["sorted"]["losses"], atol=1e-9, rtol=0)


def test_no_query_with_a_positive_gives_a_connected_zero():
    emb = F.normalize(torch.randn(5, 4, dtype=torch.float64), dim=1).requires_grad_(True)
    loss = losses.SupAPLoss(kernel="dense")(emb, torch.arange(5))
    loss.backward()
    assert float(loss.detach()) == 0.0 and emb.grad is not None


@pytest.mark.parametrize("kernel", ["suprank", "smooth_ap"])
def test_blocked_dense_ranks_equal_one_block(kernel):
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(9, 11, generator=g, dtype=torch.float64)
    pos = (torch.rand(9, 11, generator=g) < 0.3).double()
    other = 1.0 - pos if kernel == "suprank" else torch.ones_like(pos)
    param = SupRankStep(offset=1.44) if kernel == "suprank" else 0.05
    results = []
    for budget in (DENSE_MEMORY_BUDGET, 2 * 4 * 11 * 11 * 8):  # one block; blocks of 2 queries (checkpointed)
        s = scores.clone().requires_grad_(True)
        rank_plus, rank = dense_query_ranks(kernel, s, pos, other, param, memory_budget=budget)
        _ap(rank_plus, rank, pos).sum().backward()
        results.append((rank_plus.detach(), rank.detach(), s.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_dense_block_size_fits_the_budget():
    assert dense_block_size(256, 256, 4) == 256
    b = dense_block_size(4096, 1024, 4)
    assert 4 * b * 1024 * 1024 * 4 <= DENSE_MEMORY_BUDGET < 4 * (b + 1) * 1024 * 1024 * 4
    assert dense_block_size(10, 100_000, 8) == 1  # a single query never fits: one query per block
    with pytest.raises(ValueError, match="memory_budget"):
        dense_block_size(4, 4, 4, memory_budget=0)


def test_dense_query_ranks_rejects_unknown_kernel():
    with pytest.raises(ValueError, match="kernel must be 'suprank' or 'smooth_ap'; got 'ndcg'"):
        dense_query_ranks("ndcg", torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2), 0.1)


# ------------------------------------------------------------------------------------------------ the option
@pytest.mark.parametrize("name", list(FLAT))
def test_kernel_option_is_validated_and_mirrored(name):
    for kernel in KERNELS:
        assert FLAT[name](kernel=kernel).kernel == kernel
    assert FLAT[name]().kernel == "auto"
    with pytest.raises(ValueError, match=r"kernel in \('auto', 'dense', 'sorted'\); got kernel='fast'"):
        FLAT[name](kernel="fast")


@pytest.mark.parametrize("name", list(HIERARCHICAL))
def test_hierarchical_kernel_option_is_validated(name):
    for kernel in KERNELS:
        assert HIERARCHICAL[name](kernel=kernel).kernel == kernel
    assert HIERARCHICAL[name]().kernel == "auto"
    with pytest.raises(ValueError, match=r"kernel in \('auto', 'dense', 'sorted'\); got kernel='fast'"):
        HIERARCHICAL[name](kernel="fast")


class _SortedOnlyLoss(losses.BaseRankLoss):
    """A third-party rank loss that implements no dense kernel (the base's default ``kernels``)."""

    def compute_query_losses(self, inputs):
        ap, kept = losses.SupAPLoss(kernel="sorted").query_ap(inputs)
        return 1.0 - ap, kept


def test_a_loss_without_dense_kernel_rejects_dense_by_name():
    emb, labels, _, _ = _data(0)
    assert _SortedOnlyLoss(kernel="sorted")(emb, labels) > 0
    with pytest.raises(
        ValueError, match=r"_SortedOnlyLoss supports kernel in \('auto', 'sorted'\); got kernel='dense'"
    ):
        _SortedOnlyLoss(kernel="dense")


def _levels_data(seed: int, batch: int = 14, refs: int | None = None, num_levels: int = 2):
    emb, fine, ref, ref_fine = _data(seed, batch, refs)
    fine = fine % 6
    fine[0] = 50  # a query whose fine and coarse classes appear nowhere else

    def table(f):
        cols = [f, f // 2, f // 4][:num_levels]
        return torch.stack(cols, 1)

    return emb, table(fine), ref, None if ref is None else table(ref_fine % 6)


@pytest.mark.parametrize("name", list(HIERARCHICAL))
@pytest.mark.parametrize("include_self", [False, True])
def test_hierarchical_dense_equals_sorted_in_batch(name, include_self):
    emb, labels, _, _ = _levels_data(10)
    _assert_same(lambda **kw: HIERARCHICAL[name](include_self=include_self, **kw), emb, labels)


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: losses.SupHAPLoss(with_hrank=True, **kw),
        lambda **kw: losses.SupHAPLoss(with_hrank=True, tau=0.05, delta=0.1, start=0.0, offset=1.0, **kw),
        lambda **kw: losses.SupHAPLoss(level_weights=[1.0, 0.3, 0.1], **kw),
        lambda **kw: losses.SupNDCGLoss(**kw),
    ],
    ids=["hrank", "hrank_inat", "level_weights", "ndcg"],
)
def test_hierarchical_dense_equals_sorted_three_levels_and_memory(make):
    emb, labels, ref, ref_labels = _levels_data(11, batch=9, refs=26, num_levels=3)
    _assert_same(make, emb, labels)
    _assert_same(make, emb, labels, ref, ref_labels)


@pytest.mark.parametrize("name", ["SupHAP", "SupNDCG"])
def test_hierarchical_dense_equals_sorted_with_indices_tuple(name):
    emb, labels, _, _ = _levels_data(12)
    g = torch.Generator().manual_seed(3)
    a, p, n = (torch.randint(0, len(labels), (40,), generator=g) for _ in range(3))
    _assert_same(HIERARCHICAL[name], emb, labels, indices_tuple=(a, p, n))


def test_blocked_hierarchical_ranks_equal_one_block():
    emb, labels, _, _ = _levels_data(13, num_levels=3)
    scores = emb @ emb.t()
    levels = (labels.unsqueeze(1) == labels.unsqueeze(0)).sum(2)  # shared ancestors: a level in {0..3}
    valid = ~torch.eye(len(labels), dtype=torch.bool)
    rel = torch.rand(len(labels), 4, dtype=torch.float64)
    step, hrank = SupRankStep(offset=1.44), losses.SupHAPLoss().hrank
    results = []
    for budget in (DENSE_MEMORY_BUDGET, 3 * 10 * 14 * 14 * 8):  # one block; blocks of 3 queries (checkpointed)
        s = scores.clone().requires_grad_(True)
        rank, rank_plus = dense_hierarchical_query_ranks(s, levels, rel, valid, step, hrank, memory_budget=budget)
        (rank_plus / rank).sum().backward()
        results.append((rank.detach(), rank_plus.detach(), s.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_choose_kernel_cost_rule():
    assert choose_kernel("dense", "cpu", 10**6, 10**6) == "dense"
    assert choose_kernel("sorted", "cuda", 2, 2) == "sorted"
    assert choose_kernel("auto", "cpu", 16, 16) == "dense"
    assert choose_kernel("auto", torch.device("cpu"), 256, 60_000) == "sorted"
    n = int((CPU_DENSE_MAX_WORK // 64) ** 0.5)
    assert choose_kernel("auto", "cpu", 64, n) == "dense"
    assert choose_kernel("auto", "cpu", 64, n + 1) == "sorted"
    assert choose_kernel("auto", "cuda", 256, 256) == "dense"  # CUDA: tests/ranking/test_choose_kernel_costs.py
    assert choose_kernel("auto", "cuda:0", 4, 4097) == "sorted"
    with pytest.raises(ValueError, match="kernel must be one of"):
        choose_kernel("Dense", "cpu", 2, 2)


def test_auto_follows_the_rule_on_cpu(monkeypatch):
    emb, labels, ref, ref_labels = _data(6, batch=8, refs=30)
    loss_fn = losses.SupAPLoss()
    inputs = loss_fn.rank_inputs(emb, labels, None, ref, ref_labels)
    assert loss_fn.resolved_kernel(inputs) == ("dense" if 8 * 30 * 30 <= CPU_DENSE_MAX_WORK else "sorted")
    monkeypatch.setattr("pml_suprank.losses.base_rank_loss.choose_kernel", lambda *a, **k: "sorted")
    assert loss_fn.resolved_kernel(inputs) == "sorted"


# ------------------------------------------------------------------------------------------------ host syncs
@pytest.mark.parametrize("kernel", ["suprank", "smooth_ap"])
def test_dense_kernel_has_no_host_synchronisation(kernel):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 64, generator=g).requires_grad_(True)
    pos = (torch.rand(64, 64, generator=g) < 0.1).float()
    other = 1.0 - pos if kernel == "suprank" else torch.ones_like(pos)
    param = SupRankStep(offset=1.4933) if kernel == "suprank" else 0.01

    def step():
        rank_plus, rank = dense_query_ranks(kernel, scores, pos, other, param)
        (1.0 - _ap(rank_plus, rank, pos)).sum().backward()

    top, syncs = profiled_ops(step)
    assert syncs == []
    assert len(top) <= 70  # kernel + AP reduction + backward (about 55 of them are the kernel's)


@pytest.mark.parametrize("kernel", ["suprank", "smooth_ap"])
def test_explicit_gradient_equals_autograd_of_the_values(kernel):
    g = torch.Generator().manual_seed(8)
    scores = torch.randn(5, 9, generator=g, dtype=torch.float64) * 0.05  # all branches of H⁻ (δ = 0.05)
    scores[0, 1] = scores[0, 2]  # a tie
    pos = (torch.rand(5, 9, generator=g) < 0.4).double()
    other = 1.0 - pos if kernel == "suprank" else torch.ones_like(pos)
    param = SupRankStep(tau=0.02, offset=1.3) if kernel == "suprank" else 0.02
    weights = torch.rand(5, 9, generator=g, dtype=torch.float64)
    grads = []
    for fn in ("explicit", "autograd"):
        s = scores.clone().requires_grad_(True)
        if fn == "explicit":
            rank_plus, rank = dense_query_ranks(kernel, s, pos, other, param)
        else:
            rank_plus, rank = _naive_ranks(kernel, s, pos, other, param)
        extra = (rank_plus * weights.flip(0)).sum() if kernel == "smooth_ap" else 0.0
        ((rank * weights).sum() + extra).backward()
        grads.append(s.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["SmoothAP", "SupAP", "ROADMAP"])
def test_dense_equals_sorted_inside_cross_batch_memory(name):
    emb, labels, _, _ = _data(9, batch=10)
    results = []
    for kernel in ("dense", "sorted"):
        torch.manual_seed(0)
        xbm = CrossBatchMemory(FLAT[name](kernel=kernel), embedding_size=8, memory_size=25).to(torch.float64)
        grads = []
        for step in range(3):  # fills the memory: later calls rank against earlier batches
            e = (emb.roll(step, 0) + 0.01 * step).requires_grad_(True)
            loss = xbm(e, labels.roll(step, 0))
            loss.backward()
            grads.append((loss.detach(), e.grad))
        results.append(grads)
    for (la, ga), (lb, gb) in zip(*results, strict=True):
        torch.testing.assert_close(la, lb, atol=1e-9, rtol=0)
        torch.testing.assert_close(ga, gb, atol=1e-9, rtol=0)


def _hierarchical_block(seed: int = 0, batch: int = 48):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, batch, generator=g)
    levels = torch.randint(0, 3, (batch, batch), generator=g)
    valid = torch.rand(batch, batch, generator=g) > 0.1
    rel = torch.rand(batch, 3, generator=g)
    return scores, levels, valid, rel


def test_dense_hierarchical_kernel_has_no_host_synchronisation():
    scores, levels, valid, rel = _hierarchical_block()
    scores.requires_grad_(True)
    step, hrank = SupRankStep(offset=1.4933), losses.SupHAPLoss().hrank

    def step_fn():
        rank, rank_plus = dense_hierarchical_query_ranks(scores, levels, rel, valid, step, hrank)
        (rank_plus / rank).sum().backward()

    top, syncs = profiled_ops(step_fn)
    assert syncs == []
    assert len(top) <= 120


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler for inductor")
def test_dense_hierarchical_core_compiles_without_graph_breaks():
    scores, levels, valid, rel = _hierarchical_block(batch=8)
    scores = scores.double()
    args = (levels, rel.double(), valid, SupRankStep(offset=1.44), losses.SupHAPLoss().hrank)
    explained = torch._dynamo.explain(dense_hierarchical_ranks)(scores, *args)
    assert explained.graph_break_count == 0
    compiled = torch.compile(dense_hierarchical_ranks, backend="inductor", fullgraph=True)
    results = []
    for fn in (compiled, dense_hierarchical_ranks):
        s = scores.clone().requires_grad_(True)
        rank, rank_plus = fn(s, *args)
        (rank_plus / rank).sum().backward()
        results.append((rank.detach(), rank_plus.detach(), s.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-12)
