import pytest
import torch
from _rank_golden import DTYPES, assert_golden, raw_dot, run_golden
from pytorch_metric_learning.reducers import DoNothingReducer

from pml_suprank import losses


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_golden_roadmap_total_calibration(dtype):
    make = lambda: losses.ROADMAPLoss(offset=1.44, include_self=True, distance=raw_dot())  # noqa: E731
    loss, grad, res = run_golden("A_b12_L2/ROADMAP_total_sop", make, dtype)
    assert_golden(loss, grad, res, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_golden_roadmap_total_proxy(dtype):
    make = lambda: losses.ROADMAPLoss(  # noqa: E731
        "proxy", num_classes=4, embedding_size=8, offset=1.44, include_self=True, distance=raw_dot()
    )
    loss, grad, res = run_golden("A_b12_L2/ROADMAPpp_total_sop", make, dtype)
    assert_golden(loss, grad, res, dtype)


def test_sub_losses_in_loss_dict_and_weights():
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(12, 8, generator=g, dtype=torch.float64), dim=1)
    labels = torch.arange(12) % 3
    loss_fn = losses.ROADMAPLoss(decomposability_weight=0.25)
    total = loss_fn(emb, labels)
    d = losses.ROADMAPLoss(decomposability_weight=0.25, reducer=DoNothingReducer())(emb, labels)
    assert set(d) == {"rank_loss", "decomposability_loss"}
    supap = losses.SupAPLoss()(emb, labels)
    calib = losses.CalibrationLoss()(emb, labels)
    assert total.item() == pytest.approx(0.75 * supap.item() + 0.25 * calib.item(), abs=1e-12)
    assert d["decomposability_loss"]["losses"].item() == pytest.approx(0.25 * calib.item(), abs=1e-12)
    assert isinstance(loss_fn.decomposability_loss, losses.CalibrationLoss)


@pytest.mark.slow
def test_proxy_variant_owns_the_proxies_and_gradchecks():
    loss_fn = losses.ROADMAPLoss("proxy", num_classes=3, embedding_size=4, tau=0.05).double()
    assert [n for n, _ in loss_fn.named_parameters()] == ["decomposability_loss.proxies"]
    emb = torch.nn.functional.normalize(torch.randn(6, 4, dtype=torch.float64), dim=1).requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,))


def test_bad_arguments():
    with pytest.raises(ValueError, match="decomposability"):
        losses.ROADMAPLoss("bogus")
    with pytest.raises(ValueError, match="num_classes"):
        losses.ROADMAPLoss("proxy")
    with pytest.raises(ValueError, match="decomposability_weight"):
        losses.ROADMAPLoss(decomposability_weight=1.5)
