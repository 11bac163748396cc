"""RetrievalEvaluator(multilabel=True): naive per-query reference (relevance by a plain loop, full sort), the one
label per item reductions, the R@k hit rule, chunking and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pml_suprank.metrics import RetrievalEvaluator, multilabel_eval, report
from pml_suprank.metrics import functional as F
from pml_suprank.metrics.graded import graded_ndcg, mean_label_average_precision
from pml_suprank.metrics.registry import METRICS, MULTILABEL_GROUPS, SINGLE_LABEL_GROUPS
from pml_suprank.relevance import level_matrix

K_VALUES = (1, 3)


# ---------------------------------------------------------------------------------------------------------------
# naive reference: plain loops, straight from the definitions


def _lca(a: int, b: int, table) -> int:
    if table is None:
        return 0 if a == b else 1
    for h in range(table.shape[1]):
        if table[a, h] == table[b, h]:
            return h
    return table.shape[1]


def _naive_pair(q_set, k_set, table):
    """(Algorithm 1 relevance, best agreement level λ) of one (query, item) pair."""
    L = 1 if table is None else table.shape[1]
    l_star = [L - min(_lca(a, b, table) for b in k_set) for a in q_set]
    return sum(l_star) / (len(q_set) * L), max(l_star)


def _order(scores, tie):
    """Pessimistic order: score descending, then ``tie`` ascending, then index."""
    return np.lexsort((np.arange(len(scores)), tie, -scores))


def _ap(scores, pos):
    o = _order(scores, pos.astype(float))
    p = pos[o]
    if not p.any():
        return float("nan")
    hits = np.cumsum(p)
    return float((p * hits / np.arange(1, len(p) + 1)).sum() / p.sum())


def _naive_query(scores, q_set, k_sets, table, L):
    n = len(k_sets)
    rel = np.zeros(n)
    lam = np.zeros(n, dtype=np.int64)
    for i, k_set in enumerate(k_sets):
        rel[i], lam[i] = _naive_pair(q_set, k_set, table)
    out = {}
    o = _order(scores, rel)
    r = rel[o]
    if r.sum() > 0:
        num = sum(sum(min(r[i], r[j]) for j in range(i + 1) if r[j] > 0) / (i + 1) for i in range(n) if r[i] > 0)
        out["h_ap"] = num / r.sum()
        disc = 1.0 / np.log2(np.arange(2, n + 2))
        out["ndcg"] = float(((2.0**r - 1) * disc).sum() / ((2.0 ** np.sort(rel)[::-1] - 1) * disc).sum())
    else:
        out["h_ap"] = out["ndcg"] = float("nan")
    fine = lam == L
    out["ap"] = _ap(scores, fine)
    of = _order(scores, fine.astype(float))
    for k in K_VALUES:
        out[f"recall_at_{k}"] = float(fine[of][:k].any()) if fine.any() else float("nan")
    for h in range(L):
        out[f"ap_level{h}"] = _ap(scores, lam >= L - h)
    aps = [_ap(scores, np.array([y in k_set for k_set in k_sets])) for y in sorted(q_set)]
    aps = [a for a in aps if not math.isnan(a)]
    out["mean_label_ap"] = sum(aps) / len(aps) if aps else float("nan")
    out["_fine"] = int(fine.sum())
    return out


def _sets(labels: torch.Tensor) -> list[set[int]]:
    return [{int(v) for v in row if v >= 0} for row in labels]


def naive_evaluation(query, q_labels, reference, r_labels, table, self_removed):
    L = 1 if table is None else table.shape[1]
    t = None if table is None else table.numpy()
    scores = (query.double() @ reference.double().T).numpy()
    q_sets, r_sets = _sets(q_labels), _sets(r_labels)
    rows = []
    for q in range(len(q_sets)):
        keep = [i for i in range(len(r_sets)) if not (self_removed and i == q)]
        rows.append(_naive_query(scores[q, keep], q_sets[q], [r_sets[i] for i in keep], t, L))
    return {key: np.array([row[key] for row in rows], dtype=float) for key in rows[0]}


# ---------------------------------------------------------------------------------------------------------------
# random multi-label hierarchies with ties


def _problem(seed: int, n: int = 36, num_fine: int = 10, hierarchical: bool = True, m: int = 3):
    g = torch.Generator().manual_seed(seed)
    table = None
    if hierarchical:
        mid = torch.randint(0, 4, (num_fine,), generator=g)  # many fine labels per parent: ties in LCA
        table = torch.stack([torch.arange(num_fine), mid, mid // 2], 1)
    labels = torch.randint(0, num_fine, (n, m), generator=g)  # repeated labels allowed
    labels[torch.rand(n, m, generator=g) < 0.4] = -1
    labels[:, 0] = torch.randint(0, num_fine, (n,), generator=g)  # every row has a label
    labels = labels[:, torch.randperm(m, generator=g)]  # padding anywhere in a row
    emb = torch.randint(-1, 2, (n, 3), generator=g).float()  # integer dot products: many exact ties
    return emb, labels, table


def _check_against_naive(out, naive, L):
    per_q = out["per_query"]
    keys = ["h_ap", "ndcg", "ap", "mean_label_ap", *[f"recall_at_{k}" for k in K_VALUES]]
    keys += [f"ap_level{h}" for h in range(L)]
    for key in keys:
        np.testing.assert_allclose(per_q[key].numpy(), naive[key], rtol=0, atol=1e-9, err_msg=key)
        assert out[key] == pytest.approx(float(np.nanmean(naive[key])), abs=1e-9), key
    assert out["num_queries_without_positives"] == int((naive["_fine"] == 0).sum())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("hierarchical", [True, False])
def test_equals_naive_on_the_query_set(seed, hierarchical):
    emb, labels, table = _problem(seed, hierarchical=hierarchical)
    evaluator = RetrievalEvaluator(k_values=K_VALUES, hierarchy=table, chunk_size=7)
    out = evaluator.evaluate(emb, labels, return_per_query=True, multilabel=True)
    _check_against_naive(out, naive_evaluation(emb, labels, emb, labels, table, True), 1 if table is None else 3)
    assert out["num_queries"] == len(emb)


@pytest.mark.parametrize("seed", range(2))
def test_equals_naive_with_a_separate_gallery_and_ref_includes_query(seed):
    emb, labels, table = _problem(seed + 10, n=40)
    q, ql = emb[:12], labels[:12, :2].clone()
    ql[(ql < 0).all(1), 0] = 1
    evaluator = RetrievalEvaluator(k_values=K_VALUES, hierarchy=table, multilabel=True, chunk_size=5)
    out = evaluator.evaluate(q, ql, emb[12:], labels[12:], return_per_query=True)
    _check_against_naive(out, naive_evaluation(q, ql, emb[12:], labels[12:], table, False), 3)
    # the queries as the first rows of the gallery (PML convention): removed by index
    full = evaluator.evaluate(emb[:12], labels[:12], emb, labels, return_per_query=True, ref_includes_query=True)
    _check_against_naive(full, naive_evaluation(emb[:12], labels[:12], emb, labels, table, True), 3)


def test_chunk_size_invariance_and_memory_bound(monkeypatch):
    emb, labels, table = _problem(5, n=30)
    results = []
    for chunk in (1, 4, 30, None):
        ev = RetrievalEvaluator(k_values=K_VALUES, hierarchy=table, chunk_size=chunk, multilabel=True)
        results.append(ev.evaluate(emb, labels, return_per_query=True))
    for other in results[1:]:
        for key, value in results[0]["per_query"].items():
            # equal up to the summation order of differently padded chunks
            assert torch.allclose(value, other["per_query"][key], rtol=0, atol=1e-12, equal_nan=True), key
        assert {k: v for k, v in results[0].items() if k.startswith("num_")} == {
            k: v for k, v in other.items() if k.startswith("num_")
        }
    # the relevance is only ever computed for one chunk of queries
    seen = []
    original = multilabel_eval.multilabel_relevance

    def spy(query_labels, ref_labels, *args, **kwargs):
        seen.append(query_labels.shape[0])
        return original(query_labels, ref_labels, *args, **kwargs)

    monkeypatch.setattr(multilabel_eval, "multilabel_relevance", spy)
    RetrievalEvaluator(hierarchy=table, chunk_size=4).evaluate(emb, labels, multilabel=True)
    assert seen and max(seen) <= 4


def test_one_label_per_item_reductions():
    """One label per item: the binary metrics are the single-label evaluator's; ``h_ap`` uses the graded relevance
    ``l / L`` (not the pop relevance of the single-label ``h_ap``) and ``ndcg`` the gains ``2^(l / L) − 1`` (not
    ``2^l − 1``); both reductions coincide with the single-label values when ``L = 1``."""
    g = torch.Generator().manual_seed(3)
    table = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 1, 0], [4, 2, 1], [5, 2, 1]])
    fine = torch.randint(0, 6, (50,), generator=g)
    emb = torch.randint(-2, 3, (50, 4), generator=g).float()
    multi = RetrievalEvaluator(k_values=K_VALUES, hierarchy=table).evaluate(
        emb, fine[:, None], multilabel=True, return_per_query=True
    )
    single = RetrievalEvaluator(k_values=K_VALUES).evaluate(emb, table[fine], return_per_query=True)
    for key in ("ap", "map_at_r", "recall_at_1", "recall_at_3", "precision_at_3", "ap_level1", "ap_level2"):
        assert multi[key] == pytest.approx(single[key], abs=1e-12), key
    assert multi["mean_label_ap"] == pytest.approx(single["ap"], abs=1e-12)
    for h in range(3):
        key = f"num_queries_without_positives_level{h}"
        assert multi[key] == single[key]
    # graded relevance l / L with the single-label engine
    scores = emb @ emb.T
    levels = level_matrix(table[fine], table[fine])
    mask = ~torch.eye(50, dtype=torch.bool)
    graded = F.hierarchical_average_precision(
        scores, levels, mask, num_levels=3, relevance=torch.arange(4, dtype=torch.float64) / 3
    )
    assert torch.allclose(multi["per_query"]["h_ap"], graded, atol=1e-12, equal_nan=True)
    assert abs(multi["h_ap"] - single["h_ap"]) > 1e-3  # pop relevance (SupRank Eq. 20) differs
    ndcg = graded_ndcg(scores, levels.double() / 3, mask)
    assert torch.allclose(multi["per_query"]["ndcg"], ndcg, atol=1e-12, equal_nan=True)
    assert abs(multi["ndcg"] - single["ndcg"]) > 1e-3  # gains 2^(l/L) − 1 vs 2^l − 1
    # flat (L = 1): every key equals the single-label evaluator's
    flat_multi = RetrievalEvaluator(k_values=K_VALUES).evaluate(emb, fine, multilabel=True)
    flat_single = RetrievalEvaluator(k_values=K_VALUES).evaluate(emb, fine)
    for key, value in flat_multi.items():
        expected = flat_single["ap"] if key == "mean_label_ap" else flat_single[key]
        assert value == pytest.approx(expected, abs=1e-12), key


def test_recall_hit_rule_shares_a_fine_label():
    table = torch.tensor([[0, 0], [1, 0], [2, 1], [3, 1]])
    query = torch.tensor([[1.0, 0.0]])
    query_labels = torch.tensor([[0, 2]])
    # item 0 (score 0.9) shares only the coarse ancestor of label 0; item 1 (0.8) has label 2; item 2 (0.7) nothing
    gallery = torch.tensor([[0.9, 0.0], [0.8, 0.0], [0.7, 0.0]])
    gallery_labels = torch.tensor([[1, -1], [3, 2], [-1, 3]])
    ev = RetrievalEvaluator(k_values=(1, 2), hierarchy=table, metrics=("recall_at_k", "recall_at_k_level"))
    out = ev.evaluate(query, query_labels, gallery, gallery_labels, multilabel=True)
    assert out["recall_at_1"] == 0.0 and out["recall_at_2"] == 1.0  # a shared fine label is a hit
    assert out["recall_at_1_level1"] == 1.0  # a shared coarse ancestor is a hit at level 1 only
    # a tie with a non-sharing item is resolved pessimistically
    tied = gallery.clone()
    tied[1, 0] = 0.9
    out = ev.evaluate(query, query_labels, tied, gallery_labels, multilabel=True)
    assert out["recall_at_1"] == 0.0 and out["recall_at_2"] == 1.0
    # no item shares a fine label: the query has no positive
    out = ev.evaluate(query, torch.tensor([[0]]), gallery[2:], gallery_labels[2:], multilabel=True)
    assert math.isnan(out["recall_at_1"]) and out["num_queries_without_positives"] == 1


def test_mean_label_ap_matches_the_graded_module():
    emb, labels, table = _problem(7, n=32)
    out = RetrievalEvaluator(hierarchy=table, metrics=("mean_label_ap",), chunk_size=6).evaluate(
        emb, labels, multilabel=True, return_per_query=True
    )
    mask = ~torch.eye(32, dtype=torch.bool)
    expected = mean_label_average_precision(emb @ emb.T, labels, labels, mask)
    assert torch.allclose(out["per_query"]["mean_label_ap"], expected, atol=1e-12, equal_nan=True)
    assert set(out["per_query"]) == {"mean_label_ap"}


def test_registry_and_defaults():
    assert METRICS["mean_label_ap"].label == "mean label AP"
    assert report.metric_label("mean_label_ap") == "mean label AP"
    assert "mean_label_ap" not in SINGLE_LABEL_GROUPS and "mean_label_ap" in MULTILABEL_GROUPS
    assert "asi" not in MULTILABEL_GROUPS and "sum_w_ap" not in MULTILABEL_GROUPS
    assert "mean_label_ap" in report.table_keys({"h_ap": 0.5, "mean_label_ap": 0.4})
    emb, labels, table = _problem(1, n=20)
    out = RetrievalEvaluator(hierarchy=table).evaluate(emb, labels, multilabel=True)
    assert "asi" not in out and "sum_w_ap" not in out and "mean_label_ap" in out
    # 2-D labels without multilabel=True stay hierarchical (N, L) levels: no multi-label key
    single = RetrievalEvaluator().evaluate(emb, table[labels[:, 0]])
    assert "mean_label_ap" not in single and "asi" in single
    # the explicit group on single-label data is its one-label reduction, the fine AP
    explicit = RetrievalEvaluator(metrics=("ap", "mean_label_ap")).evaluate(emb, labels[:, 0] % 3)
    assert explicit["mean_label_ap"] == explicit["ap"]


def test_bad_input_raises_naming_the_argument():
    emb, labels, table = _problem(2, n=12)
    ev = RetrievalEvaluator(hierarchy=table)
    bad = labels.clone()
    bad[3, 0] = -2
    with pytest.raises(ValueError, match="query_labels.*-1"):
        ev.evaluate(emb, bad, multilabel=True)
    empty = labels.clone()
    empty[5] = -1
    with pytest.raises(ValueError, match="reference_labels row 5 has no label"):
        ev.evaluate(emb[:4], labels[:4], emb, empty, multilabel=True)
    with pytest.raises(ValueError, match="query_labels row 5 has no label"):
        ev.evaluate(emb, empty, multilabel=True)
    outside = labels.clone()
    outside[0, 0] = 10  # the hierarchy has fine labels 0..9
    with pytest.raises(ValueError, match="query_labels contains fine label 10, which is not in the hierarchy"):
        ev.evaluate(emb, outside, multilabel=True)
    with pytest.raises(ValueError, match="reference_labels contains fine label 10"):
        ev.evaluate(emb[:3], labels[:3], emb, outside, multilabel=True)
    with pytest.raises(ValueError, match=r"query_labels must have shape .* N == query.shape\[0\] == 12"):
        ev.evaluate(emb, labels[:5], multilabel=True)
    with pytest.raises(TypeError, match="query_labels must have an integer dtype"):
        ev.evaluate(emb, labels.float(), multilabel=True)
    with pytest.raises(TypeError, match="multilabel must be a bool"):
        ev.evaluate(emb, labels, multilabel="yes")
    with pytest.raises(ValueError, match=r"metrics \['asi'\] are not defined for multilabel=True"):
        RetrievalEvaluator(metrics=("ap", "asi"), multilabel=True)
    with pytest.raises(ValueError, match=r"metrics \['sum_w_ap'\]"):
        RetrievalEvaluator(metrics=("sum_w_ap",)).evaluate(emb, labels, multilabel=True)
    with pytest.raises(ValueError, match="backend='torch'"):
        RetrievalEvaluator(backend="faiss", multilabel=True)
    with pytest.raises(ValueError, match="ref_includes_query=True: the first len"):
        ev.evaluate(emb[:3], labels[:3].flip(0), emb, labels, multilabel=True, ref_includes_query=True)


def test_accuracy_calculator_multilabel():
    from pml_suprank.metrics import HierarchicalAccuracyCalculator

    emb, labels, table = _problem(4, n=30)
    calc = HierarchicalAccuracyCalculator(hierarchy=table, multilabel=True, k_values=(1, 5), device=torch.device("cpu"))
    out = calc.get_accuracy(emb, labels)
    ref = RetrievalEvaluator(hierarchy=table, k_values=(1, 5)).evaluate(emb, labels, multilabel=True)
    assert {"h_ap", "ndcg", "mean_label_ap", "recall_at_5", "ap_level2", "num_queries_without_positives"} <= set(out)
    assert "asi" not in out and "NMI" not in out  # PML's own metrics need one label per item
    assert "mean_average_precision_at_r" not in out and "map_at_r" in out
    for key, value in out.items():
        assert value == ref[key], key
    # a separate gallery, and include= of the call
    part = calc.get_accuracy(emb[:8], labels[:8], emb[8:], labels[8:], include=("mean_label_ap",))
    sep = RetrievalEvaluator(hierarchy=table).evaluate(emb[:8], labels[:8], emb[8:], labels[8:], multilabel=True)
    assert part["mean_label_ap"] == sep["mean_label_ap"]
    assert {k for k in part if not k.startswith("num_")} == {"mean_label_ap"}
    with pytest.raises(ValueError, match=r"include: PML's metrics \['NMI'\]"):
        calc.get_accuracy(emb, labels, include=("NMI",))
    with pytest.raises(ValueError, match=r"metrics \['asi'\] are not defined for multilabel=True"):
        HierarchicalAccuracyCalculator(include=("asi",), multilabel=True, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="query_labels row 0 has no label"):
        calc.get_accuracy(emb, torch.full_like(labels, -1))
    # single-label calls: mean_label_ap only when named (it repeats "ap")
    single = HierarchicalAccuracyCalculator(device=torch.device("cpu"), k="max_bin_count")
    assert "mean_label_ap" not in single.get_accuracy(emb, labels[:, 0].clamp_min(0) % 4, include=("ap",))
    named = single.get_accuracy(emb, table[labels.max(1).values], include=("ap", "mean_label_ap"))
    assert named["mean_label_ap"] == named["ap"]


def test_device_and_dtype(device, dtype):
    emb, labels, table = _problem(6, n=24)
    ref = RetrievalEvaluator(hierarchy=table).evaluate(emb, labels, multilabel=True)
    ev = RetrievalEvaluator(hierarchy=table, device=device, chunk_size=5, multilabel=True)
    out = ev.evaluate(emb.to(dtype), labels)
    for key, value in ref.items():
        assert out[key] == pytest.approx(value, abs=1e-9, nan_ok=True), key
