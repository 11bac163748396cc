import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity, LpDistance, SNRDistance
from pytorch_metric_learning.reducers import DoNothingReducer

from pml_suprank import losses
from pml_suprank.losses._inputs import RankInputs, reference_mask
from pml_suprank.losses.base_rank_loss import BaseRankLoss

ALL = [
    lambda: losses.SmoothAPLoss(),
    lambda: losses.SupAPLoss(),
    lambda: losses.ROADMAPLoss(),
    lambda: losses.SupRecallLoss(),
    lambda: losses.RODRecallLoss(),
    lambda: losses.CalibrationLoss(),
]
IDS = ["SmoothAP", "SupAP", "ROADMAP", "SupRecall", "RODRecall", "Calibration"]


def _batch(n=8, d=4):
    return torch.nn.functional.normalize(torch.randn(n, d), dim=1), torch.arange(n) % 2


@pytest.mark.parametrize("make", ALL, ids=IDS)
def test_bad_inputs_raise_naming_the_argument(make):
    loss_fn = make()
    emb, labels = _batch()
    cases = [
        ((emb[0], labels), ValueError, "embeddings"),  # wrong shape
        ((emb, labels.float()), TypeError, "labels"),  # float labels
        ((emb, labels[:-1]), ValueError, "labels"),  # wrong length
        ((emb, labels[:, None].expand(8, 2)), ValueError, "labels"),  # 2-D labels for a flat loss
        ((emb.masked_fill(torch.eye(8, 4, dtype=torch.bool), float("nan")), labels), ValueError, "NaN"),
        ((emb[:0], labels[:0]), ValueError, "embeddings"),  # empty batch
        ((emb.long(), labels), TypeError, "embeddings"),
        ((emb, None), ValueError, "labels"),
        ((emb, labels, None, emb.clone()), ValueError, "ref_labels"),  # ref without labels
        ((emb, labels, None, torch.randn(5, 3), torch.arange(5)), ValueError, "ref_emb"),  # wrong width
        ((emb, labels, None, torch.randn(5, 4), torch.arange(4)), ValueError, "ref_labels"),
        ((emb, labels, (torch.tensor([0]), torch.tensor([1]))), ValueError, "indices_tuple"),
        (
            (emb, labels, (torch.tensor([0]), torch.tensor([9]), torch.tensor([0]), torch.tensor([1]))),
            ValueError,
            "indices_tuple",
        ),
        ((emb, labels, (torch.tensor([0.0]), torch.tensor([1]), torch.tensor([2]))), TypeError, "indices_tuple"),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            loss_fn(*args)


@pytest.mark.parametrize("make", ALL, ids=IDS)
def test_non_similarity_distances_are_rejected(make):
    for distance in (LpDistance(), SNRDistance(), DotProductSimilarity(power=2)):
        with pytest.raises(ValueError, match="distance"):
            type(make())(distance=distance)
    type(make())(distance=CosineSimilarity())


def test_unknown_options():
    with pytest.raises(TypeError, match="include_self"):
        losses.SupAPLoss(include_self=1)
    with pytest.raises(TypeError):
        losses.SupAPLoss(bogus_option=3)


def test_reference_mask_include_self_and_indices_tuple():
    m = reference_mask(3, 3, torch.device("cpu"), same_source=True, include_self=False)
    assert not m.diagonal().any() and m.sum() == 6
    m = reference_mask(3, 3, torch.device("cpu"), same_source=True, include_self=True)
    assert m.all()
    m = reference_mask(2, 5, torch.device("cpu"), same_source=False, include_self=False)
    assert m.all()
    a, p, n = torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 0])
    m = reference_mask(2, 5, torch.device("cpu"), same_source=False, include_self=False, indices_tuple=(a, p, n))
    assert m.nonzero().tolist() == [[0, 2], [0, 4], [1, 0], [1, 3]]


def test_indices_tuple_restricts_pairs():
    """Only the listed pairs count: a mined subset changes the loss the same way as dropping the other items."""
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1)
    ref = torch.nn.functional.normalize(torch.randn(10, 4, generator=g, dtype=torch.float64), dim=1)
    labels, ref_labels = torch.tensor([0, 1, 0, 1, 0, 1]), torch.arange(10) % 2
    keep = torch.arange(10) < 7
    a1, p = torch.nonzero((labels[:, None] == ref_labels[None]) & keep, as_tuple=True)
    a2, n = torch.nonzero((labels[:, None] != ref_labels[None]) & keep, as_tuple=True)
    loss_fn = losses.SupAPLoss()
    restricted = loss_fn(emb, labels, (a1, p, a2, n), ref, ref_labels)
    subset = loss_fn(emb, labels, None, ref[keep], ref_labels[keep])
    assert restricted.item() == pytest.approx(subset.item(), abs=1e-12)


class _MeanPositiveScore(BaseRankLoss):
    """A toy subclass following the documented extension contract."""

    def compute_query_losses(self, inputs: RankInputs):
        pos = inputs.positives()
        kept = torch.nonzero(pos.any(1), as_tuple=True)[0]
        s = (inputs.scores * pos).sum(1) / pos.sum(1).clamp(min=1)
        return -s[kept], kept


def test_extension_contract_with_subclass():
    emb = torch.nn.functional.normalize(torch.randn(6, 4, dtype=torch.float64), dim=1).requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 2, 3])  # queries 4 and 5 have no positive
    out = _MeanPositiveScore(reducer=DoNothingReducer())(emb, labels)
    assert out["loss"]["indices"].tolist() == [0, 1, 2, 3]
    scores = emb @ emb.t()
    assert out["loss"]["losses"][0].item() == pytest.approx(-scores[0, 1].item(), abs=1e-12)
    combined = losses.CombinedRankLoss(_MeanPositiveScore(), "calibration", weight=0.5)(emb, labels)
    plain = _MeanPositiveScore()(emb, labels)
    assert combined.item() == pytest.approx(0.5 * plain.item() + 0.5 * losses.CalibrationLoss()(emb, labels).item())
    combined.backward()
    assert torch.isfinite(emb.grad).all()


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("make", ALL + [lambda: losses.ClusterLoss(2, 4)], ids=IDS + ["Cluster"])
def test_mixed_precision_gives_finite_float32_loss(make, low):
    emb, labels = _batch()
    e = emb.to(low).requires_grad_(True)
    loss = make()(e, labels)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert e.grad.dtype == low and torch.isfinite(e.grad.float()).all()


@pytest.mark.parametrize("make", ALL, ids=IDS)
def test_no_positive_gives_connected_zero(make):
    emb = torch.nn.functional.normalize(torch.randn(4, 4), dim=1).requires_grad_(True)
    loss = make()(emb, torch.arange(4))
    combined = isinstance(make(), (losses.CalibrationLoss, losses.ROADMAPLoss, losses.RODRecallLoss))
    assert combined or loss.item() == 0.0  # combined losses keep their (negative-pair) decomposability term
    loss.backward()
    assert emb.grad is not None and torch.isfinite(emb.grad).all()


@pytest.mark.parametrize("make", ALL[:5], ids=IDS[:5])
def test_backward_saves_only_o_b_n_tensors(make):
    """Nothing of size (pairs × N) is kept for backward: 1,600 (query, positive) pairs × 2,000 references would be
    50·B·N elements; the graph saves a few B·N-sized tensors only."""
    g = torch.Generator().manual_seed(0)
    batch, refs = 32, 2000
    emb = torch.nn.functional.normalize(torch.randn(batch, 16, generator=g), dim=1).requires_grad_(True)
    ref = torch.nn.functional.normalize(torch.randn(refs, 16, generator=g), dim=1)
    labels, ref_labels = torch.arange(batch) % 4, torch.arange(refs) % 40
    assert int((labels[:, None] == ref_labels[None]).sum()) * refs >= 50 * batch * refs
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = make()(emb, labels, ref_emb=ref, ref_labels=ref_labels)
    loss.backward()
    bn_float32 = batch * refs * 4
    assert max(sizes) <= 2 * bn_float32 and sum(sizes) <= 8 * bn_float32


def test_pml_reducers_and_regularizers_apply_to_per_query_losses():
    from pytorch_metric_learning.reducers import SumReducer
    from pytorch_metric_learning.regularizers import LpRegularizer

    emb = torch.nn.functional.normalize(torch.randn(8, 4, dtype=torch.float64), dim=1)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 4])  # the last two queries have no positive
    per_query = losses.SupAPLoss(reducer=DoNothingReducer())(emb, labels)["loss"]["losses"]
    assert len(per_query) == 6
    summed = losses.SupAPLoss(reducer=SumReducer())(emb, labels)
    assert summed.item() == pytest.approx(per_query.sum().item(), abs=1e-12)
    regularized = losses.SupAPLoss(embedding_regularizer=LpRegularizer(), embedding_reg_weight=0.5)(emb, labels)
    assert regularized.item() == pytest.approx(per_query.mean().item() + 0.5 * emb.norm(dim=1).mean().item(), abs=1e-9)
