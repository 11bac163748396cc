import pytest
import torch

from pml_suprank import losses


def test_is_weighted_sum_of_sup_recall_and_calibration():
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(12, 8, generator=g, dtype=torch.float64), dim=1)
    labels = torch.arange(12) % 3
    total = losses.RODRecallLoss(decomposability_weight=0.5)(emb, labels)
    expected = 0.5 * losses.SupRecallLoss()(emb, labels) + 0.5 * losses.CalibrationLoss()(emb, labels)
    assert total.item() == pytest.approx(expected.item(), abs=1e-12)


@pytest.mark.slow
def test_proxy_variant_and_gradcheck():
    loss_fn = losses.RODRecallLoss(
        k=(1, 2), decomposability="proxy", num_classes=3, embedding_size=4, tau=0.05
    ).double()
    emb = torch.nn.functional.normalize(torch.randn(6, 4, dtype=torch.float64), dim=1).requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,))


def test_bad_arguments():
    with pytest.raises(ValueError, match="decomposability"):
        losses.RODRecallLoss(decomposability=None)
