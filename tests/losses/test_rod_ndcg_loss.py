"""Tests of RODNDCGLoss ((1 − λ)·Sup-NDCG + λ·ClusterLoss, SupRank Eq. 25)."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_helpers import TABLE, batch

from pml_suprank import losses


def test_is_the_weighted_sum_of_its_parts():
    emb, fine = batch(0, n=24)
    x = emb.clone().requires_grad_(True)
    rod = losses.RODNDCGLoss(num_classes=6, embedding_size=8, decomposability_weight=0.25, hierarchy=TABLE).double()
    ndcg = losses.SupNDCGLoss()(emb, TABLE[fine])
    cluster = rod.decomposability_loss(emb, fine)
    total = rod(x, fine)
    assert total.item() == pytest.approx(0.75 * ndcg.item() + 0.25 * cluster.item(), abs=1e-12)
    total.backward()
    assert torch.isfinite(x.grad).all()
    assert rod.decomposability_loss.proxies.grad is not None


def test_bad_arguments():
    with pytest.raises(ValueError, match="decomposability_weight"):
        losses.RODNDCGLoss(4, 8, decomposability_weight=-0.1)
    with pytest.raises(TypeError, match="num_classes"):
        losses.RODNDCGLoss(4, 8, num_classes=3)
