"""SmoothAPLoss against PML's SmoothAPLoss: the documented include_self difference, and PML's value with
include_self=True on the batch layout PML's loss supports (as many classes as samples per class, grouped)."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from pml_suprank import losses


@pytest.mark.parametrize("classes", [4, 8])
def test_include_self_true_gives_pmls_value_and_the_default_differs(classes):
    torch.manual_seed(classes)
    labels = torch.arange(classes).repeat_interleave(classes)
    emb = torch.nn.functional.normalize(torch.randn(classes * classes, 16, dtype=torch.float64), dim=-1)
    pml = pml_losses.SmoothAPLoss(temperature=0.01)(emb, labels)
    ours_pml_convention = losses.SmoothAPLoss(temperature=0.01, include_self=True)(emb, labels)
    ours_default = losses.SmoothAPLoss(temperature=0.01)(emb, labels)
    assert ours_pml_convention.item() == pytest.approx(pml.item(), abs=1e-6)  # PML computes in float32
    assert ours_default.item() > pml.item() + 1e-3  # the query is not its own positive: lower AP, higher loss


def test_docstring_states_the_difference_and_the_switch():
    doc = losses.SmoothAPLoss.__doc__
    assert "differs from PML's" in doc and "include_self=True" in doc
