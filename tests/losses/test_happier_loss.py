"""Tests of HAPPIERLoss ((1 − λ)·Sup-H-AP + λ·ClusterLoss, SupRank Eq. 22)."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_helpers import SOP, TABLE, batch, raw_dot, run_case

from pml_suprank import losses
from pml_suprank.relevance import Hierarchy


@pytest.mark.parametrize("fine_only", [False, True])
def test_golden_total(dtype, fine_only):
    def make(labels):
        hierarchy = Hierarchy.from_labels(labels) if fine_only else None
        return losses.HAPPIERLoss(4, 8, hierarchy=hierarchy, include_self=True, distance=raw_dot(), **SOP)

    run_case("A_b12_L2/HAPPIER_total", make, dtype, fine_only=fine_only)


def test_is_the_weighted_sum_of_its_parts():
    emb, fine = batch(0, n=24)
    labels = TABLE[fine]
    happier = losses.HAPPIERLoss(num_classes=6, embedding_size=8, alpha=5.0, with_hrank=True).double()
    hap = losses.SupHAPLoss(alpha=5.0, with_hrank=True)(emb, labels)
    cluster = happier.decomposability_loss(emb, labels[:, 0])
    total = happier(emb, labels)
    assert total.item() == pytest.approx(0.9 * hap.item() + 0.1 * cluster.item(), abs=1e-12)
    assert set(happier.sub_loss_names()) >= {"rank_loss", "decomposability_loss"}
    assert [n for n, _ in happier.named_parameters()] == ["decomposability_loss.proxies"]


def test_proxies_receive_gradient_and_1d_path_matches():
    emb, fine = batch(1, n=24)
    torch.manual_seed(0)
    a = losses.HAPPIERLoss(6, 8).double()
    b = losses.HAPPIERLoss(6, 8, hierarchy=TABLE).double()
    b.load_state_dict(a.state_dict())
    la, lb = a(emb, TABLE[fine]), b(emb, fine)
    assert la.item() == lb.item()
    la.backward()
    assert a.decomposability_loss.proxies.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="decomposability_weight"):
        losses.HAPPIERLoss(4, 8, decomposability_weight=1.5)
    with pytest.raises(ValueError, match="alpha"):
        losses.HAPPIERLoss(4, 8, alpha=-2.0)
    with pytest.raises(TypeError, match="decomposability"):
        losses.HAPPIERLoss(4, 8, decomposability="calibration")
    with pytest.raises(ValueError, match="num_classes"):
        losses.HAPPIERLoss(0, 8)
