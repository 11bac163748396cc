import math

import pytest
import torch
from _rank_golden import DTYPES, assert_golden, run_golden

from pml_suprank import losses


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("inp, classes", [("A_b12_L2", 4), ("B_b16_L3_singletons", 7)])
def test_golden_loss_and_gradient(inp, classes, dtype):
    loss, grad, res = run_golden(f"{inp}/ClusterLoss", lambda: losses.ClusterLoss(classes, 8), dtype)
    assert_golden(loss, grad, res, dtype)


def test_hand_computed_case_and_parameters():
    loss_fn = losses.ClusterLoss(num_classes=2, embedding_size=2, temperature=0.5).double()
    assert [n for n, _ in loss_fn.named_parameters()] == ["proxies"]
    loss_fn.proxies.data = torch.tensor([[2.0, 0.0], [0.0, 3.0]], dtype=torch.float64)  # normalised inside
    emb = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    expected = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0)))
    assert loss_fn(emb, torch.tensor([0])).item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.slow
def test_float64_gradcheck_embeddings_and_proxies():
    loss_fn = losses.ClusterLoss(3, 4, temperature=0.5).double()
    emb = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 0, 1])
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,))
    loss_fn(emb, labels).backward()
    assert loss_fn.proxies.grad is not None and torch.isfinite(loss_fn.proxies.grad).all()


def test_bad_input():
    with pytest.raises(ValueError, match="num_classes"):
        losses.ClusterLoss(0, 4)
    loss_fn = losses.ClusterLoss(3, 4)
    with pytest.raises(ValueError, match="labels must lie"):
        loss_fn(torch.randn(2, 4), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="embedding_size"):
        loss_fn(torch.randn(2, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="ref_emb"):
        loss_fn(torch.randn(2, 4), torch.tensor([0, 1]), None, torch.randn(3, 4), torch.tensor([0, 1, 2]))


def test_indices_tuple_weights_items_as_pml_proxy_losses():
    """A miner's indices_tuple weights each item by its count (PML's convert_to_weights), as CSLLoss and PML's proxy
    losses do; it was silently ignored."""
    from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

    torch.manual_seed(0)
    loss_fn = losses.ClusterLoss(3, 4)
    emb, labels = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    pairs = (torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([0]), torch.tensor([2]))
    per_item = torch.nn.functional.cross_entropy(
        emb @ torch.nn.functional.normalize(loss_fn.proxies, dim=1).t() / loss_fn.temperature, labels, reduction="none"
    )
    expected = (per_item * lmu.convert_to_weights(pairs, labels, dtype=per_item.dtype)).mean()
    torch.testing.assert_close(loss_fn(emb, labels, indices_tuple=pairs), expected)


def test_indices_tuple_out_of_range_is_a_value_error():
    pairs = (torch.tensor([0]), torch.tensor([99]), torch.tensor([0]), torch.tensor([2]))
    with pytest.raises(ValueError, match="indices_tuple"):
        losses.ClusterLoss(3, 4)(torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2]), indices_tuple=pairs)
