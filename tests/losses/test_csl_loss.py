"""Tests of CSLLoss (the hierarchical proxy baseline of HAPPIER/SupRank, as the SupRank reference code computes it)."""

from __future__ import annotations

import math

import pytest
import torch
from _hierarchical_helpers import TABLE, batch, run_case

from pml_suprank import losses
from pml_suprank.relevance import Hierarchy


@pytest.mark.parametrize("fine_only", [False, True])
def test_golden(dtype, fine_only):
    def make(labels):
        hierarchy = Hierarchy.from_labels(labels) if fine_only else None
        return losses.CSLLoss(7, 8, margins=(0.25, 0.35, 0.45), scale=32.0, hierarchy=hierarchy)

    run_case("B_b16_L3_singletons/CSL", make, dtype, fine_only=fine_only)


def test_hand_computed():
    """Two fine classes under one coarse class, one embedding; proxies along the axes."""
    loss_fn = losses.CSLLoss(3, 2, margins=(0.1, 0.2), scale=2.0, hierarchy=torch.tensor([[0, 0], [1, 0], [2, 1]]))
    loss_fn.proxies.data = torch.tensor([[1.0, 0.0], [0.0, 3.0], [-1.0, 0.0]])  # normalised inside
    emb = torch.tensor([[0.6, 0.8]])
    s = [2 * 0.6, 2 * 0.8, 2 * -0.6]  # scale · <e, p̂>
    level0 = math.log1p(math.exp(math.log(math.exp(s[1]) + math.exp(s[2])) - s[0] + 2 * 0.1))
    level1 = math.log1p(math.exp(s[2] - s[0] + 2 * 0.2))  # only proxy 2 has another coarse label
    assert loss_fn(emb, torch.tensor([0])).item() == pytest.approx(level0 + level1, rel=1e-6)


def test_gradcheck_float64():
    emb, fine = batch(0, n=8, d=4)
    loss_fn = losses.CSLLoss(6, 4, scale=4.0, hierarchy=TABLE).double()
    x = emb.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, fine), (x,), eps=1e-6, atol=1e-6)
    loss_fn(emb, fine).backward()
    assert loss_fn.proxies.grad is not None and loss_fn.proxies.grad.abs().sum() > 0


def test_labels_registered_from_2d_batches():
    emb, fine = batch(1, n=16)
    loss_fn = losses.CSLLoss(6, 8).double()
    assert (loss_fn.proxy_labels == -1).all()
    value = loss_fn(emb, TABLE[fine])
    seen = torch.unique(fine)
    assert torch.equal(loss_fn.proxy_labels[seen], TABLE[seen])
    with_table = losses.CSLLoss(6, 8, hierarchy=TABLE).double()
    with_table.proxies.data = loss_fn.proxies.data.clone()
    loss_fn.register_labels(TABLE)  # now every proxy is known: same result as with the table
    assert loss_fn(emb, TABLE[fine]).item() == pytest.approx(with_table(emb, fine).item(), abs=1e-12)
    assert torch.isfinite(value)
    with pytest.raises(ValueError, match="registered before"):
        loss_fn.register_labels(torch.tensor([[0, 1, 0]]))


def test_no_other_proxy_at_a_level_contributes_zero():
    loss_fn = losses.CSLLoss(2, 2, margins=(0.1, 0.2), scale=2.0, hierarchy=torch.tensor([[0, 0], [1, 0]]))
    x = torch.tensor([[0.6, 0.8]], requires_grad=True)
    loss = loss_fn(x, torch.tensor([0]))
    loss.backward()
    assert torch.isfinite(x.grad).all()  # coarse level: no proxy with another label, term 0 and finite grads


def test_bad_input():
    with pytest.raises(ValueError, match="margins"):
        losses.CSLLoss(4, 8, margins=())
    with pytest.raises(ValueError, match="scale"):
        losses.CSLLoss(4, 8, scale=0.0)
    with pytest.raises(ValueError, match="margins has 3 entries but the hierarchy has 2"):
        losses.CSLLoss(4, 8, hierarchy=torch.tensor([[0, 0], [1, 0]]))
    with pytest.raises(TypeError, match="unknown"):
        losses.CSLLoss(4, 8, unknown=1)
    emb, fine = batch(2, n=6)
    loss_fn = losses.CSLLoss(6, 8).double()
    with pytest.raises(ValueError, match="2 levels but margins has 3"):
        loss_fn(emb, TABLE[fine][:, :2])
    with pytest.raises(ValueError, match="not a tree"):
        loss_fn(emb, torch.tensor([[0, 0, 0], [0, 1, 0], [1, 1, 0], [2, 1, 0], [3, 2, 1], [4, 2, 1]]))
    with pytest.raises(ValueError, match="num_classes"):
        losses.CSLLoss(3, 8).double()(emb, TABLE[torch.tensor([0, 1, 2, 0, 1, 5])])
    with pytest.raises(ValueError, match="not in the hierarchy"):
        losses.CSLLoss(3, 8, hierarchy=TABLE[:3]).double()(emb, torch.tensor([0, 1, 2, 0, 1, 5]))
    with pytest.raises(ValueError, match="ref_emb"):
        loss_fn(emb, TABLE[fine], ref_emb=emb, ref_labels=TABLE[fine])


def test_indices_tuple_out_of_range_is_a_value_error():
    """An indices_tuple naming rows outside the batch: ValueError naming it, not PML's IndexError."""
    fine = torch.tensor([0, 0, 1, 1])
    pairs = (torch.tensor([0]), torch.tensor([99]), torch.tensor([9]), torch.tensor([2]))
    with pytest.raises(ValueError, match="indices_tuple"):
        losses.CSLLoss(2, 4, margins=(0.2, 0.3))(torch.randn(4, 4), torch.stack([fine, fine // 2], 1), pairs)
