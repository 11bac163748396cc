"""Tests of SupHAPLoss (SupRank Eq. 21 / HAPPIER)."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_dense import dense_hap
from _hierarchical_helpers import SOP, TABLE, NoReduce, batch, raw_dot, run_case
from pytorch_metric_learning.distances import LpDistance

from pml_suprank import losses
from pml_suprank.memory import CrossBatchMemory
from pml_suprank.relevance import Hierarchy, level_counts, level_matrix, pop_relevance


@pytest.mark.parametrize("inp_id", ["A_b12_L2", "B_b16_L3_singletons", "C_b12_L2_ties", "D_b8_mem32_L2"])
@pytest.mark.parametrize("variant", ["SupHAP_alpha1", "SupHAP_alpha5", "SupHAP_withhrank_alpha1"])
def test_golden(dtype, inp_id, variant):
    alpha = 5.0 if "alpha5" in variant else 1.0
    with_hrank = "withhrank" in variant

    def make(_):
        return losses.SupHAPLoss(alpha=alpha, with_hrank=with_hrank, include_self=True, distance=raw_dot(), **SOP)

    run_case(f"{inp_id}/{variant}", make, dtype)


@pytest.mark.parametrize("inp_id", ["B_b16_L3_singletons", "D_b8_mem32_L2"])
def test_golden_through_fine_labels_and_hierarchy(inp_id):
    """The 1-D fine labels + hierarchy path gives the 2-D result."""

    def make(labels):
        return losses.SupHAPLoss(hierarchy=Hierarchy.from_labels(labels), include_self=True, distance=raw_dot(), **SOP)

    run_case(f"{inp_id}/SupHAP_alpha1", make, torch.float64, fine_only=True)


@pytest.mark.parametrize("with_hrank", [False, True])
@pytest.mark.parametrize("include_self", [False, True])
def test_2d_labels_and_hierarchy_are_identical(with_hrank, include_self):
    emb, fine = batch(0)
    e1, e2 = emb.clone().requires_grad_(True), emb.clone().requires_grad_(True)
    l2d = losses.SupHAPLoss(with_hrank=with_hrank, include_self=include_self)(e1, TABLE[fine])
    l1d = losses.SupHAPLoss(hierarchy=TABLE, with_hrank=with_hrank, include_self=include_self)(e2, fine)
    l2d.backward()
    l1d.backward()
    torch.testing.assert_close(l1d, l2d, rtol=0, atol=0)
    torch.testing.assert_close(e1.grad, e2.grad, rtol=0, atol=0)


def test_one_level_equals_sup_ap():
    emb, fine = batch(1)
    e1, e2 = emb.clone().requires_grad_(True), emb.clone().requires_grad_(True)
    hap = losses.SupHAPLoss(alpha=3.0)(e1, fine[:, None])  # (N, 1) labels: an explicit single level
    ap = losses.SupAPLoss()(e2, fine)
    hap.backward()
    ap.backward()
    torch.testing.assert_close(hap, ap, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(e1.grad, e2.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("with_hrank", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_upper_bound_of_one_minus_h_ap(with_hrank, seed):
    """Sup-H-AP ≥ 1 − H-AP per query (H⁻ ≥ H, H_s^> ≤ H); scores have no exact ties."""
    emb, fine = batch(seed, n=40)
    labels = TABLE[fine]
    loss_fn = losses.SupHAPLoss(with_hrank=with_hrank, reducer=NoReduce())
    per_query = loss_fn(emb, labels)
    scores = emb @ emb.T
    valid = ~torch.eye(40, dtype=torch.bool)
    levels = level_matrix(labels, labels)
    rel = pop_relevance(level_counts(levels, 3, mask=valid), 1.0, dtype=torch.float64)
    true_hap = dense_hap(scores, levels, rel, valid, exact=True)
    kept = torch.isfinite(true_hap)
    assert per_query.shape[0] == int(kept.sum())
    assert bool((per_query >= 1 - true_hap[kept] - 1e-12).all())


def test_order_and_relabelling_invariance():
    emb, fine = batch(2, n=30)
    labels = TABLE[fine]
    base = losses.SupHAPLoss(with_hrank=True)(emb, labels)
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(0))
    assert losses.SupHAPLoss(with_hrank=True)(emb[perm], labels[perm]).item() == pytest.approx(base.item(), abs=1e-12)
    relabelled = torch.stack([labels[:, 0] * 7 + 3, 10 - labels[:, 1], labels[:, 2] + 100], dim=1)
    assert losses.SupHAPLoss(with_hrank=True)(emb, relabelled).item() == pytest.approx(base.item(), abs=1e-12)


def test_gradcheck_float64():
    emb, fine = batch(3, n=10, d=4)
    labels = TABLE[fine]
    loss_fn = losses.SupHAPLoss(tau=0.05, rho=10.0, with_hrank=True, hrank_nu=5.0)
    x = emb.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (x,), eps=1e-6, atol=1e-5)


def test_hand_computed_ref_set():
    """One query vs 3 references (levels 2, 1, 0) with scores 0.90, 0.92, 0.10 (see the kernel test)."""
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[0.90, 0.0], [0.92, 0.0], [0.10, 0.0]], dtype=torch.float64)
    labels = torch.tensor([[0, 0]])
    ref_labels = torch.tensor([[0, 0], [1, 0], [2, 1]])
    loss = losses.SupHAPLoss(distance=raw_dot())(q, labels, ref_emb=ref, ref_labels=ref_labels)
    sig2 = 1 / (1 + torch.exp(torch.tensor(-2.0, dtype=torch.float64)))
    expected = 1 - (1.5 / (1.5 + sig2) + 0.5) / 1.5
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)


def test_level_weights_give_property1_relevance():
    emb, fine = batch(4)
    loss_fn = losses.SupHAPLoss(level_weights=[0.2, 0.3, 0.5], reducer=NoReduce())
    per_query = loss_fn(emb, TABLE[fine])
    assert per_query.numel() > 0 and bool(torch.isfinite(per_query).all())
    with pytest.raises(ValueError, match="level_weights has 2 entries"):
        losses.SupHAPLoss(level_weights=[0.5, 0.5])(emb, TABLE[fine])


def test_no_relevant_item_gives_connected_zero():
    emb, _ = batch(5, n=4)
    x = emb.clone().requires_grad_(True)
    labels = torch.stack([torch.arange(4), torch.arange(4)], 1)  # no shared label at any level
    loss = losses.SupHAPLoss()(x, labels)
    assert loss.item() == 0.0
    loss.backward()
    assert x.grad is not None


def test_cross_batch_memory_with_fine_labels():
    """The 1-D path inside CrossBatchMemory: the first call ranks the batch against its own (detached) copy."""
    emb, fine = batch(6, n=16)
    x = emb.clone().requires_grad_(True)
    xbm = CrossBatchMemory(losses.SupHAPLoss(hierarchy=TABLE), embedding_size=8, memory_size=64).to(torch.float64)
    loss = xbm(x, fine)
    direct = losses.SupHAPLoss()(emb, TABLE[fine])
    assert loss.item() == pytest.approx(direct.item(), abs=1e-12)
    loss.backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    emb2, fine2 = batch(7, n=16)
    assert torch.isfinite(xbm(emb2, fine2))


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(alpha=-1.0), ValueError, "alpha"),
        (dict(hrank_mu=1.5), ValueError, "hrank_mu"),
        (dict(hrank_nu=0.0), ValueError, "hrank_nu"),
        (dict(with_hrank="yes"), TypeError, "with_hrank"),
        (dict(level_weights=[0.5, -0.5, 1.0]), ValueError, "non-negative"),
        (dict(unknown_option=1), TypeError, "unknown_option"),
        (dict(distance=LpDistance()), ValueError, "distance"),
        (dict(hierarchy=[[0, 0]]), TypeError, "hierarchy"),
        (dict(tau=0.0), ValueError, "tau"),
    ],
)
def test_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        losses.SupHAPLoss(**kwargs)


def test_bad_labels():
    emb, fine = batch(8, n=6)
    with pytest.raises(ValueError, match="not a tree"):
        losses.SupHAPLoss()(emb, torch.tensor([[0, 0], [0, 1], [1, 1], [2, 1], [3, 0], [3, 0]]))
    with pytest.raises(ValueError, match="has 2 levels but the hierarchy has 3"):
        losses.SupHAPLoss(hierarchy=TABLE)(emb, TABLE[fine][:, :2])
    with pytest.raises(ValueError, match="not in the hierarchy"):
        losses.SupHAPLoss(hierarchy=TABLE)(emb, torch.tensor([0, 1, 2, 3, 4, 99]))
    ref = torch.nn.functional.normalize(torch.randn(3, 8, dtype=torch.float64), dim=1)
    with pytest.raises(ValueError, match="not a tree"):  # queries and references disagree on an ancestor
        losses.SupHAPLoss()(emb, TABLE[fine][:, :2], ref_emb=ref, ref_labels=torch.tensor([[0, 1], [1, 0], [2, 1]]))
    with pytest.raises(ValueError, match="label columns"):
        losses.SupHAPLoss()(emb, TABLE[fine], ref_emb=ref, ref_labels=TABLE[:3, :2])


def test_ranking_memory_fine_and_2d_labels_identical():
    from pml_suprank import memory

    mem_1d = memory.RankingMemory(losses.SupHAPLoss(hierarchy=TABLE), embedding_size=8, memory_size=40)
    mem_2d = memory.RankingMemory(losses.SupHAPLoss(), embedding_size=8, memory_size=40)
    for step in range(3):
        emb, fine = batch(10 + step, n=16)
        a, b = mem_1d(emb.float(), fine), mem_2d(emb.float(), TABLE[fine])
        assert torch.isfinite(a) and a.item() == pytest.approx(b.item(), abs=1e-6)
