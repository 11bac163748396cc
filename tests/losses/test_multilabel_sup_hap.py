"""SupHAPLoss / HAPPIERLoss with relevance="multilabel" (thesis Algorithm 1 relevance, padded label sets)."""

import pytest
import torch
import torch.nn.functional as F
from _helpers import MULTILABEL_TABLE, random_label_sets

from pml_suprank import losses
from pml_suprank.metrics.functional import graded_average_precision
from pml_suprank.relevance import multilabel_relevance

TABLE = MULTILABEL_TABLE


def _naive_loss(scores, rel, valid, step):
    """Sup-H-AP with a pairwise relevance, by loops (SupRank Eqs. 18-21, HAPPIER Eqs. 2-3)."""

    def h_minus(t):
        if t <= step.delta:
            return torch.sigmoid(t / step.tau) + step.start * float(t > 0)
        return step.rho * (t - step.delta) + step.resolved_offset

    out = []
    for q in range(scores.shape[0]):
        items = [j for j in range(scores.shape[1]) if valid[q, j]]
        norm = sum(float(rel[q, j]) for j in items)
        if norm == 0:
            continue
        total = scores.new_zeros(())
        for i in items:
            if rel[q, i] <= 0:
                continue
            rank = scores.new_ones(())
            hrank = scores.new_zeros(())
            for j in items:
                t = scores[q, j] - scores[q, i]
                heaviside = float(t >= 0)
                if rel[q, j] > 0:
                    hrank = hrank + min(float(rel[q, i]), float(rel[q, j])) * heaviside
                if j == i:
                    continue
                rank = rank + (h_minus(t) if rel[q, j] < rel[q, i] else heaviside)
            total = total + hrank / rank
        out.append(1.0 - total / norm)
    return torch.stack(out).mean()


def _batch(seed, n=10, m=3, d=5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=1)
    return emb, random_label_sets(n, m, gen)


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multilabel_equals_naive_reference(kernel, seed):
    emb, labels = _batch(seed)
    loss_fn = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel", kernel=kernel)
    scores = emb @ emb.T
    valid = ~torch.eye(len(emb), dtype=torch.bool)
    rel = multilabel_relevance(labels, labels, TABLE, dtype=torch.float64)
    expected = _naive_loss(scores, rel, valid, loss_fn.constant_step())
    torch.testing.assert_close(loss_fn(emb, labels), expected, rtol=1e-9, atol=1e-9)


def test_multilabel_with_reference_set_and_flat_labels():
    emb, labels = _batch(3, n=6)
    ref_emb, ref_labels = _batch(4, n=9, m=3)  # same number of columns M (pad with -1)
    for hierarchy in (TABLE, None):
        loss_fn = losses.SupHAPLoss(hierarchy=hierarchy, relevance="multilabel")
        rel = multilabel_relevance(labels, ref_labels, hierarchy, dtype=torch.float64)
        valid = torch.ones(6, 9, dtype=torch.bool)
        expected = _naive_loss(emb @ ref_emb.T, rel, valid, loss_fn.constant_step())
        got = loss_fn(emb, labels, ref_emb=ref_emb, ref_labels=ref_labels)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


class _LinearRelevance(losses.SupHAPLoss):
    """Today's level-based Sup-H-AP with the relevance table rel(l) = l / L (what one label per item gives)."""

    def level_relevance(self, levels, valid, num_levels, dtype):
        table = torch.arange(num_levels + 1, dtype=dtype, device=levels.device) / num_levels
        return table.expand(levels.shape[0], num_levels + 1)


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_one_label_per_item_reduces_to_level_sup_hap(kernel):
    gen = torch.Generator().manual_seed(5)
    emb = F.normalize(torch.randn(12, 4, generator=gen, dtype=torch.float64), dim=1)
    fine = torch.randint(0, 6, (12,), generator=gen)
    multi = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel", kernel=kernel)
    today = _LinearRelevance(hierarchy=TABLE, kernel=kernel)
    torch.testing.assert_close(multi(emb, fine[:, None]), today(emb, TABLE[fine]), rtol=1e-12, atol=1e-12)
    padded = torch.cat([fine[:, None], torch.full((12, 2), -1)], 1)  # padding changes nothing
    torch.testing.assert_close(multi(emb, padded), today(emb, fine), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", ["dense", "sorted"])
def test_gradcheck_float64(kernel):
    emb, labels = _batch(7, n=5, d=3)
    loss_fn = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel", kernel=kernel, tau=0.5)
    emb = emb.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_upper_bound_of_one_minus_graded_hap(seed):
    emb, labels = _batch(seed, n=16, m=3, dtype=torch.float32)
    emb = emb.round(decimals=1)  # ties included
    loss_fn = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel")
    scores = (emb @ emb.T).double()
    valid = ~torch.eye(16, dtype=torch.bool)
    hap = graded_average_precision(scores, multilabel_relevance(labels, labels, TABLE), valid)
    bound = (1.0 - hap[~hap.isnan()]).mean()
    assert float(loss_fn(emb, labels)) >= float(bound) - 1e-6


def test_dense_equals_sorted_with_hrank():
    emb, labels = _batch(11, n=14)
    dense = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel", kernel="dense", with_hrank=True)
    srt = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel", kernel="sorted", with_hrank=True)
    torch.testing.assert_close(dense(emb, labels), srt(emb, labels), rtol=1e-9, atol=1e-9)


def test_happier_multilabel_terms():
    emb, labels = _batch(2, n=8)
    happier = losses.HAPPIERLoss(6, 5, hierarchy=TABLE, relevance="multilabel", decomposability_weight=0.25)
    happier = happier.double()
    terms = happier.compute_terms(emb, labels)
    rank = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel")(emb, labels)
    torch.testing.assert_close(terms["rank_loss"], 0.75 * rank)
    proxy = happier.decomposability_loss(emb, labels[:, 0])  # proxy term on column 0 (each item's first label)
    torch.testing.assert_close(terms["decomposability_loss"], 0.25 * proxy)


def test_bad_inputs():
    emb, labels = _batch(0, n=4)
    with pytest.raises(ValueError, match="relevance"):
        losses.SupHAPLoss(hierarchy=TABLE, relevance="pairwise")
    with pytest.raises(ValueError, match="relevance"):
        losses.HAPPIERLoss(6, 5, hierarchy=TABLE, relevance=1)
    with pytest.raises(ValueError, match="alpha"):
        losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel", alpha=2.0)
    with pytest.raises(ValueError, match="level_weights"):
        losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel", level_weights=[1.0, 1.0, 1.0])
    loss_fn = losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel")
    empty = labels.clone()
    empty[1] = -1
    with pytest.raises(ValueError, match="labels row 1 has no label"):
        loss_fn(emb, empty)
    late = labels.clone()
    late[2] = torch.tensor([-1, 3, -1])
    with pytest.raises(ValueError, match="labels row 2 has -1 in column 0"):
        loss_fn(emb, late)
    with pytest.raises(ValueError, match="labels must hold labels >= 0"):
        loss_fn(emb, labels.masked_fill(labels == -1, -2))
    with pytest.raises(ValueError, match="not in the hierarchy"):
        loss_fn(emb, labels.masked_fill(labels == 0, 9))
    with pytest.raises(ValueError, match="ref_labels row 0 has -1 in column 0"):
        loss_fn(emb, labels, ref_emb=emb[:2].clone(), ref_labels=torch.tensor([[-1, 1, 2], [2, -1, -1]]))
