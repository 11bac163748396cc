"""Issue 13's accelerator contract for the flat rank losses on the dense kernel: operator and host-sync counts of one
forward+backward (torch.profiler on the CPU), and the exactness of the pieces that made them small — the score
matrix with its explicit backward, the fused per-query AP, the kept-query mean and the sync-free calibration term."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from _helpers import profiled_ops
from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity
from pytorch_metric_learning.reducers import AvgNonZeroReducer, MeanReducer

from pml_suprank import losses
from pml_suprank._similarity import similarity_scores
from pml_suprank.ranking import SupRankStep
from pml_suprank.ranking.dense import dense_query_ap, dense_query_ranks

# measured at B = 256 in-batch (4 items per class), one fwd+bwd, kernel="dense"; the target is <= 60 for
# these three (not reached: see the README's kernel section for where the remaining operators go)
OP_BOUNDS = {"SupAP": 86, "SmoothAP": 80, "ROADMAP": 124, "SupRecall": 126}  # measured 84 / 77 / 121 / 123
MAKERS = {
    "SupAP": lambda: losses.SupAPLoss(kernel="dense"),
    "SmoothAP": lambda: losses.SmoothAPLoss(kernel="dense"),
    "ROADMAP": lambda: losses.ROADMAPLoss(kernel="dense"),
    "SupRecall": lambda: losses.SupRecallLoss(kernel="dense"),
}


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.slow
def test_dense_loss_at_b256_has_no_host_sync_and_few_ops(name):
    emb = F.normalize(torch.randn(256, 32, generator=torch.Generator().manual_seed(0)), dim=1).requires_grad_(True)
    labels = torch.arange(256) // 4
    loss_fn = MAKERS[name]()
    top, syncs = profiled_ops(lambda: loss_fn(emb, labels).backward())
    assert syncs == []
    assert "aten::_assert_async" in top  # the finiteness check is there, asynchronous
    assert len(top) <= OP_BOUNDS[name], len(top)


def test_sorted_kernel_reads_the_device_once_dense_never():  # the contrast the dense path exists for
    emb = F.normalize(torch.randn(64, 16), dim=1).requires_grad_(True)
    reads = {}
    for kernel in ("sorted", "dense"):
        loss_fn = losses.SupAPLoss(kernel=kernel)
        _, reads[kernel] = profiled_ops(lambda fn=loss_fn: fn(emb, torch.arange(64) // 4).backward(), host_reads=True)
    assert reads == {"sorted": ["tolist"], "dense": []}  # sorted: the per-query pair counts (positive_pair_groups)


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_non_finite_embeddings_still_raise_value_error(kernel):
    emb = torch.randn(8, 4)
    emb[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"embeddings contains NaN or inf values \(in 1 of 8 rows\)"):
        losses.SupAPLoss(kernel=kernel)(emb, torch.arange(8) // 2)
    ref = torch.randn(5, 4)
    ref[0, 0] = float("inf")
    with pytest.raises(ValueError, match="ref_emb contains NaN or inf"):
        losses.SmoothAPLoss(kernel=kernel)(
            torch.randn(8, 4), torch.arange(8) // 2, ref_emb=ref, ref_labels=torch.arange(5)
        )


# ------------------------------------------------------------------------------------------------ score matrix
@pytest.mark.parametrize("same", [True, False])
@pytest.mark.parametrize("distance", [CosineSimilarity(), DotProductSimilarity()], ids=["cosine", "dot"])
def test_similarity_scores_match_pml_values_and_gradients(same, distance):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64)
    x[2] = 0.0  # a zero row: F.normalize's clamp branch
    r = torch.randn(7, 5, generator=g, dtype=torch.float64)
    w = torch.randn(6, 6 if same else 7, generator=g, dtype=torch.float64)
    grads = []
    for fn in (lambda a, b: similarity_scores(distance, a, b), lambda a, b: distance(a, None if same else b)):
        a, b = x.clone().requires_grad_(True), r.clone().requires_grad_(True)
        s = fn(a, a if same else b)
        (s * w).sum().backward()
        grads.append((s.detach(), a.grad, None if same else b.grad))
    for ours, pml in zip(grads[0], grads[1], strict=True):
        if pml is not None:
            torch.testing.assert_close(ours, pml, rtol=1e-12, atol=1e-12)


def test_similarity_scores_gradcheck():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    r = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: similarity_scores(CosineSimilarity(), a, b), (x, r))
    assert torch.autograd.gradcheck(lambda a: similarity_scores(CosineSimilarity(), a, a), (x,))


def test_similarity_scores_defer_to_other_distances():
    class Shifted(CosineSimilarity):
        def compute_mat(self, q, r):
            return super().compute_mat(q, r) + 1.0

    x = torch.randn(3, 4)
    torch.testing.assert_close(similarity_scores(Shifted(), x, x), CosineSimilarity()(x) + 1.0)


# ------------------------------------------------------------------------------------------------ fused AP
@pytest.mark.parametrize("kernel", ["suprank", "smooth_ap"])
@pytest.mark.parametrize("budget", [None, 4 * 8 * 12 * 12 * 2])  # one block / several blocks
def test_dense_query_ap_equals_mean_of_dense_ranks(kernel, budget):
    g = torch.Generator().manual_seed(3)
    s = torch.randn(9, 12, generator=g, dtype=torch.float64).round(decimals=1)  # ties
    pos = (torch.rand(9, 12, generator=g) < 0.3).double()
    pos[4] = 0.0  # a query without positives
    other = 1.0 - pos if kernel == "suprank" else torch.ones_like(pos)
    param = SupRankStep(offset=1.4933) if kernel == "suprank" else 0.05
    kw = {} if budget is None else {"memory_budget": budget}
    weight = torch.randn(9, generator=g, dtype=torch.float64)
    results = []
    for fused in (True, False):
        x = s.clone().requires_grad_(True)
        if fused:
            ap, count = dense_query_ap(kernel, x, pos, other, param, **kw)
        else:
            rank_plus, rank = dense_query_ranks(kernel, x, pos, other, param, **kw)
            count = pos.sum(1)
            ap = (rank_plus / rank * pos).sum(1) / count.clamp(min=1.0)
        (ap * weight).sum().backward()
        results.append((ap.detach(), count, x.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert results[0][0][4] == 0.0 and results[0][2][4].abs().sum() == 0.0


@pytest.mark.parametrize("kernel", ["suprank", "smooth_ap"])
def test_dense_query_ap_gradcheck(kernel):
    g = torch.Generator().manual_seed(4)
    s = (torch.randn(3, 6, generator=g, dtype=torch.float64) * 0.03).requires_grad_(True)
    pos = torch.tensor([[1, 1, 0, 0, 0, 0], [0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 1]], dtype=torch.float64)
    other = 1.0 - pos if kernel == "suprank" else torch.ones_like(pos)
    param = SupRankStep(offset=1.4933) if kernel == "suprank" else 0.05
    assert torch.autograd.gradcheck(lambda x: dense_query_ap(kernel, x, pos, other, param)[0], (s,))


# ------------------------------------------------------------------------------------------------ reductions
class _ExactMean(MeanReducer):  # a MeanReducer subclass: the loss must take the element (nonzero) path
    pass


class _ExactAvgNonZero(AvgNonZeroReducer):
    pass


@pytest.mark.parametrize("name", ["SupAP", "SmoothAP", "SupRecall"])
def test_kept_query_mean_equals_the_element_path(name):
    g = torch.Generator().manual_seed(5)
    emb = torch.randn(12, 6, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 4, 5, 5, 6])  # queries 5, 8, 11 have no positive
    values = []
    for reducer in (None, _ExactMean()):
        kw = {} if reducer is None else {"reducer": reducer}
        loss_fn = {"SupAP": losses.SupAPLoss, "SmoothAP": losses.SmoothAPLoss, "SupRecall": losses.SupRecallLoss}[name](
            kernel="dense", **kw
        )
        x = emb.clone().requires_grad_(True)
        loss = loss_fn(x, labels)
        loss.backward()
        values.append((loss.detach(), x.grad))
    for a, b in zip(*values, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("average", ["active", "all"])
def test_calibration_arithmetic_average_equals_pair_elements(average):
    g = torch.Generator().manual_seed(6)
    emb = torch.randn(10, 5, generator=g, dtype=torch.float64)
    ref = torch.randn(30, 5, generator=g, dtype=torch.float64)
    labels, ref_labels = torch.arange(10) % 3, torch.arange(30) % 4
    exact = _ExactAvgNonZero() if average == "active" else _ExactMean()
    values = []
    for kw in ({}, {"reducer": exact}):
        x, r = emb.clone().requires_grad_(True), ref.clone().requires_grad_(True)
        loss = losses.CalibrationLoss(average=average, **kw)(x, labels, ref_emb=r, ref_labels=ref_labels)
        loss.backward()
        values.append((loss.detach(), x.grad, r.grad))
    for a, b in zip(*values, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    _, syncs = profiled_ops(
        lambda: losses.CalibrationLoss(average=average)(emb, labels, ref_emb=ref, ref_labels=ref_labels)
    )
    assert syncs == []


# ------------------------------------------------------------------------------------------------ torch.compile
COMPILED_OP_BOUND = 60  # issue 13's bound for SupAP / Smooth-AP / ROADMAP at B = 256 (measured: 6-7)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler for inductor")
@pytest.mark.parametrize("name", ["SupAP", "SmoothAP", "ROADMAP"])
def test_compiled_dense_loss_is_one_graph_with_few_ops(name):
    """``torch.compile(loss, fullgraph=True)`` on a dense loss: the whole call (validation, score matrix, masks,
    kernel, PML reducer) is one graph; inductor fuses the elementwise work, leaving a handful of operators."""
    torch._dynamo.reset()
    emb = F.normalize(torch.randn(256, 32, generator=torch.Generator().manual_seed(0)), dim=1).requires_grad_(True)
    labels = torch.arange(256) // 4
    loss_fn = MAKERS[name]()
    compiled = torch.compile(loss_fn, fullgraph=True, backend="inductor")
    value = compiled(emb, labels)
    value.backward()
    grad, emb.grad = emb.grad, None
    expected = loss_fn(emb, labels)
    expected.backward()
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, emb.grad, rtol=1e-4, atol=1e-7)
    top, syncs = profiled_ops(lambda: compiled(emb, labels).backward())
    assert syncs == [] and len(top) <= COMPILED_OP_BOUND, (len(top), top)


def test_normalized_logits_match_autograd_of_f_normalize():
    from pml_suprank._similarity import normalized_logits

    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    p = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, generator=g, dtype=torch.float64)
    (normalized_logits(x, p, 0.05) * w).sum().backward()
    ours = (x.grad.clone(), p.grad.clone())
    x.grad = p.grad = None
    ((x @ F.normalize(p, dim=1).t() / 0.05) * w).sum().backward()
    torch.testing.assert_close(ours[0], x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours[1], p.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: normalized_logits(a, b, 0.5), (x, p))


@pytest.mark.parametrize("fn", [dense_query_ap, dense_query_ranks])
def test_dense_entry_points_name_the_bad_argument(fn):
    s, m = torch.randn(3, 4), torch.zeros(3, 4)
    step = SupRankStep(offset=1.4933)
    with pytest.raises(ValueError, match="kernel must be"):
        fn("ndcg", s, m, m, step)
    with pytest.raises(ValueError, match=r"scores must be a \(B, N\) floating tensor; got shape \(3, 4\), dtype"):
        fn("suprank", s.long(), m, m, step)
    with pytest.raises(ValueError, match=r"positives must be a float mask .* got shape \(3, 5\)"):
        fn("suprank", s, torch.zeros(3, 5), m, step)
    with pytest.raises(ValueError, match="others must be a float mask .* dtype torch.bool"):
        fn("suprank", s, m, m.bool(), step)
