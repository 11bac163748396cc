"""SupNDCGLoss / RODNDCGLoss with relevance="multilabel" and SupAPLoss / ROADMAPLoss with multilabel="per_label"."""

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import MULTILABEL_TABLE, random_label_sets

from pml_suprank import losses
from pml_suprank.metrics.graded import graded_ndcg, mean_label_average_precision
from pml_suprank.ranking.hierarchical import hierarchical_ranks
from pml_suprank.relevance import level_matrix, multilabel_relevance

TABLE = MULTILABEL_TABLE


def _batch(seed, n=10, m=3, d=5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=1)
    return emb, random_label_sets(n, m, gen)


def _h_minus(step, t):
    if t <= step.delta:
        return torch.sigmoid(t / step.tau) + step.start * float(t > 0)
    return step.rho * (t - step.delta) + step.resolved_offset


def _naive_ndcg_loss(scores, rel, valid, step):
    """Sup-NDCG with gains 2^rel − 1, by loops (SupRank Eqs. 23-24 with a pairwise relevance)."""
    out = []
    for q in range(scores.shape[0]):
        items = [j for j in range(scores.shape[1]) if valid[q, j]]
        rels = sorted((float(rel[q, j]) for j in items), reverse=True)
        idcg = sum((2.0**r - 1.0) / math.log2(2 + p) for p, r in enumerate(rels))
        if idcg == 0:
            continue
        dcg = scores.new_zeros(())
        for i in items:
            if rel[q, i] <= 0:
                continue
            rank = scores.new_ones(())
            for j in items:
                if j == i:
                    continue
                t = scores[q, j] - scores[q, i]
                rank = rank + (_h_minus(step, t) if rel[q, j] < rel[q, i] else float(t >= 0))
            dcg = dcg + (2.0 ** float(rel[q, i]) - 1.0) / torch.log2(1.0 + rank)
        out.append(1.0 - dcg / idcg)
    return torch.stack(out).mean()


def _naive_per_label_loss(scores, labels, ref_labels, valid, step):
    """Per-label SupAP by loops: SupAP of each distinct query label as a binary problem, averaged per query."""
    out = []
    for q in range(scores.shape[0]):
        aps = []
        for y in sorted({int(v) for v in labels[q] if v >= 0}):
            pos = [j for j in range(scores.shape[1]) if valid[q, j] and bool((ref_labels[j] == y).any())]
            neg = [j for j in range(scores.shape[1]) if valid[q, j] and j not in pos]
            if not pos:
                continue
            total = scores.new_zeros(())
            for i in pos:
                rank_plus = 1.0 + sum(float(scores[q, j] >= scores[q, i]) for j in pos if j != i)
                rank = rank_plus + sum(_h_minus(step, scores[q, j] - scores[q, i]) for j in neg)
                total = total + rank_plus / rank
            aps.append(total / len(pos))
        if aps:
            out.append(1.0 - torch.stack(aps).mean())
    return torch.stack(out).mean()


# ------------------------------------------------------------------ multi-label Sup-NDCG


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ndcg_multilabel_equals_naive_reference(kernel, seed):
    emb, labels = _batch(seed)
    loss_fn = losses.SupNDCGLoss(hierarchy=TABLE, relevance="multilabel", kernel=kernel)
    valid = ~torch.eye(len(emb), dtype=torch.bool)
    rel = multilabel_relevance(labels, labels, TABLE, dtype=torch.float64)
    expected = _naive_ndcg_loss(emb @ emb.T, rel, valid, loss_fn.constant_step())
    torch.testing.assert_close(loss_fn(emb, labels), expected, rtol=1e-9, atol=1e-9)


def test_ndcg_multilabel_with_reference_set_and_flat_labels():
    emb, labels = _batch(3, n=6)
    ref_emb, ref_labels = _batch(4, n=9)
    for hierarchy in (TABLE, None):
        loss_fn = losses.SupNDCGLoss(hierarchy=hierarchy, relevance="multilabel")
        rel = multilabel_relevance(labels, ref_labels, hierarchy, dtype=torch.float64)
        valid = torch.ones(6, 9, dtype=torch.bool)
        expected = _naive_ndcg_loss(emb @ ref_emb.T, rel, valid, loss_fn.constant_step())
        got = loss_fn(emb, labels, ref_emb=ref_emb, ref_labels=ref_labels)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_ndcg_one_flat_label_reduces_to_level_loss(kernel):
    emb, sets = _batch(5, n=12)
    labels = sets[:, :1] % 3
    multi = losses.SupNDCGLoss(relevance="multilabel", kernel=kernel)(emb, labels)
    level = losses.SupNDCGLoss(kernel=kernel)(emb, labels)  # (B, 1) labels: one level, gain 2^1 − 1
    torch.testing.assert_close(multi, level, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_ndcg_one_hierarchical_label_uses_the_equivalent_gains(kernel):
    # one label per item: rel = T / L, so the loss is Sup-NDCG on today's levels with gains 2^(T/L) − 1
    emb, sets = _batch(6, n=12)
    fine = sets[:, 0]
    loss_fn = losses.SupNDCGLoss(hierarchy=TABLE, relevance="multilabel", kernel=kernel)
    got = loss_fn(emb, fine[:, None])
    levels = level_matrix(TABLE[fine], TABLE[fine])
    valid = ~torch.eye(12, dtype=torch.bool)
    scores = emb @ emb.T
    rank, _ = hierarchical_ranks(scores, levels, None, 3, valid, loss_fn.step)
    gains = torch.pow(2.0, levels.double() / 3) - 1.0
    pos = valid & (levels > 0)
    dcg = torch.where(pos, gains / torch.log2(1.0 + rank), torch.zeros_like(rank)).sum(1)
    ideal = torch.where(valid, gains, torch.zeros_like(gains)).sort(1, descending=True).values
    idcg = (ideal / torch.log2(torch.arange(2, 14, dtype=torch.float64))).sum(1)
    has = pos.any(1)
    torch.testing.assert_close(got, (1.0 - dcg[has] / idcg[has]).mean(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_ndcg_multilabel_upper_bounds_one_minus_graded_ndcg(seed):
    emb, labels = _batch(seed, n=14)
    loss = losses.SupNDCGLoss(hierarchy=TABLE, relevance="multilabel")(emb, labels)
    rel = multilabel_relevance(labels, labels, TABLE, dtype=torch.float64)
    valid = ~torch.eye(14, dtype=torch.bool)
    ndcg = graded_ndcg(emb @ emb.T, rel, valid)
    assert float(loss) >= float(1.0 - ndcg[~ndcg.isnan()].mean()) - 1e-12


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_ndcg_multilabel_gradcheck_float64(kernel):
    emb, labels = _batch(7, n=6, d=4)
    loss_fn = losses.SupNDCGLoss(hierarchy=TABLE, relevance="multilabel", kernel=kernel, tau=0.1)
    emb = emb.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,), eps=1e-6, atol=1e-5)


def test_rod_ndcg_passes_relevance_through():
    emb, labels = _batch(8, n=8)
    loss_fn = losses.RODNDCGLoss(6, 5, hierarchy=TABLE, relevance="multilabel", decomposability_weight=0.0)
    assert loss_fn.rank_loss.relevance == "multilabel"
    expected = losses.SupNDCGLoss(hierarchy=TABLE, relevance="multilabel")(emb, labels)
    torch.testing.assert_close(loss_fn(emb, labels), expected, rtol=1e-12, atol=1e-12)
    loss_fn.decomposability_weight = 0.5
    loss_fn(emb, labels).backward()  # the proxy term reads column 0 of the label sets


def test_ndcg_bad_relevance_names_the_argument():
    with pytest.raises(ValueError, match="relevance"):
        losses.SupNDCGLoss(relevance="sets")
    with pytest.raises(ValueError, match="relevance"):
        losses.RODNDCGLoss(6, 5, relevance=3)
    emb, labels = _batch(9, n=4)
    with pytest.raises(ValueError, match="labels row 0"):
        losses.SupNDCGLoss(relevance="multilabel")(emb, torch.tensor([[-1, 2], [1, -1], [2, 3], [0, 1]]))


# ------------------------------------------------------------------ per-label SupAP / ROADMAP


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_label_equals_naive_reference(kernel, seed):
    emb, labels = _batch(seed, n=10)
    labels[0, 1] = labels[0, 0]  # a repeated label counts once
    loss_fn = losses.SupAPLoss(multilabel="per_label", kernel=kernel)
    valid = ~torch.eye(10, dtype=torch.bool)
    expected = _naive_per_label_loss(emb @ emb.T, labels, labels, valid, loss_fn.constant_step())
    torch.testing.assert_close(loss_fn(emb, labels), expected, rtol=1e-9, atol=1e-9)


def test_per_label_with_reference_set():
    emb, labels = _batch(3, n=6)
    ref_emb, ref_labels = _batch(4, n=9)
    loss_fn = losses.SupAPLoss(multilabel="per_label")
    valid = torch.ones(6, 9, dtype=torch.bool)
    expected = _naive_per_label_loss(emb @ ref_emb.T, labels, ref_labels, valid, loss_fn.constant_step())
    got = loss_fn(emb, labels, ref_emb=ref_emb, ref_labels=ref_labels)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_per_label_one_label_reduces_to_sup_ap_and_roadmap(kernel):
    emb, sets = _batch(5, n=12)
    labels = sets[:, 0] % 3
    for column in (labels, labels[:, None]):
        got = losses.SupAPLoss(multilabel="per_label", kernel=kernel)(emb, column)
        torch.testing.assert_close(got, losses.SupAPLoss(kernel=kernel)(emb, labels), rtol=0, atol=1e-12)
        got = losses.ROADMAPLoss(multilabel="per_label", kernel=kernel)(emb, column)
        torch.testing.assert_close(got, losses.ROADMAPLoss(kernel=kernel)(emb, labels), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_label_upper_bounds_one_minus_mean_label_ap(seed):
    emb, labels = _batch(seed, n=14)
    loss = losses.SupAPLoss(multilabel="per_label")(emb, labels)
    valid = ~torch.eye(14, dtype=torch.bool)
    ap = mean_label_average_precision(emb @ emb.T, labels, labels, valid)
    assert float(loss) >= float(1.0 - ap[~ap.isnan()].mean()) - 1e-12


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_per_label_gradcheck_float64(kernel):
    emb, labels = _batch(7, n=6, d=4)
    loss_fn = losses.ROADMAPLoss(multilabel="per_label", kernel=kernel, tau=0.1)
    emb = emb.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,), eps=1e-6, atol=1e-5)


def test_roadmap_per_label_calibration_pairs_share_any_label():
    emb, labels = _batch(8, n=8)
    loss_fn = losses.ROADMAPLoss(multilabel="per_label", decomposability_weight=1.0)
    assert loss_fn.decomposability_loss.multilabel is True
    calib = losses.CalibrationLoss(multilabel=True)
    torch.testing.assert_close(loss_fn(emb, labels), calib(emb, labels), rtol=0, atol=1e-12)
    # the same pairs, by hand: positive iff the label sets meet
    shared = torch.tensor([[bool(set(a.tolist()) & set(b.tolist()) - {-1}) for b in labels] for a in labels])
    scores = F.normalize(emb, dim=1) @ F.normalize(emb, dim=1).T
    off = ~torch.eye(8, dtype=torch.bool)
    pos = torch.relu(0.9 - scores[shared & off])
    neg = torch.relu(scores[~shared & off] - 0.6)
    expected = pos[pos > 0].mean() + neg[neg > 0].mean()
    torch.testing.assert_close(calib(emb, labels), expected, rtol=1e-12, atol=1e-12)


def test_per_label_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="multilabel"):
        losses.SupAPLoss(multilabel="sets")
    with pytest.raises(ValueError, match="multilabel"):
        losses.ROADMAPLoss(multilabel=True)
    with pytest.raises(TypeError, match="multilabel"):
        losses.CalibrationLoss(multilabel="yes")
    emb, labels = _batch(9, n=4)
    with pytest.raises(ValueError, match="labels"):
        losses.SupAPLoss()(emb, labels)  # (B, M) label sets need multilabel="per_label"
    with pytest.raises(ValueError, match="labels row 1"):
        losses.SupAPLoss(multilabel="per_label")(emb, torch.tensor([[0, 2], [-1, -1], [2, 3], [0, 1]]))


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_no_relevant_item_gives_pml_zero_loss(kernel):
    emb, _ = _batch(10, n=4)
    labels = torch.tensor([[0, -1], [1, -1], [2, 3], [4, 5]])  # flat: no two items share a label
    emb = emb.clone().requires_grad_(True)
    for loss_fn in (
        losses.SupNDCGLoss(relevance="multilabel", kernel=kernel),
        losses.SupAPLoss(multilabel="per_label", kernel=kernel),
    ):
        loss = loss_fn(emb, labels)
        assert float(loss.detach()) == 0.0
        loss.backward()


def test_roadmap_per_label_with_reference_set_and_terms():
    emb, labels = _batch(11, n=6)
    ref_emb, ref_labels = _batch(12, n=9)
    loss_fn = losses.ROADMAPLoss(multilabel="per_label", decomposability_weight=0.3)
    got = loss_fn(emb, labels, ref_emb=ref_emb, ref_labels=ref_labels)
    rank = losses.SupAPLoss(multilabel="per_label")(emb, labels, ref_emb=ref_emb, ref_labels=ref_labels)
    calib = losses.CalibrationLoss(multilabel=True)(emb, labels, ref_emb=ref_emb, ref_labels=ref_labels)
    torch.testing.assert_close(got, 0.7 * rank + 0.3 * calib, rtol=1e-12, atol=1e-12)
    terms = loss_fn.compute_terms(emb, labels, ref_emb=ref_emb, ref_labels=ref_labels)
    torch.testing.assert_close(sum(terms.values()), got, rtol=1e-12, atol=1e-12)
