"""HierarchicalAccuracyCalculator used the way PML users and PML's own testers use AccuracyCalculator: float
labels, custom label comparisons, standalone metric functions, PML's global testers (one- and two-stream)."""

import pytest
import torch
from pytorch_metric_learning import testers
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from pml_suprank.metrics import HierarchicalAccuracyCalculator, RetrievalEvaluator

PML_METRICS = ("precision_at_1", "mean_average_precision_at_r", "r_precision", "mean_reciprocal_rank")


def _knn_kwargs():
    return dict(k="max_bin_count", device=torch.device("cpu"))


def _data(n=60, d=8, classes=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centers = torch.randn(classes, d, generator=g)
    emb = torch.nn.functional.normalize(torch.randn(n, d, generator=g) + 2 * centers[labels])
    return emb, labels


def test_float_labels_give_pmls_values_and_ours():
    """The issue's reproduction: PML returns values for float labels; ours did raise TypeError."""
    torch.manual_seed(0)
    emb = torch.randn(6, 4)
    float_labels = torch.tensor([0.0, 0, 1, 1, 2, 2])
    pml = AccuracyCalculator(include=("precision_at_1",), **_knn_kwargs()).get_accuracy(emb, float_labels)
    ours = HierarchicalAccuracyCalculator(include=("precision_at_1", "ap"), **_knn_kwargs()).get_accuracy(
        emb, float_labels
    )
    assert ours["precision_at_1"] == pytest.approx(pml["precision_at_1"])
    expected_ap = RetrievalEvaluator(metrics=["ap"]).evaluate(emb, float_labels.long())["ap"]
    assert ours["ap"] == pytest.approx(expected_ap)


def test_float_labels_match_integer_labels_for_every_metric():
    emb, labels = _data()
    calc = HierarchicalAccuracyCalculator(**_knn_kwargs())
    as_int = calc.get_accuracy(emb, labels)
    as_float = calc.get_accuracy(emb, labels.double())
    assert as_int.keys() == as_float.keys()
    for key in as_int:
        assert as_float[key] == pytest.approx(as_int[key]), key


@pytest.mark.parametrize("bad", [torch.tensor([0.0, 0.5, 1, 1]), torch.tensor([0.0, float("nan"), 1, 1])])
def test_non_integer_float_labels_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="query_labels"):
        HierarchicalAccuracyCalculator(**_knn_kwargs()).get_accuracy(torch.randn(4, 3), bad)


def test_label_comparison_fn_with_2d_labels_matches_pml():
    """The issue's reproduction: PML gives 0.333, ours raised IndexError (or 'is not a tree')."""

    def fn(a, b):
        return (a[..., 0] == b[..., 0]) & (a[..., 1] != b[..., 1])

    torch.manual_seed(0)
    query, reference = torch.randn(3, 4), torch.randn(3, 4)
    ql = torch.tensor([(0, 2), (0, 2), (1, 2)])
    rl = torch.tensor([(1, 3), (0, 3), (0, 3)])
    kwargs = dict(include=("precision_at_1",), label_comparison_fn=fn, **_knn_kwargs())
    pml = AccuracyCalculator(**kwargs).get_accuracy(query, ql, reference, rl)
    ours = HierarchicalAccuracyCalculator(**kwargs).get_accuracy(query, ql, reference, rl)
    assert ours == pytest.approx(pml)


def test_label_comparison_fn_skips_added_metrics_with_a_warning():
    emb, labels = _data()

    def fn(a, b):
        return a == b

    calc = HierarchicalAccuracyCalculator(include=("precision_at_1", "ap", "h_ap"), label_comparison_fn=fn,
                                          **_knn_kwargs())  # fmt: skip
    with pytest.warns(UserWarning, match=r"\['ap', 'h_ap'\]"):
        out = calc.get_accuracy(emb, labels)
    assert set(out) == {"precision_at_1"}
    pml = AccuracyCalculator(include=("precision_at_1",), **_knn_kwargs()).get_accuracy(emb, labels)
    assert out["precision_at_1"] == pytest.approx(pml["precision_at_1"])


def test_every_function_of_get_function_dict_runs_the_way_pml_calls_it():
    """PML's ``_get_accuracy(AC.get_function_dict(), **kwargs)`` raised KeyError: 'ap' for our added metrics."""
    emb, labels = _data()
    calc = HierarchicalAccuracyCalculator(include=("ap", "map_at_r", "h_ap", "ndcg", "recall_at_k", "ap_level"),
                                          **_knn_kwargs())  # fmt: skip
    kwargs = {
        "query": emb,
        "reference": emb,
        "query_labels": labels.float(),  # as PML's get_accuracy hands them over
        "reference_labels": labels.float(),
        "ref_includes_query": True,
        "label_comparison_fn": calc.label_comparison_fn,
    }
    standalone = calc._get_accuracy(calc.get_function_dict(), **kwargs)
    whole = calc.get_accuracy(emb, labels, include=("ap", "map_at_r", "h_ap", "ndcg", "recall_at_k", "ap_level"))
    flat = {}
    for value in standalone.values():
        flat.update(value if isinstance(value, dict) else {})
    flat.update({k: v for k, v in standalone.items() if not isinstance(v, dict)})
    for key in ("ap", "map_at_r", "h_ap", "ndcg", "recall_at_1", "ap_level0"):
        assert flat[key] == pytest.approx(whole[key]), key


def test_standalone_function_without_inputs_says_what_it_needs():
    calc = HierarchicalAccuracyCalculator(include=("ap",), **_knn_kwargs())
    with pytest.raises(ValueError, match="query"):
        calc.get_function_dict()["ap"](knn_labels=torch.zeros(2, 1))


class _Pairs(torch.utils.data.Dataset):
    """(anchor, posneg, label) triples for the two-stream tester; labels as PML's datasets give them."""

    def __init__(self, n=48, d=8, classes=6):
        emb, labels = _data(n, d, classes)
        self.a, self.p, self.labels = emb, emb.roll(1, 0) + 0.05, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.a[i], self.p[i], self.labels[i]


class _Items(torch.utils.data.Dataset):
    def __init__(self, n=48, d=8, classes=6):
        self.x, self.labels = _data(n, d, classes)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.x[i], self.labels[i]


TESTERS = [testers.GlobalEmbeddingSpaceTester, testers.GlobalTwoStreamEmbeddingSpaceTester]


@pytest.mark.parametrize("tester_cls", TESTERS)
def test_pml_testers_run_end_to_end_with_our_calculator(tester_cls):
    include = ("precision_at_1", "mean_average_precision_at_r", "ap", "h_ap")
    dataset = _Pairs() if tester_cls is testers.GlobalTwoStreamEmbeddingSpaceTester else _Items()
    results = {}
    for name, calc in {
        "pml": AccuracyCalculator(include=include[:2], **_knn_kwargs()),
        "ours": HierarchicalAccuracyCalculator(include=include, **_knn_kwargs()),
    }.items():
        tester = tester_cls(accuracy_calculator=calc, dataloader_num_workers=0, batch_size=16)
        results[name] = tester.test({"val": dataset}, epoch=1, trunk_model=torch.nn.Identity())["val"]
    for key in ("precision_at_1_level0", "mean_average_precision_at_r_level0"):
        assert results["ours"][key] == pytest.approx(results["pml"][key]), key
    assert 0.0 <= results["ours"]["ap_level0"] <= 1.0
    assert 0.0 <= results["ours"]["h_ap_level0"] <= 1.0


def _knn_only_kwargs():
    """PML's kNN-only inputs: six queries, their five nearest labels and the label counts of the reference set."""
    return {
        "query_labels": torch.tensor([1, 1, 2, 3, 4, 0]),
        "knn_labels": torch.tensor(
            [[0, 1, 1, 2, 2], [1, 0, 1, 1, 3], [4, 4, 4, 4, 2], [3, 1, 3, 1, 3], [0, 0, 4, 2, 2], [1, 2, 3, 4, 5]]
        ),
        "label_counts": ([0, 1, 2, 3, 4], [2, 3, 5, 4, 5]),
        "not_lone_query_mask": torch.ones(6, dtype=torch.bool),
        "ref_includes_query": False,
    }


def test_knn_only_get_accuracy_gives_pmls_values_and_warns_once_for_ours():
    ours = HierarchicalAccuracyCalculator(exclude=("NMI", "AMI"))
    theirs = AccuracyCalculator(exclude=("NMI", "AMI"))
    with pytest.warns(UserWarning, match="need the embeddings") as record:
        got = ours._get_accuracy(ours.get_function_dict(), **_knn_only_kwargs())
    assert len([w for w in record if "need the embeddings" in str(w.message)]) == 1
    want = theirs._get_accuracy(theirs.get_function_dict(), **_knn_only_kwargs())
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key
    # precision@1 by hand: the nearest label equals the query label for queries 1 and 3 of six
    assert got["precision_at_1"] == pytest.approx(
        sum(int(a == b) for a, b in zip([0, 1, 4, 3, 0, 1], [1, 1, 2, 3, 4, 0])) / 6
    )


def test_pmls_positional_arguments_keep_pmls_meaning():
    ours = HierarchicalAccuracyCalculator(("precision_at_1",), (), True, False, 5)
    theirs = AccuracyCalculator(("precision_at_1",), (), True, False, 5)
    assert (ours.avg_of_avgs, ours.return_per_class, ours.k) == (theirs.avg_of_avgs, theirs.return_per_class, 5)
    with pytest.raises(ValueError):  # PML's own refusal of avg_of_avgs together with return_per_class
        HierarchicalAccuracyCalculator((), (), True, True)
