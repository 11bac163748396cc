"""RetrievalEvaluator: agreement with the functional metrics, label formats, chunking, faiss, embeddings helper."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pml_suprank.metrics import METRIC_GROUPS, RetrievalEvaluator, compute_embeddings
from pml_suprank.metrics import functional as F
from pml_suprank.relevance import Hierarchy, level_matrix


def _data(n=120, d=8, seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, 3, (n,), generator=g)
    mid = coarse * 3 + torch.randint(0, 3, (n,), generator=g)
    fine = mid * 4 + torch.randint(0, 4, (n,), generator=g)
    labels = torch.stack([fine, mid, coarse], 1)
    emb = torch.randn(n, d, generator=g) + torch.nn.functional.one_hot(fine % d, d).float()
    if ties:  # small integers: every dot product is exact whatever the summation order, so ties are exact
        emb = torch.randint(-1, 2, (n, d), generator=g).float()
        emb[5] = emb[4]
        return emb, labels
    return torch.nn.functional.normalize(emb, dim=1), labels


@pytest.mark.parametrize("ties", [False, True])
def test_matches_functional_on_self_retrieval(ties):
    emb, labels = _data(ties=ties)
    out = RetrievalEvaluator(k_values=(1, 5), chunk_size=17).evaluate(emb, labels, return_per_query=True)
    n = len(emb)
    ranks = F.retrieval_ranks(emb @ emb.T, level_matrix(labels, labels), ~torch.eye(n, dtype=torch.bool), num_levels=3)
    pq = out["per_query"]
    expected = {
        "ap": F.ap_from_ranks(ranks),
        "map_at_r": F.map_at_r_from_ranks(ranks),
        "recall_at_5": F.recall_at_k_from_ranks(ranks, 5),
        "precision_at_1": F.precision_at_k_from_ranks(ranks, 1),
        "h_ap": F.hap_from_ranks(ranks),
        "ndcg": F.ndcg_from_ranks(ranks),
        "asi": F.asi_from_ranks(ranks),
        "ap_level1": F.ap_from_ranks(ranks, 2),
        "map_at_r_level2": F.map_at_r_from_ranks(ranks, 1),
        "sum_w_ap": F.weighted_sum_ap_from_ranks(ranks),
    }
    for key, value in expected.items():
        assert torch.allclose(pq[key], value, atol=1e-12, equal_nan=True), key
        assert out[key] == pytest.approx(float(np.nanmean(value.numpy())), abs=1e-12)
    assert out["num_queries"] == n


@pytest.mark.parametrize("ties", [False, True])
def test_counting_methods_agree(ties):
    # "search" (pruned exact search) and "histogram" must give identical ranks, hence identical metrics, on
    # self-retrieval, on a disjoint gallery (queries with no relevant item at all) and with ties
    emb, labels = _data(ties=ties, seed=8)
    for args in ((emb, labels), (emb[:30], labels[:30], emb[30:], labels[30:])):
        outs = [
            RetrievalEvaluator(k_values=(1, 5), chunk_size=13, counting=c).evaluate(*args, return_per_query=True)
            for c in ("search", "histogram", "auto")
        ]
        for out in outs[1:]:
            for key, value in outs[0]["per_query"].items():
                assert torch.equal(torch.isnan(value), torch.isnan(out["per_query"][key])), key
                assert torch.allclose(value, out["per_query"][key], atol=0, rtol=0, equal_nan=True), key
    with pytest.raises(ValueError, match="counting"):
        RetrievalEvaluator(counting="sort")


def test_search_counting_on_separated_hierarchy():
    # well separated coarse classes: almost every negative scores below the lowest relevant item and is pruned
    g = torch.Generator().manual_seed(9)
    fine = torch.arange(90) // 3
    labels = torch.stack([fine, fine % 3], 1)
    emb = 4.0 * torch.nn.functional.one_hot(labels[:, 1], 8).float() + torch.randn(90, 8, generator=g)
    emb = torch.nn.functional.normalize(emb, dim=1)
    out = RetrievalEvaluator(k_values=(1, 4), chunk_size=32, counting="search").evaluate(
        emb, labels, return_per_query=True
    )
    mask = ~torch.eye(90, dtype=torch.bool)
    ranks = F.retrieval_ranks(emb @ emb.T, level_matrix(labels, labels), mask, num_levels=2, counting="histogram")
    assert torch.allclose(out["per_query"]["ap"], F.ap_from_ranks(ranks), atol=1e-12, equal_nan=True)
    assert torch.allclose(out["per_query"]["h_ap"], F.hap_from_ranks(ranks), atol=1e-12, equal_nan=True)
    assert torch.allclose(out["per_query"]["asi"], F.asi_from_ranks(ranks), atol=1e-12, equal_nan=True)


def test_disjoint_gallery_and_ref_includes_query():
    emb, labels = _data(seed=1)
    q, ql, g, gl = emb[:30], labels[:30], emb[30:], labels[30:]
    ev = RetrievalEvaluator(k_values=(1,))
    out = ev.evaluate(q, ql, g, gl, return_per_query=True)
    ranks = F.retrieval_ranks(q @ g.T, level_matrix(ql, gl), num_levels=3)
    assert torch.allclose(out["per_query"]["h_ap"], F.hap_from_ranks(ranks), equal_nan=True)
    # PML convention: queries are the first rows of the reference, removed by index
    a = ev.evaluate(emb[:40], labels[:40], emb, labels, ref_includes_query=True, return_per_query=True)
    mask = torch.ones(40, len(emb), dtype=torch.bool)
    mask[torch.arange(40), torch.arange(40)] = False
    ranks = F.retrieval_ranks(emb[:40] @ emb.T, level_matrix(labels[:40], labels), mask, num_levels=3)
    assert torch.allclose(a["per_query"]["ap"], F.ap_from_ranks(ranks), equal_nan=True)
    with pytest.raises(ValueError, match="first len\\(query\\) rows"):
        ev.evaluate(emb[1:41], labels[1:41], emb, labels, ref_includes_query=True)


def test_label_formats_give_identical_results():
    emb, labels = _data(seed=2)
    ev2 = RetrievalEvaluator(k_values=(1,))
    ev1 = RetrievalEvaluator(k_values=(1,), hierarchy=Hierarchy.from_labels(labels))
    a = ev2.evaluate(emb, labels)
    b = ev1.evaluate(emb, labels[:, 0])
    assert a == b
    flat = ev2.evaluate(emb, labels[:, 0])
    assert flat["ap"] == pytest.approx(a["ap"], abs=1e-12)
    assert flat["h_ap"] == pytest.approx(flat["ap"], abs=1e-12)  # one level: H-AP == AP


def test_invariant_to_gallery_permutation_and_chunking():
    emb, labels = _data(seed=3, ties=True)
    perm = torch.randperm(len(emb), generator=torch.Generator().manual_seed(0))
    a = RetrievalEvaluator(chunk_size=7).evaluate(emb[:20], labels[:20], emb[20:], labels[20:])
    g = emb[20:][perm[perm < 100]]
    gl = labels[20:][perm[perm < 100]]
    b = RetrievalEvaluator(chunk_size=1000).evaluate(emb[:20], labels[:20], g, gl)
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-12), key


def test_metric_selection_and_errors():
    emb, labels = _data(n=30, seed=4)
    out = RetrievalEvaluator(k_values=(1, 2), metrics=["h_ap", "recall_at_k"]).evaluate(emb, labels)
    assert set(k for k in out if not k.startswith("num_")) == {"h_ap", "recall_at_1", "recall_at_2"}
    with pytest.raises(ValueError, match="unknown metric name"):
        RetrievalEvaluator(metrics=["mAP"])
    with pytest.raises(ValueError, match="only computes the top-k"):
        RetrievalEvaluator(backend="faiss", metrics=["h_ap"])
    with pytest.raises(ValueError, match="k_values"):
        RetrievalEvaluator(k_values=(0,))
    ev = RetrievalEvaluator()
    with pytest.raises(ValueError, match="N == query.shape\\[0\\]"):
        ev.evaluate(emb, labels[:-1])
    bad = emb.clone()
    bad[3, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        ev.evaluate(bad, labels)
    with pytest.raises(ValueError, match="same number of levels"):
        ev.evaluate(emb[:10], labels[:10], emb[10:], labels[10:, :2])
    with pytest.raises(ValueError, match="same embedding size"):
        ev.evaluate(emb[:10], labels[:10], emb[10:, :4], labels[10:])
    with pytest.raises(ValueError, match="not a tree"):
        ev.evaluate(emb[:3], torch.tensor([[0, 0], [0, 1], [1, 1]]))


def test_queries_without_relevant_items():
    emb = torch.nn.functional.normalize(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), dim=1)
    labels = torch.tensor([[0, 0], [1, 0], [2, 1], [3, 2]])
    out = RetrievalEvaluator(k_values=(1,)).evaluate(emb, labels, return_per_query=True)
    assert out["num_queries_without_positives"] == 4
    assert out["num_queries_without_relevant"] == 2
    assert math.isnan(out["ap"])
    assert not math.isnan(out["h_ap"])


def test_faiss_backend_matches_torch_on_tie_free_data():
    pytest.importorskip("faiss")
    emb, labels = _data(seed=5)
    groups = ["precision_at_1", "recall_at_k", "precision_at_k", "recall_at_k_level"]
    a = RetrievalEvaluator(k_values=(1, 4), metrics=groups).evaluate(emb, labels)
    b = RetrievalEvaluator(k_values=(1, 4), backend="faiss").evaluate(emb, labels)
    assert set(a) == set(b)
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-9), key


def test_compute_embeddings_plain_and_with_accelerator_gather():
    model = torch.nn.Linear(4, 3)
    x = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    y = torch.arange(10)
    loader = [(x[:6], y[:6]), (x[6:], y[6:])]
    emb, lab = compute_embeddings(model, loader)
    assert torch.allclose(emb, torch.nn.functional.normalize(model(x), dim=1))
    assert torch.equal(lab, y)
    assert model.training  # restored

    class FakeAccelerator:  # what accelerate's gather_for_metrics does on one process
        device = torch.device("cpu")
        calls = 0

        def gather_for_metrics(self, tensors):
            FakeAccelerator.calls += 1
            return tensors

    dict_loader = [{"pixel_values": x[:5], "labels": y[:5]}, {"pixel_values": x[5:], "labels": y[5:]}]
    emb2, lab2 = compute_embeddings(model, dict_loader, accelerator=FakeAccelerator())
    assert FakeAccelerator.calls == 2 and torch.allclose(emb2, emb) and torch.equal(lab2, y)
    with pytest.raises(ValueError, match="input_key"):
        compute_embeddings(model, [{"x": x, "y": y}])


def test_metric_groups_cover_the_documented_keys():
    emb, labels = _data(n=40, seed=6)
    out = RetrievalEvaluator(k_values=(1, 10)).evaluate(emb, labels)
    for key in (
        "ap",
        "map_at_r",
        "recall_at_1",
        "recall_at_10",
        "precision_at_1",
        "h_ap",
        "ndcg",
        "asi",
        "ap_level0",
        "ap_level2",
        "map_at_r_level1",
        "sum_w_ap",
        "num_queries_without_positives",
    ):
        assert key in out
    assert len(METRIC_GROUPS) == 16  # the 15 single-label groups + mean_label_ap (multi-label)
    assert "mean_label_ap" not in out  # not a default group of single-label evaluation


def test_device(device):
    emb, labels = _data(n=50, seed=7)
    a = RetrievalEvaluator(device=device).evaluate(emb, labels)
    b = RetrievalEvaluator().evaluate(emb, labels)
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-6), key
