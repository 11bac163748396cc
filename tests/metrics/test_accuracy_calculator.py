"""HierarchicalAccuracyCalculator: PML compatibility and the added exact metrics."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.distances import DotProductSimilarity
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN

from pml_suprank.metrics import HierarchicalAccuracyCalculator, RetrievalEvaluator

PML_METRICS = ("precision_at_1", "mean_average_precision_at_r", "r_precision")


def _data(n=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, 3, (n,), generator=g)
    fine = coarse * 8 + torch.randint(0, 8, (n,), generator=g)
    emb = torch.randn(n, 16, generator=g) + 1.5 * torch.nn.functional.one_hot(fine % 16, 16).float()
    return torch.nn.functional.normalize(emb, dim=1), torch.stack([fine, coarse], 1)


def _knn():
    return CustomKNN(DotProductSimilarity())


@pytest.mark.parametrize("disjoint", [False, True])
def test_exact_metrics_equal_pml_on_tie_free_data(disjoint):
    emb, labels = _data()
    args = (emb[:50], labels[:50], emb[50:], labels[50:]) if disjoint else (emb, labels)
    pml = AccuracyCalculator(include=PML_METRICS, k="max_bin_count", knn_func=_knn(), device=torch.device("cpu"))
    pml_args = (args[0], args[1][:, 0]) + ((args[2], args[3][:, 0]) if disjoint else ())
    expected = pml.get_accuracy(*pml_args)
    ours = RetrievalEvaluator(k_values=(1,)).evaluate(*args)
    assert ours["map_at_r"] == pytest.approx(expected["mean_average_precision_at_r"], abs=1e-6)
    assert ours["precision_at_1"] == pytest.approx(expected["precision_at_1"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(expected["r_precision"], abs=1e-6)


def test_subclass_accepts_2d_labels_and_adds_metrics():
    emb, labels = _data(seed=1)
    calc = HierarchicalAccuracyCalculator(
        include=PML_METRICS + ("h_ap", "ap_level", "recall_at_k", "map_at_r"),
        k="max_bin_count",
        knn_func=_knn(),
        device=torch.device("cpu"),
        k_values=(1, 5),
    )
    assert isinstance(calc, AccuracyCalculator)
    out = calc.get_accuracy(emb, labels)
    for key in ("h_ap", "ap_level0", "ap_level1", "recall_at_1", "recall_at_5", "map_at_r", "num_queries"):
        assert key in out
    assert "ndcg" not in out
    assert out["map_at_r"] == pytest.approx(out["mean_average_precision_at_r"], abs=1e-6)
    assert out["recall_at_1"] == pytest.approx(out["precision_at_1"], abs=1e-6)
    ref = RetrievalEvaluator(k_values=(1, 5)).evaluate(emb, labels)
    assert out["h_ap"] == pytest.approx(ref["h_ap"], abs=1e-12)
    # PML-style separate gallery with the queries first (ref_includes_query)
    out2 = calc.get_accuracy(emb[:40], labels[:40], emb, labels, ref_includes_query=True, include=("h_ap",))
    assert set(out2) - {k for k in out2 if k.startswith("num_")} == {"h_ap"}


def test_large_labels_are_not_merged_by_pml_float_cast():
    emb, labels = _data(seed=2)
    big = labels.clone()
    big[:, 0] = labels[:, 0] * 2 + 2**24  # consecutive values that float32 would merge
    calc = HierarchicalAccuracyCalculator(include=("precision_at_1",), knn_func=_knn(), device=torch.device("cpu"))
    a = calc.get_accuracy(emb, big)["precision_at_1"]
    b = calc.get_accuracy(emb, labels)["precision_at_1"]
    assert a == pytest.approx(b)


def test_errors():
    with pytest.raises(ValueError):
        HierarchicalAccuracyCalculator(include=("not_a_metric",))
    emb, labels = _data(n=20, seed=3)
    calc = HierarchicalAccuracyCalculator(include=("h_ap",), device=torch.device("cpu"))
    with pytest.raises(ValueError, match="same length"):
        calc.get_accuracy(emb, labels[:-1])
    with pytest.raises(ValueError, match="same number of levels"):
        calc.get_accuracy(emb[:5], labels[:5], emb[5:], labels[5:, :1])


def test_calculate_methods_are_generated_from_the_registry_and_found_by_pml():
    from pml_suprank.metrics.registry import METRICS

    calc = HierarchicalAccuracyCalculator(knn_func=_knn(), device=torch.device("cpu"))
    found = set(calc.get_curr_metrics())  # PML's discovery through dir(self)
    for name in METRICS:
        assert name in found, name
        assert callable(getattr(calc, f"calculate_{name}"))
    # groups PML defines itself keep PML's implementation
    assert HierarchicalAccuracyCalculator.calculate_precision_at_1 is AccuracyCalculator.calculate_precision_at_1
    assert HierarchicalAccuracyCalculator.calculate_r_precision is AccuracyCalculator.calculate_r_precision
    assert {"NMI", "AMI", "mean_average_precision_at_r"} <= found
    # a group that only the registry defines is computed through its generated method
    emb, labels = _data(n=60, seed=4)
    out = HierarchicalAccuracyCalculator(
        include=("true_recall_at_k", "map_at_r_level"), k_values=(2,), device=torch.device("cpu")
    ).get_accuracy(emb, labels)
    ref = RetrievalEvaluator(k_values=(2,)).evaluate(emb, labels)
    assert {k for k in out if not k.startswith("num_")} == {"true_recall_at_2", "map_at_r_level0", "map_at_r_level1"}
    for key in ("true_recall_at_2", "map_at_r_level0", "map_at_r_level1"):
        assert out[key] == ref[key]


def test_one_name_per_number_unless_asked():
    emb, labels = _data(seed=5)
    kw = dict(k="max_bin_count", knn_func=_knn(), device=torch.device("cpu"), k_values=(1, 5))
    pml = AccuracyCalculator(include=PML_METRICS, **{k: kw[k] for k in ("k", "knn_func", "device")})
    expected = pml.get_accuracy(emb, labels[:, 0])
    # default include: PML's names only where PML computes the same number
    out = HierarchicalAccuracyCalculator(**kw).get_accuracy(emb, labels)
    assert "mean_average_precision_at_r" in out and "map_at_r" not in out
    assert "precision_at_1" in out and "recall_at_1" not in out
    assert {"recall_at_5", "precision_at_5", "map_at_5", "h_ap", "ap", "ap_level1", "map_at_r_level0"} <= set(out)
    for name in PML_METRICS:
        assert out[name] == pytest.approx(expected[name], abs=1e-12), name
    # named in include (constructor or call): both names
    calc = HierarchicalAccuracyCalculator(**kw)
    both = calc.get_accuracy(emb, labels, include=("mean_average_precision_at_r", "map_at_r", "precision_at_1"))
    assert set(both) - {k for k in both if k.startswith("num_")} == {
        "mean_average_precision_at_r",
        "map_at_r",
        "precision_at_1",
    }
    # PML not computing its metric: ours is added
    no_pml = HierarchicalAccuracyCalculator(exclude=("mean_average_precision_at_r",), **kw).get_accuracy(emb, labels)
    assert "map_at_r" in no_pml and "mean_average_precision_at_r" not in no_pml
    # a key spelled like PML's keeps PML's value, even when asked for
    same = HierarchicalAccuracyCalculator(include=("precision_at_1", "precision_at_k"), **kw).get_accuracy(emb, labels)
    assert same["precision_at_1"] == pytest.approx(expected["precision_at_1"], abs=1e-12)
    assert "precision_at_5" in same


def test_non_finite_query_is_named_not_reported_as_a_reference_mismatch():
    """NaN queries (reference = the queries) used to reach PML's ref_includes_query check: 'the first len(query)
    elements of reference must be equal to query' (NaN != NaN)."""
    query = torch.randn(6, 4)
    query[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"query contains NaN or inf values \(in 1 of 6 rows\)"):
        HierarchicalAccuracyCalculator(exclude=("AMI", "NMI")).get_accuracy(query, torch.tensor([0, 0, 1, 1, 2, 2]))
