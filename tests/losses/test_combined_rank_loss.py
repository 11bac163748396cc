"""Tests of CombinedRankLoss ((1 − λ)·L_rank + λ·L_dec, SupRank Eq. 12) and of the combined losses built on it."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_helpers import TABLE, batch
from pytorch_metric_learning.reducers import DoNothingReducer, SumReducer
from pytorch_metric_learning.regularizers import LpRegularizer

from pml_suprank import losses
from pml_suprank.memory import CrossBatchMemory


def _flat(n=16, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    return emb, torch.arange(n) % 4


COMBINED = {
    "ROADMAP": (lambda: losses.ROADMAPLoss(decomposability_weight=0.3), False),
    "ROADMAP_proxy": (lambda: losses.ROADMAPLoss("proxy", 0.2, num_classes=6, embedding_size=8), False),
    "RODRecall": (lambda: losses.RODRecallLoss(k=(1, 2), decomposability_weight=0.5), False),
    "HAPPIER": (lambda: losses.HAPPIERLoss(6, 8, alpha=2.0, decomposability_weight=0.25), True),
    "RODNDCG": (lambda: losses.RODNDCGLoss(6, 8, decomposability_weight=0.4), True),
    "SmoothAP+calibration": (lambda: losses.CombinedRankLoss(losses.SmoothAPLoss(), "calibration", 0.6), False),
    "SupRecall+proxy": (
        lambda: losses.CombinedRankLoss(losses.SupRecallLoss(), "proxy", 0.1, num_classes=6, embedding_size=8),
        False,
    ),
}


def _inputs(hierarchical: bool, seed: int = 0):
    emb, fine = batch(seed, n=24)
    return emb, (TABLE[fine] if hierarchical else fine)


@pytest.mark.parametrize("name", sorted(COMBINED))
def test_terms_sum_to_the_loss_and_match_the_sub_losses(name):
    make, hierarchical = COMBINED[name]
    torch.manual_seed(0)
    loss_fn = make().double()
    emb, labels = _inputs(hierarchical)
    total = loss_fn(emb, labels)
    terms = loss_fn.compute_terms(emb, labels)
    assert set(terms) == {"rank_loss", "decomposability_loss"}
    assert (terms["rank_loss"] + terms["decomposability_loss"]).item() == pytest.approx(total.item(), abs=1e-12)
    lam = loss_fn.weight
    assert loss_fn.term_weights == {"rank_loss": 1.0 - lam, "decomposability_loss": lam}
    rank = loss_fn.rank_loss(emb, labels)
    fine = labels[:, 0] if labels.dim() == 2 else labels
    dec = loss_fn.decomposability_loss(emb, fine)
    assert terms["rank_loss"].item() == pytest.approx((1.0 - lam) * rank.item(), abs=1e-12)
    assert terms["decomposability_loss"].item() == pytest.approx(lam * dec.item(), abs=1e-12)
    assert set(loss_fn.sub_loss_names()) == {"rank_loss", "decomposability_loss"}


def test_terms_with_a_reference_set_and_an_embedding_regularizer():
    emb, labels = _flat()
    ref, ref_labels = _flat(n=20, seed=1)
    loss_fn = losses.CombinedRankLoss(
        losses.SupAPLoss(), "calibration", 0.2, embedding_regularizer=LpRegularizer(), embedding_reg_weight=0.5
    )
    total = loss_fn(emb, labels, None, ref, ref_labels)
    terms = loss_fn.compute_terms(emb, labels, None, ref, ref_labels)
    assert set(terms) == {"rank_loss", "decomposability_loss", "embedding_reg_loss"}
    assert sum(t.item() for t in terms.values()) == pytest.approx(total.item(), abs=1e-12)
    calib = losses.CalibrationLoss()(emb, labels, None, ref, ref_labels)
    assert terms["decomposability_loss"].item() == pytest.approx(0.2 * calib.item(), abs=1e-12)


def test_roadmap_is_the_combination_of_supap_and_calibration_bit_for_bit():
    emb, labels = _flat()
    x1, x2 = emb.clone().requires_grad_(True), emb.clone().requires_grad_(True)
    a = losses.ROADMAPLoss(decomposability_weight=0.3, tau=0.05)(x1, labels)
    b = losses.CombinedRankLoss(losses.SupAPLoss(tau=0.05), "calibration", weight=0.3)(x2, labels)
    a.backward()
    b.backward()
    assert a.item() == b.item() and torch.equal(x1.grad, x2.grad)


def test_combined_rank_loss_is_the_one_way_to_combine():
    """CombinedRankLoss = (1 − λ)·rank loss + λ·L_dec (Eq. 12); a rank loss refuses ``decomposability=``."""
    emb, labels = _flat()
    combined = losses.CombinedRankLoss(losses.SupAPLoss(), "calibration", 0.4)
    expected = 0.6 * losses.SupAPLoss()(emb, labels) + 0.4 * losses.CalibrationLoss()(emb, labels)
    torch.testing.assert_close(combined(emb, labels), expected, rtol=1e-12, atol=1e-12)
    d1 = losses.SupAPLoss(reducer=DoNothingReducer())(emb, labels)
    d2 = losses.CombinedRankLoss(losses.SupAPLoss(), reducer=DoNothingReducer())(emb, labels)
    assert set(d1) == {"loss"} and set(d2) == {"rank_loss", "decomposability_loss"}
    torch.testing.assert_close(d2["rank_loss"]["losses"], 0.9 * d1["loss"]["losses"], rtol=0, atol=0)
    for removed in ({"decomposability": "calibration"}, {"decomposability_weight": 0.4}, {"num_classes": 3}):
        with pytest.raises(TypeError, match=r"CombinedRankLoss\(SupAPLoss\(\), 'calibration'"):
            losses.SupAPLoss(**removed)


def test_public_attributes_and_rank_loss_hyper_parameters():
    loss_fn = losses.ROADMAPLoss(decomposability_weight=0.25, tau=0.05, include_self=True)
    assert isinstance(loss_fn, losses.CombinedRankLoss)
    assert isinstance(loss_fn.rank_loss, losses.SupAPLoss) and isinstance(
        loss_fn.decomposability_loss, losses.CalibrationLoss
    )
    assert loss_fn.weight == loss_fn.decomposability_weight == 0.25
    assert loss_fn.tau == 0.05 and loss_fn.step is loss_fn.rank_loss.step  # read from the rank loss
    assert loss_fn.include_self and loss_fn.decomposability_loss.include_self
    with pytest.raises(AttributeError):
        loss_fn.no_such_attribute  # noqa: B018
    happier = losses.HAPPIERLoss(6, 8, alpha=3.0, hierarchy=TABLE)
    assert happier.alpha == 3.0 and happier.hierarchy is happier.rank_loss.hierarchy
    assert list(happier.state_dict()) == ["decomposability_loss.proxies"]


def test_reducer_and_distance_go_where_they_act():
    emb, labels = _flat()
    summed = losses.ROADMAPLoss(reducer=SumReducer())
    assert isinstance(summed.reducer.reducers["rank_loss"], SumReducer)
    per_query = losses.SupAPLoss(reducer=DoNothingReducer())(emb, labels)["loss"]["losses"]
    calib = losses.CalibrationLoss()(emb, labels)
    assert summed(emb, labels).item() == pytest.approx(0.9 * per_query.sum().item() + 0.1 * calib.item(), abs=1e-12)
    with pytest.raises(TypeError, match="distance"):
        losses.CombinedRankLoss(losses.SupAPLoss(), distance=losses.SupAPLoss().distance)


@pytest.mark.parametrize("weight", [-0.1, 1.5, float("nan")])
def test_weight_must_lie_in_zero_one(weight):
    with pytest.raises(ValueError, match="weight"):
        losses.CombinedRankLoss(losses.SupAPLoss(), "calibration", weight)
    with pytest.raises(ValueError, match="decomposability_weight"):
        losses.ROADMAPLoss(decomposability_weight=weight)


@pytest.mark.parametrize("weight", ["0.5", True, None])
def test_weight_must_be_a_real_number(weight):
    with pytest.raises(TypeError, match="weight"):
        losses.CombinedRankLoss(losses.SupAPLoss(), "calibration", weight)


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_weight_bounds_select_one_term(weight):
    emb, labels = _flat()
    total = losses.CombinedRankLoss(losses.SupAPLoss(), "calibration", weight)(emb, labels)
    only = losses.CalibrationLoss()(emb, labels) if weight == 1.0 else losses.SupAPLoss()(emb, labels)
    assert total.item() == pytest.approx(only.item(), abs=1e-12)


def test_bad_arguments():
    with pytest.raises(TypeError, match="rank_loss must be a pml_suprank BaseRankLoss"):
        losses.CombinedRankLoss(losses.CalibrationLoss(), "calibration")
    with pytest.raises(TypeError, match="a rank loss has no decomposability term of its own"):
        losses.CombinedRankLoss(losses.SupAPLoss(decomposability="calibration"), "calibration")
    with pytest.raises(ValueError, match="decomposability_loss must be"):
        losses.CombinedRankLoss(losses.SupAPLoss(), None)
    with pytest.raises(ValueError, match="decomposability must be one of"):
        losses.CombinedRankLoss(losses.SupAPLoss(), "bogus")
    with pytest.raises(ValueError, match="num_classes"):
        losses.CombinedRankLoss(losses.SupAPLoss(), "proxy")


def test_custom_module_and_cross_batch_memory():
    from pytorch_metric_learning.losses import ContrastiveLoss

    emb, labels = _flat()
    loss_fn = losses.CombinedRankLoss(losses.SupAPLoss(), ContrastiveLoss(), 0.5)
    expected = 0.5 * losses.SupAPLoss()(emb, labels) + 0.5 * ContrastiveLoss()(emb, labels)
    assert loss_fn(emb, labels).item() == pytest.approx(expected.item(), abs=1e-12)
    CrossBatchMemory(loss_fn, embedding_size=8, memory_size=32)
    CrossBatchMemory(losses.HAPPIERLoss(6, 8, hierarchy=TABLE), embedding_size=8, memory_size=32)


def test_rank_loss_hyper_parameters_are_read_through_without_copies():
    """The rank loss's hyper-parameters read on the combined loss are the rank loss's own (no copy in vars(); config
    files are written from the run's options, pml_suprank.training.RunSpec.loss_kwargs)."""
    roadmap = losses.ROADMAPLoss(decomposability_weight=0.3, tau=0.05)
    own = {k for k in vars(roadmap) if not k.startswith("_")}
    assert {"tau", "rho", "delta", "start", "offset"}.isdisjoint(own) and roadmap.decomposability_weight == 0.3
    assert roadmap.tau == 0.05 == roadmap.rank_loss.tau and roadmap.offset == roadmap.rank_loss.offset
    roadmap.rank_loss.tau = 0.02  # one value, read through
    assert roadmap.tau == 0.02
    happier = losses.HAPPIERLoss(6, 8, alpha=2.0)
    assert happier.alpha == 2.0 and happier.with_hrank is False and happier.chunk_size == happier.rank_loss.chunk_size
    with pytest.raises(AttributeError):
        happier._private_of_the_rank_loss  # noqa: B018


def test_num_kept_queries_is_recorded_on_the_combined_loss():
    emb, labels = _flat()
    labels = labels.clone()
    labels[-1] = 99  # one query without a positive
    loss_fn = losses.ROADMAPLoss(collect_stats=True)
    loss_fn(emb, labels)
    assert loss_fn.num_kept_queries == 15 == loss_fn.rank_loss.num_kept_queries
