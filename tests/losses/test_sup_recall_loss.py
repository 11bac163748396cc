import pytest
import torch
from _rank_golden import DTYPES, TOL, assert_golden, golden_case, raw_dot, run_golden, suprank_h_minus
from pytorch_metric_learning.reducers import DoNothingReducer

from pml_suprank import losses


def make():
    return losses.SupRecallLoss(offset=1.44, include_self=True, distance=raw_dot())


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("inp", ["A_b12_L2", "C_b12_L2_ties", "D_b8_mem32_L2"])
def test_golden_loss_gradient_and_per_query(inp, dtype):
    loss, grad, res = run_golden(f"{inp}/SupRecall", make, dtype)
    assert_golden(loss, grad, res, dtype)
    _, data = golden_case(f"{inp}/SupRecall")
    emb = torch.tensor(data["embeddings"], dtype=dtype)
    kw = {}
    if "ref_embeddings" in data:
        kw = {
            "ref_emb": torch.tensor(data["ref_embeddings"], dtype=dtype),
            "ref_labels": torch.tensor(data["ref_labels"])[:, 0],
        }
    out = losses.SupRecallLoss(offset=1.44, include_self=True, distance=raw_dot(), reducer=DoNothingReducer())(
        emb, torch.tensor(data["labels"])[:, 0], **kw
    )
    torch.testing.assert_close(
        1 - out["loss"]["losses"], torch.tensor(res["per_query_score"], dtype=dtype), atol=TOL[dtype], rtol=0
    )


def dense_sup_recall(scores, pos, ks=(1, 2, 4, 8, 16), temperature=1.0, **step):
    """Eq. 16 written per query with a Python loop (any number of positives per query)."""
    out = []
    for b in range(scores.shape[0]):
        s, p = scores[b], pos[b]
        ranks = []
        for i in torch.nonzero(p).squeeze(1):
            t = s - s[i]
            others = torch.arange(len(s)) != i
            rank = 1 + ((t >= 0) & p & others).sum() + suprank_h_minus(t[~p], **step).sum()
            ranks.append(rank)
        ranks = torch.stack(ranks)
        rec = [torch.sigmoid((k - ranks) / temperature).sum() / min(len(ranks), k) for k in ks]
        out.append(1 - torch.stack(rec).mean())
    return torch.stack(out)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_unequal_positives_where_the_reference_raises(dtype):
    """Golden B: the reference raises (reduce_rank needs equal positives per query); ours matches Eq. 16."""
    case, data = golden_case("B_b16_L3_singletons/SupRecall")
    assert "error" in case["results"]["float64"]
    emb = torch.tensor(data["embeddings"], dtype=dtype, requires_grad=True)
    labels = torch.tensor(data["labels"])[:, 0]
    out = losses.SupRecallLoss(offset=1.44, include_self=True, distance=raw_dot(), reducer=DoNothingReducer())(
        emb, labels
    )
    scores = emb.detach().double() @ emb.detach().double().t()
    expected = dense_sup_recall(scores, labels[:, None] == labels[None, :], offset=1.44)
    torch.testing.assert_close(out["loss"]["losses"], expected.to(dtype), atol=TOL[dtype], rtol=0)
    loss = make()(emb, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(emb.grad).all()


def test_hand_computed_case():
    emb = torch.tensor([[1.0]], dtype=torch.float64)
    ref = torch.tensor([[0.9], [0.5], [0.7]], dtype=torch.float64)
    loss = losses.SupRecallLoss(k=(1, 2), distance=raw_dot())(
        emb, torch.tensor([0]), ref_emb=ref, ref_labels=torch.tensor([0, 0, 1])
    )
    r = torch.tensor(
        [1 + 1 / (1 + torch.exp(torch.tensor(20.0)).item()), 2 + 100 * 0.15 + 1.4933071732521057], dtype=torch.float64
    )
    expected = 1 - (torch.sigmoid(1 - r).sum() / 1 + torch.sigmoid(2 - r).sum() / 2) / 2
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)


def test_float64_gradcheck():
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1).requires_grad_(True)
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    loss_fn = losses.SupRecallLoss(k=(1, 2), tau=0.05)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,))


def test_bad_arguments():
    for k in (0, (), (1, -2), 1.5):
        with pytest.raises(ValueError, match="k must"):
            losses.SupRecallLoss(k=k)
    with pytest.raises(ValueError, match="temperature"):
        losses.SupRecallLoss(temperature=0.0)
