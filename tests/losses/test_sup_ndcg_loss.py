"""Tests of SupNDCGLoss (SupRank Eq. 24)."""

from __future__ import annotations

import math

import pytest
import torch
from _hierarchical_dense import dense_ndcg
from _hierarchical_helpers import SOP, TABLE, NoReduce, batch, raw_dot, run_case

from pml_suprank import losses
from pml_suprank.relevance import level_matrix


@pytest.mark.parametrize("inp_id", ["A_b12_L2", "B_b16_L3_singletons", "C_b12_L2_ties", "D_b8_mem32_L2"])
def test_golden(dtype, inp_id):
    run_case(
        f"{inp_id}/SupNDCG",
        lambda _: losses.SupNDCGLoss(include_self=True, distance=raw_dot(), **SOP),
        dtype,
    )


def test_golden_through_fine_labels_and_hierarchy():
    from pml_suprank.relevance import Hierarchy

    run_case(
        "B_b16_L3_singletons/SupNDCG",
        lambda labels: losses.SupNDCGLoss(
            hierarchy=Hierarchy.from_labels(labels), include_self=True, distance=raw_dot(), **SOP
        ),
        torch.float64,
        fine_only=True,
    )


def test_hand_computed():
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[0.90, 0.0], [0.92, 0.0], [0.10, 0.0]], dtype=torch.float64)
    loss = losses.SupNDCGLoss(distance=raw_dot())(
        q, torch.tensor([[0, 0]]), ref_emb=ref, ref_labels=torch.tensor([[0, 0], [1, 0], [2, 1]])
    )
    sig2 = 1 / (1 + math.exp(-2.0))
    ndcg = (3 / math.log2(2.5 + sig2) + 1 / math.log2(2)) / (3 + 1 / math.log2(3))
    assert loss.item() == pytest.approx(1 - ndcg, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_upper_bound_of_one_minus_ndcg(seed):
    emb, fine = batch(seed, n=40)
    labels = TABLE[fine]
    per_query = losses.SupNDCGLoss(reducer=NoReduce())(emb, labels)
    valid = ~torch.eye(40, dtype=torch.bool)
    true_ndcg = dense_ndcg(emb @ emb.T, level_matrix(labels, labels), 3, valid, exact=True)
    assert bool((per_query >= 1 - true_ndcg - 1e-12).all())


def test_2d_and_1d_paths_identical_and_invariances():
    emb, fine = batch(1, n=30)
    a = losses.SupNDCGLoss()(emb, TABLE[fine])
    b = losses.SupNDCGLoss(hierarchy=TABLE)(emb, fine)
    assert a.item() == b.item()
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(1))
    assert losses.SupNDCGLoss()(emb[perm], TABLE[fine][perm]).item() == pytest.approx(a.item(), abs=1e-12)
    relabelled = TABLE[fine] * 3 + 1
    assert losses.SupNDCGLoss()(emb, relabelled).item() == pytest.approx(a.item(), abs=1e-12)


def test_gradcheck_float64():
    emb, fine = batch(2, n=10, d=4)
    loss_fn = losses.SupNDCGLoss(tau=0.05, rho=10.0)
    x = emb.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, TABLE[fine]), (x,), eps=1e-6, atol=1e-5)


def test_bad_input():
    with pytest.raises(TypeError, match="unknown"):
        losses.SupNDCGLoss(unknown=3)
    with pytest.raises(ValueError, match="rho"):
        losses.SupNDCGLoss(rho=-1.0)
    emb, fine = batch(3, n=6)
    with pytest.raises(ValueError, match="has 2 levels but the hierarchy has 3"):
        losses.SupNDCGLoss(hierarchy=TABLE)(emb, TABLE[fine][:, :2])
