"""metrics.report: labels, headline keys and printed tables derived from the registry reproduce the model card
(hub), the training progress line and the recipes' tables."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from pml_suprank.metrics import report
from pml_suprank.metrics.registry import METRIC_GROUPS, METRICS

FULL = {
    "ap": 0.5681,
    "map_at_r": 0.4503,
    "r_precision": 0.47,
    "precision_at_1": 0.773,
    "recall_at_1": 0.773,
    "true_recall_at_1": 0.773,
    "map_at_1": 0.773,
    "recall_at_10": 0.91,
    "precision_at_10": 0.31,
    "true_recall_at_10": 0.52,
    "map_at_10": 0.44,
    "ap_level0": 0.5681,
    "map_at_r_level0": 0.4503,
    "recall_at_1_level0": 0.773,
    "recall_at_10_level0": 0.91,
    "ap_level1": 0.83,
    "map_at_r_level1": 0.61,
    "recall_at_1_level1": 0.95,
    "recall_at_10_level1": 0.99,
    "ap_level2": 0.9,
    "ap_level10": 0.95,
    "h_ap": 0.7128,
    "ndcg": 0.989,
    "asi": 0.9948,
    "sum_w_ap": 0.7,
    "num_queries": 10000,
    "num_queries_without_positives": 0,
    "num_queries_without_relevant": 0,
    "num_queries_without_positives_level0": 0,
}
FINE_ONLY = {"ap": 0.25, "map_at_r": 0.125, "precision_at_1": 0.5, "recall_at_1": 0.5, "num_queries": 4}
HIER_ONLY = {"h_ap": 0.3338, "ndcg": 0.7162, "ap_level1": 0.2, "ap_level0": 0.1}
CASES = (FULL, FINE_ONLY, HIER_ONLY, {})
ODD_KEYS = ("foo", "recall_at_", "recall_at_x_level1", "h_ap_level0", "true_recall_at_5_level2", "ap_levelx", "num_x")


def test_labels_literal():
    assert report.metric_label("ap") == "mAP"
    assert report.metric_label("ap_level1") == "AP (level 1)"
    assert report.metric_label("ap_level1", ["fine", "coarse"]) == "AP (coarse)"
    assert report.metric_label("ap_level3", ["fine", "coarse"]) == "AP (level 3)"
    assert report.metric_label("map_at_r") == "mAP@R"
    assert report.metric_label("map_at_r_level0", ("product",)) == "mAP@R (product)"
    assert report.metric_label("recall_at_10") == "R@10"
    assert report.metric_label("recall_at_1_level1", ("fine", "coarse")) == "R@1 (coarse)"
    assert report.metric_label("precision_at_1") == "P@1"
    assert report.metric_label("precision_at_100") == "P@100"
    assert report.metric_label("true_recall_at_10") == "true recall@10"
    assert report.metric_label("map_at_10") == "mAP@10"
    assert report.metric_label("h_ap") == "H-AP"
    assert report.metric_label("ndcg") == "NDCG"
    assert report.metric_label("asi") == "ASI"
    assert report.metric_label("sum_w_ap") == "ΣwAP"
    assert report.metric_label("r_precision") == "R-precision"
    assert report.metric_label("num_queries") == "num_queries"
    assert report.metric_label("num_queries_without_positives_level0") == "num_queries_without_positives (level 0)"


def test_headline_progress_and_tables_literal():
    assert report.HEADLINE_KEYS == ("h_ap", "ndcg", "asi", "ap", "map_at_r", "recall_at_1")
    assert report.PROGRESS_KEYS == ("h_ap", "ndcg", "asi", "ap", "recall_at_1")
    assert report.headline_keys(FINE_ONLY) == ["ap", "map_at_r", "recall_at_1"]
    assert report.headline_keys(HIER_ONLY, {"recall_at_1": 80.0, "ndcg_at_5": 1.0}) == [
        "h_ap",
        "ndcg",
        "recall_at_1",
        "ndcg_at_5",
    ]
    assert report.table_keys(FULL) == [
        "h_ap", "ndcg", "asi", "ap_level1", "ap_level2", "ap_level10", "ap", "map_at_r", "recall_at_1",
    ]  # fmt: skip
    assert report.format_metrics(HIER_ONLY, short=True) == "h_ap=0.3338  ndcg=0.7162"
    assert report.format_metrics(FINE_ONLY) == "ap=0.2500  recall_at_1=0.5000  map_at_r=0.1250"
    assert report.format_metrics(HIER_ONLY) == "h_ap=0.3338  ndcg=0.7162  ap_level0=0.1000  ap_level1=0.2000"
    assert report.one_column(FINE_ONLY) == (
        "ap                  0.2500\nmap_at_r            0.1250\nrecall_at_1         0.5000\n"
        "ap = average precision of the fine label over the whole gallery · map_at_r = mAP@R (Musgrave et al.) · "
        "recall_at_{k} = hit rate: 1 if a positive is in the top k (recall_at_1 = precision_at_1, printed once)"
    )
    assert report.one_column(FINE_ONLY, legend=False).count("\n") == 2
    assert report.one_column({}) == ""
    table = report.format_metrics_table({"ap": 0.2, "h_ap": 0.1}, {"ap": 0.25, "h_ap": 0.3338, "map_at_r": 0.5})
    assert table == (
        "metric              before     after    change\n"
        "h_ap                0.1000    0.3338   +0.2338\n"
        "ap                  0.2000    0.2500   +0.0500\n"
        "map_at_r               nan    0.5000      +nan\n"
        "h_ap = hierarchical AP (SupRank Eq. 19, pop relevance Eq. 20) · "
        "ap = average precision of the fine label over the whole gallery · map_at_r = mAP@R (Musgrave et al.)"
    )
    assert report.format_metrics_table({}, {"ap": 1.0}, keys=["ap"]).splitlines()[1] == (
        "ap                     nan    1.0000      +nan"
    )
    assert report.format_metrics_table({}, {"foo": 1.0}, keys=["foo"], legend=True).count("\n") == 1


def test_each_number_printed_once_with_a_legend():
    """ap = ap_level0 and recall_at_1 = precision_at_1 by definition: one row each, the legend names the key kept;
    a per-level metric is described once by its pattern, with the level-0 convention."""
    lines = report.one_column(FULL).splitlines()
    rows, legend = lines[:-1], lines[-1]
    assert [r.split()[0] for r in rows] == report.table_keys(FULL)
    values = [r.split()[1] for r in rows]
    assert len(values) == len(set(values)), rows  # no number printed twice
    assert legend.split(" · ") == [
        "h_ap = hierarchical AP (SupRank Eq. 19, pop relevance Eq. 20)",
        "ndcg = NDCG (SupRank Eq. 23)",
        "asi = average set intersection (SupRank App. C-A1)",
        "ap_level{h} = AP with positives sharing label column h (0 = finest)",
        "ap = average precision of the fine label over the whole gallery (ap = ap_level0, printed once)",
        "map_at_r = mAP@R (Musgrave et al.)",
        "recall_at_{k} = hit rate: 1 if a positive is in the top k (recall_at_1 = precision_at_1, printed once)",
    ]
    table = report.format_metrics_table(FULL, FULL).splitlines()
    assert [r.split()[0] for r in table[1:-1]] == report.table_keys(FULL) and table[-1] == legend
    # only the keys shown are described; an alias whose kept key is absent is printed under its own name
    assert report.one_column(HIER_ONLY).splitlines()[-1] == (
        "h_ap = hierarchical AP (SupRank Eq. 19, pop relevance Eq. 20) · ndcg = NDCG (SupRank Eq. 23) · "
        "ap_level{h} = AP with positives sharing label column h (0 = finest)"
    )
    # a different value (not the evaluator's) is never hidden
    assert "precision_at_1" in report.table_keys({**FINE_ONLY, "precision_at_1": 0.4})
    assert report.same_as("ap_level0") == "ap"
    assert report.same_as("map_at_r_level0") == "map_at_r"
    assert report.same_as("recall_at_5_level0") == "recall_at_5"
    assert report.same_as("precision_at_1") == "recall_at_1"
    assert [report.same_as(k) for k in ("ap_level1", "recall_at_1", "precision_at_5", *ODD_KEYS)] == [None] * 10
    # the evaluator's own numbers: the duplicated keys are equal and left out
    import torch

    from pml_suprank.metrics import RetrievalEvaluator

    g = torch.Generator().manual_seed(0)
    emb = torch.randn(40, 8, generator=g)
    labels = torch.stack([torch.arange(40) % 8, torch.arange(40) % 8 // 4], 1)
    out = RetrievalEvaluator().evaluate(emb, labels)
    assert out["ap"] == out["ap_level0"] and out["recall_at_1"] == out["precision_at_1"]
    assert "ap_level0" not in report.table_keys(out) and "precision_at_1" not in report.table_keys(out)


def test_registry_is_consistent():
    assert tuple(METRIC_GROUPS) == tuple(METRICS)
    assert len(METRICS) == 16
    for name, spec in METRICS.items():
        assert spec.name == name and METRIC_GROUPS[name] == spec.key
        assert ("{h}" in spec.key) == spec.per_level
        assert not (spec.per_level and spec.hierarchical)
        assert report.metric_label(spec.format_key(k=5, h=0)) not in ("", spec.format_key(k=5, h=0)), name
    with pytest.raises(TypeError):
        METRICS["x"] = METRICS["ap"]  # read-only


def test_model_card_results_use_the_registry_labels():
    """The model card's results table: headline metrics first, labels from the registry, percent, level names."""
    hub = importlib.import_module("pml_suprank.hub")
    metrics = {"ap": 0.5681, "map_at_r": 0.4503, "recall_at_1": 0.773, "ap_level1": 0.83, "h_ap": 0.7128}
    card = hub.generate_model_card({"training": {"label_names": ["fine", "coarse"]}}, metrics=metrics)
    results = card[card.index("## Results") :]
    rows = [line for line in results.splitlines() if line.startswith("| ") and not line.startswith("| metric")]
    assert rows == [
        "| H-AP | 71.28 |",
        "| mAP | 56.81 |",
        "| mAP@R | 45.03 |",
        "| R@1 | 77.30 |",
        "| AP (coarse) | 83.00 |",
    ]


@pytest.mark.slow
def test_no_copy_of_the_report_helpers_outside_metrics_report():
    """The model card, the training progress line and the recipes' tables format through metrics.report: no other
    module of the package or the recipes defines a function of the same name (a copy would drift)."""
    root = Path(__file__).resolve().parents[2]
    names = {"metric_label", "headline_keys", "format_metrics", "one_column", "format_metrics_table", "table_keys"}
    sources = [*(root / "pml_suprank").rglob("*.py"), *(root / "recipes").glob("*.py")]
    assert len(sources) > 20
    copies = []
    for path in sources:
        if path == root / "pml_suprank" / "metrics" / "report.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.lstrip("_") in names:
                copies.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert copies == []
    defined = {
        n.name
        for n in ast.parse((root / "pml_suprank/metrics/report.py").read_text()).body
        if isinstance(n, ast.FunctionDef)
    }
    assert names <= defined


def test_headline_keys_follow_the_headline_order_then_the_paper_keys():
    headline = report.HEADLINE_KEYS
    for metrics in CASES:
        paper = {"recall_at_1": 1.0, "extra": 2.0}
        rates = {k: v for k, v in metrics.items() if not k.startswith("num_")}
        main = [k for k in headline if k in rates or k in paper]
        main += [k for k in paper if k not in main]
        assert report.headline_keys(metrics, paper) == main
        assert report.headline_keys(metrics) == [k for k in headline if k in rates]
