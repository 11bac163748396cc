"""The rank losses inside PML: trainers.MetricLossOnly, losses.MultipleLosses, DistributedLossWrapper(efficient=False)
and CrossBatchMemory (our subclass)."""

import warnings

import pytest
import torch
import torch.distributed as dist
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import samplers, trainers
from pytorch_metric_learning.utils.distributed import DistributedLossWrapper

from pml_suprank import losses
from pml_suprank.memory import CrossBatchMemory


def _emb(n=16, d=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=1), torch.arange(n) % 4


def test_metric_loss_only_trainer_updates_trunk_and_proxies():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(64) % 8
    data = torch.randn(64, 10, generator=g) + labels[:, None].float()
    dataset = torch.utils.data.TensorDataset(data, labels)
    trunk = torch.nn.Sequential(torch.nn.Linear(10, 8))
    loss_fn = losses.ROADMAPLoss("proxy", num_classes=8, embedding_size=8)
    proxies_before = loss_fn.decomposability_loss.proxies.detach().clone()
    weight_before = trunk[0].weight.detach().clone()
    trainer = trainers.MetricLossOnly(
        models={"trunk": trunk},
        optimizers={
            "trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1),
            "metric_loss_optimizer": torch.optim.SGD(loss_fn.parameters(), lr=0.1),
        },
        batch_size=16,
        loss_funcs={"metric_loss": loss_fn},
        dataset=dataset,
        sampler=samplers.MPerClassSampler(labels, m=4, batch_size=16, length_before_new_iter=64),
        dataloader_num_workers=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(num_epochs=1)
    assert torch.isfinite(torch.tensor(trainer.losses["metric_loss"]))
    assert not torch.equal(trunk[0].weight, weight_before)
    assert not torch.equal(loss_fn.decomposability_loss.proxies.detach(), proxies_before)


def test_multiple_losses_equals_roadmap():
    emb, labels = _emb()
    multi = pml_losses.MultipleLosses([losses.SupAPLoss(), losses.CalibrationLoss()], weights=[0.9, 0.1])
    assert multi(emb, labels).item() == pytest.approx(losses.ROADMAPLoss()(emb, labels).item(), abs=1e-12)


def test_distributed_loss_wrapper_world_size_one(tmp_path):
    emb, labels = _emb()
    emb.requires_grad_(True)
    loss_fn = losses.SupAPLoss()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        wrapped = DistributedLossWrapper(loss_fn, efficient=False)
        value = wrapped(emb, labels)
        value.backward()
    finally:
        dist.destroy_process_group()
    expected_emb = emb.detach().clone().requires_grad_(True)
    expected = loss_fn(expected_emb, labels)
    expected.backward()
    assert value.item() == pytest.approx(expected.item(), abs=1e-12)
    torch.testing.assert_close(emb.grad, expected_emb.grad)


def test_pml_cross_batch_memory_rejects_and_ours_accepts():
    with pytest.raises(Exception, match="not supported"):
        pml_losses.CrossBatchMemory(losses.SupAPLoss(), embedding_size=8)
    for loss_fn in (losses.SupAPLoss(), losses.SmoothAPLoss(), losses.ROADMAPLoss(), losses.CalibrationLoss()):
        CrossBatchMemory(loss_fn, embedding_size=8, memory_size=32)
    CrossBatchMemory(pml_losses.ContrastiveLoss(), embedding_size=8)  # PML's own list still works


@pytest.mark.parametrize("make", [losses.SupAPLoss, losses.SmoothAPLoss, losses.ROADMAPLoss, losses.SupRecallLoss])
def test_cross_batch_memory_first_step_equals_in_batch_loss(make):
    """Step 0: the memory holds only the (detached) batch and the query's own copy is removed by indices_tuple."""
    emb, labels = _emb(dtype=torch.float32)
    xbm = CrossBatchMemory(make(), embedding_size=8, memory_size=48)
    e = emb.clone().requires_grad_(True)
    first = xbm(e, labels)
    assert first.item() == pytest.approx(make()(emb, labels).item(), abs=1e-6)
    first.backward()
    assert torch.isfinite(e.grad).all() and e.grad.abs().sum() > 0
    emb2, _ = _emb(seed=1, dtype=torch.float32)
    second = xbm(emb2.requires_grad_(True), labels)
    assert torch.isfinite(second) and xbm.queue_idx == 32
