import math

import pytest
import torch
from _rank_golden import DTYPES, assert_golden, run_golden
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning.distances import LpDistance

from pml_suprank import losses


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("inp", ["A_b12_L2", "B_b16_L3_singletons", "C_b12_L2_ties", "D_b8_mem32_L2"])
def test_golden_loss_and_gradient(inp, dtype):
    loss, grad, res = run_golden(f"{inp}/Calibration", lambda: losses.CalibrationLoss(include_self=True), dtype)
    assert_golden(loss, grad, res, dtype)


def test_matches_pml_contrastive_loss_in_batch():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(20, 8, generator=g, dtype=torch.float64)
    labels = torch.arange(20) % 4
    from pytorch_metric_learning.distances import DotProductSimilarity

    pml = pml_losses.ContrastiveLoss(pos_margin=0.9, neg_margin=0.6, distance=DotProductSimilarity())
    assert losses.CalibrationLoss()(emb, labels).item() == pytest.approx(pml(emb, labels).item(), abs=1e-12)


def test_hand_computed_active_and_all_averages():
    emb = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[0.8, 0.6], [1.0, 0.0], [0.7, math.sqrt(0.51)], [0.0, 1.0]], dtype=torch.float64)
    ref_labels = torch.tensor([0, 0, 1, 1])
    # positives: cos 0.8 (loss 0.1), 1.0 (0); negatives: cos 0.7 (loss 0.1), 0.0 (0)
    active = losses.CalibrationLoss()(emb, torch.tensor([0]), ref_emb=ref, ref_labels=ref_labels)
    assert active.item() == pytest.approx(0.1 + 0.1, abs=1e-12)
    paper = losses.CalibrationLoss(average="all")(emb, torch.tensor([0]), ref_emb=ref, ref_labels=ref_labels)
    assert paper.item() == pytest.approx(0.05 + 0.05, abs=1e-12)


def test_float64_gradcheck():
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(6, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    assert torch.autograd.gradcheck(lambda e: losses.CalibrationLoss(0.5, 0.1)(e, labels), (emb,))


def test_bad_arguments():
    with pytest.raises(ValueError, match="average"):
        losses.CalibrationLoss(average="median")
    with pytest.raises(ValueError, match="pos_margin"):
        losses.CalibrationLoss(pos_margin=2.0)
    with pytest.raises(ValueError, match="distance"):
        losses.CalibrationLoss(distance=LpDistance())
