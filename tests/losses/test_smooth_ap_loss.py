import pytest
import torch
from _rank_golden import DTYPES, TOL, assert_golden, golden_case, raw_dot, run_golden, true_ap
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning.reducers import DoNothingReducer

from pml_suprank import losses

INPUTS = ["A_b12_L2", "B_b16_L3_singletons", "C_b12_L2_ties", "D_b8_mem32_L2"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("inp", INPUTS)
def test_golden_loss_gradient_and_per_query(inp, dtype):
    make = lambda: losses.SmoothAPLoss(0.01, include_self=True, distance=raw_dot())  # noqa: E731
    loss, grad, res = run_golden(f"{inp}/SmoothAP", make, dtype)
    assert_golden(loss, grad, res, dtype)
    case, data = golden_case(f"{inp}/SmoothAP")
    emb = torch.tensor(data["embeddings"], dtype=dtype)
    labels = torch.tensor(data["labels"])[:, 0]
    kw = {}
    if "ref_embeddings" in data:
        kw = {
            "ref_emb": torch.tensor(data["ref_embeddings"], dtype=dtype),
            "ref_labels": torch.tensor(data["ref_labels"])[:, 0],
        }
    out = losses.SmoothAPLoss(0.01, include_self=True, distance=raw_dot(), reducer=DoNothingReducer())(
        emb, labels, **kw
    )
    torch.testing.assert_close(
        1 - out["loss"]["losses"], torch.tensor(res["per_query_score"], dtype=dtype), atol=TOL[dtype], rtol=0
    )


def test_hand_computed_case():
    """Query 1·x; positives at 0.9, 0.5; negative at 0.7; τ = 0.1 (values computed by hand from Eq. 5)."""
    import math

    sig = lambda t: 1 / (1 + math.exp(-t / 0.1))  # noqa: E731
    emb = torch.tensor([[1.0]], dtype=torch.float64)
    ref = torch.tensor([[0.9], [0.5], [0.7]], dtype=torch.float64)
    loss = losses.SmoothAPLoss(0.1, distance=raw_dot())(
        emb, torch.tensor([0]), ref_emb=ref, ref_labels=torch.tensor([0, 0, 1])
    )
    ap_top = (1 + sig(-0.4)) / (1 + sig(-0.4) + sig(-0.2))
    ap_low = (1 + sig(0.4)) / (1 + sig(0.4) + sig(0.2))
    assert loss.item() == pytest.approx(1 - (ap_top + ap_low) / 2, abs=1e-12)


def test_converges_to_ap_as_temperature_goes_to_zero():
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(8, 16, generator=g, dtype=torch.float64), dim=1)
    ref = torch.nn.functional.normalize(torch.randn(40, 16, generator=g, dtype=torch.float64), dim=1)
    labels, ref_labels = torch.arange(8) % 3, torch.arange(40) % 3
    scores = emb @ ref.t()
    pos = labels[:, None] == ref_labels[None, :]
    exact = 1 - true_ap(scores, torch.ones_like(pos), pos).mean()
    errors = [
        abs(losses.SmoothAPLoss(tau)(emb, labels, ref_emb=ref, ref_labels=ref_labels).item() - exact.item())
        for tau in (1e-1, 1e-2, 1e-7)
    ]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-6


def test_correct_for_any_class_composition_unlike_pml():
    """Well-separated clusters: Smooth-AP is 0 whatever the class layout (PML 2.9 gives 0.24-0.48, ecosystem §0.2)."""
    g = torch.Generator().manual_seed(1)
    centres = torch.nn.functional.normalize(torch.randn(3, 32, generator=g), dim=1) * 10
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    emb = torch.nn.functional.normalize(centres[labels] + 0.01 * torch.randn(12, 32, generator=g), dim=1)
    perm = torch.randperm(12, generator=g)
    ours = losses.SmoothAPLoss()(emb[perm], labels[perm])
    assert ours.item() == pytest.approx(0.0, abs=1e-6)
    assert pml_losses.SmoothAPLoss()(emb[perm], labels[perm]).item() > 0.1  # documents the PML bug


def test_float64_gradcheck_and_gradient_signs():
    g = torch.Generator().manual_seed(2)
    emb = torch.nn.functional.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1).requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss_fn = losses.SmoothAPLoss(0.1)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,))
    from pml_suprank.losses._inputs import RankInputs

    scores = (torch.rand(4, 10, generator=g, dtype=torch.float64) * 0.05).requires_grad_(True)
    lab, ref_lab = torch.arange(4) % 2, torch.arange(10) % 2
    per_query, _ = loss_fn.compute_query_losses(
        RankInputs(scores, torch.ones(4, 10, dtype=torch.bool), lab, ref_lab, False)
    )
    per_query.sum().backward()
    pos = lab[:, None] == ref_lab[None, :]
    # Smooth-AP also moves positives relative to each other, but the net push on every negative is downwards
    assert (scores.grad[~pos] > 0).all()
    assert scores.grad[pos].sum() < 0


def test_invariant_to_item_order_and_mixed_precision():
    g = torch.Generator().manual_seed(3)
    emb = torch.nn.functional.normalize(torch.randn(16, 8, generator=g), dim=1)
    labels = torch.arange(16) % 5
    perm = torch.randperm(16, generator=g)
    a = losses.SmoothAPLoss()(emb, labels)
    b = losses.SmoothAPLoss()(emb[perm], labels[perm])
    assert a.item() == pytest.approx(b.item(), abs=1e-6)
    half = losses.SmoothAPLoss()(emb.half(), labels)
    assert half.dtype == torch.float32 and half.item() == pytest.approx(a.item(), abs=5e-2)


def test_bad_temperature():
    with pytest.raises(ValueError, match="tau"):
        losses.SmoothAPLoss(temperature=-1.0)
