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


@pytest.mark.slow
def test_pml_trainer_with_fine_labels():
    """PML trainers pass 1-D labels: HAPPIER with hierarchy= trains the trunk and its proxies."""
    import logging

    from pytorch_metric_learning import trainers

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.y = torch.arange(48) % 6
            self.x = torch.randn(48, 8, generator=g) + self.y[:, None].float()

        def __len__(self):
            return 48

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])

    trunk = torch.nn.Linear(8, 8)
    loss = losses.HAPPIERLoss(6, 8, hierarchy=TABLE)
    optimizers = {
        "trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1),
        "metric_loss_optimizer": torch.optim.SGD(loss.parameters(), lr=0.1),
    }
    trainer = trainers.MetricLossOnly(
        models={"trunk": trunk, "embedder": torch.nn.Identity()},
        optimizers=optimizers,
        batch_size=16,
        loss_funcs={"metric_loss": loss},
        dataset=Data(),
        dataloader_num_workers=0,
        data_device=torch.device("cpu"),
    )
    w0, p0 = trunk.weight.detach().clone(), loss.decomposability_loss.proxies.detach().clone()
    logging.disable(logging.WARNING)
    try:
        trainer.train(num_epochs=1)
    finally:
        logging.disable(logging.NOTSET)
    assert (trunk.weight - w0).abs().max() > 0
    assert (loss.decomposability_loss.proxies - p0).abs().max() > 0


def test_distributed_loss_wrapper_single_process(tmp_path):
    """PML's DistributedLossWrapper gathers 1-D labels: the hierarchy path works through it (world size 1)."""
    import torch.distributed as dist
    from pytorch_metric_learning.utils.distributed import DistributedLossWrapper

    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        emb, fine = batch(2, n=16)
        x = emb.clone().requires_grad_(True)
        wrapped = DistributedLossWrapper(losses.SupHAPLoss(hierarchy=TABLE))
        loss = wrapped(x, fine)
        assert loss.item() == pytest.approx(losses.SupHAPLoss()(emb, TABLE[fine]).item(), abs=1e-12)
        loss.backward()
        assert torch.isfinite(x.grad).all()
    finally:
        dist.destroy_process_group()
