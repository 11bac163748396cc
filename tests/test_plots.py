"""Tests of pml_suprank.plots: hand-computed precision-recall curves (incl. pessimistic ties), files written, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from pml_suprank import plots  # noqa: E402


def _unit(*rows):
    return torch.nn.functional.normalize(torch.tensor(rows, dtype=torch.float32), dim=1)


def test_precision_recall_hand_computed():
    # query 0: item 1 (positive) at cos 0.8, item 2 (negative) at cos 0.6 -> precision 1 at every recall
    emb = _unit([1.0, 0.0], [0.8, 0.6], [0.6, 0.8])
    labels = torch.tensor([0, 0, 1])
    r, p = plots.precision_recall_curve(emb, labels, max_queries=None, num_points=5)
    np.testing.assert_allclose(r, [0, 0.25, 0.5, 0.75, 1.0])
    # queries: 0 -> [1 (pos), 2] : P=1 ; 1 -> [0 (pos, 0.8), 2 (0.96)] -> neg first: precision 1/2 ; 2 has no positive
    np.testing.assert_allclose(p, [0.75] * 5)


def test_ties_are_pessimistic():
    # the positive and the negative have exactly the same score: the negative is ranked first
    emb = _unit([1.0, 0.0], [0.0, 1.0], [0.0, 1.0])
    labels = torch.tensor([0, 0, 1])
    _, p = plots.precision_recall_curve(emb, labels, max_queries=None, num_points=3)
    # query 0 sees pos/neg tied -> 1/2; query 1 sees neg (1.0) before pos (0.0) -> 1/2; query 2 has no positive
    np.testing.assert_allclose(p, [0.5, 0.5, 0.5])


def test_levels_and_errors():
    emb = _unit([1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9])
    labels = torch.tensor([[0, 0], [1, 0], [2, 1], [3, 1]])
    _, p_coarse = plots.precision_recall_curve(emb, labels, level=1, max_queries=None)
    np.testing.assert_allclose(p_coarse, 1.0)
    with pytest.raises(ValueError, match="no query has a positive"):
        plots.precision_recall_curve(emb, labels, level=0, max_queries=None)
    with pytest.raises(ValueError, match="level must lie in"):
        plots.precision_recall_curve(emb, labels, level=2)
    with pytest.raises(ValueError, match="labels must have shape"):
        plots.precision_recall_curve(emb, labels[:3])
    with pytest.raises(ValueError, match="method must be one of"):
        plots.plot_embedding_map(emb, labels, "x.png", method="umap")


class _Images:
    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return {"image": torch.full((3, 8, 8), i / self.n)}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pca", "auto"])
def test_plot_all_writes_the_files(tmp_path, method):
    g = torch.Generator().manual_seed(0)
    labels = torch.stack([torch.arange(60) // 5, torch.arange(60) // 20], dim=1)
    emb = torch.nn.functional.normalize(
        torch.randn(60, 8, generator=g) + torch.randn(12, 8, generator=g)[labels[:, 0]], dim=1
    )
    files = plots.plot_all(
        emb,
        labels,
        tmp_path,
        label_names=["fine", "coarse"],
        image_dataset=_Images(60),
        compare={"before": torch.nn.functional.normalize(torch.randn(60, 8, generator=g), dim=1)},
    )
    assert files == [
        "precision_recall.png",
        "hierarchical_precision_recall.png",
        "embedding_map.png",
        "retrieval_grid.png",
    ]
    for f in files:
        assert (tmp_path / f).stat().st_size > 1000
    path = plots.plot_embedding_map(emb, labels, tmp_path / "map.png", method=method)
    assert path.is_file()
    assert plots.relevance_level(labels[0].tolist(), labels[1].tolist()) == "fine"
    assert plots.relevance_level(labels[0].tolist(), labels[5].tolist()) == "coarse"
    assert plots.relevance_level(labels[0].tolist(), labels[25].tolist()) == "other"


@pytest.fixture
def figures(monkeypatch):
    """The figures the plotting functions save, kept open for inspection."""
    saved = []

    def keep(fig, path, **kwargs):
        saved.append(fig)
        fig.savefig(path)
        return Path(path)

    monkeypatch.setattr(plots, "save_figure", keep)
    yield saved
    import matplotlib.pyplot as plt

    for fig in saved:
        plt.close(fig)


def test_precision_recall_legend_gives_the_exact_map_of_the_card(figures, tmp_path):
    from pml_suprank.metrics import RetrievalEvaluator

    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(40, 8, generator=g), dim=1)
    labels = torch.arange(40) % 5
    plots.plot_precision_recall(emb, labels, tmp_path / "pr.png", max_queries=None)
    (ax,) = figures[0].axes
    (text,) = [t.get_text() for t in ax.get_legend().get_texts()]
    exact = RetrievalEvaluator(metrics=["ap"]).evaluate(emb, labels)["ap"]
    assert text == f"trained: mAP {100 * exact:.2f}"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("recall", "precision") and "40 of 40 queries" in ax.get_title()


def test_training_curves_show_loss_learning_rates_and_metrics_by_their_card_names(figures, tmp_path):
    history = [
        {"step": 10, "epoch": 0, "loss": 1.4, "lr_backbone": 1e-3, "lr_proxies": 10.0},
        {"step": 20, "epoch": 1, "loss": 1.1, "lr_backbone": 5e-4, "lr_proxies": 5.0},
        {"step": 20, "epoch": 1, "eval/h_ap": 0.3, "eval/recall_at_1": 0.5, "eval/num_queries": 12},
        {"step": 30, "epoch": 2, "loss": 0.9, "lr_backbone": 0.0, "lr_proxies": 0.0},
        {"step": 40, "epoch": 3, "eval/h_ap": 0.4, "eval/recall_at_1": 0.6, "eval/num_queries": 12},
    ]
    path = plots.plot_training_curves(history, tmp_path / "curves.png")
    assert path.is_file() and path.stat().st_size > 0
    loss_ax, lr_ax, metric_ax = figures[0].axes
    np.testing.assert_allclose(loss_ax.lines[0].get_ydata(), [1.4, 1.1, 0.9])
    # linear, relative to each group's peak: the cosine decay to 0 is drawn to the last step (a log axis drops it)
    assert lr_ax.get_yscale() == "linear"
    assert [t.get_text() for t in lr_ax.get_legend().get_texts()] == [
        "backbone (largest 0.001)",
        "proxies (largest 10)",
    ]
    for line in lr_ax.lines:
        np.testing.assert_allclose(line.get_xdata(), [10, 20, 30])
        np.testing.assert_allclose(line.get_ydata(), [1.0, 0.5, 0.0])
    assert [t.get_text() for t in metric_ax.get_legend().get_texts()] == ["H-AP", "R@1"]
    np.testing.assert_allclose(metric_ax.lines[0].get_ydata(), [30.0, 40.0])
    assert metric_ax.get_xlabel() == "optimizer step"
    with pytest.raises(ValueError, match="no loss, learning rate or evaluation"):
        plots.plot_training_curves([{"step": 1, "epoch": 0}], tmp_path / "empty.png")
    with pytest.raises(ValueError, match="history must be a list of records"):
        plots.plot_training_curves([{"loss": 1.0}], tmp_path / "bad.png")


def test_embedding_map_draws_samples_and_class_means(figures, tmp_path):
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(60, 8, generator=g), dim=1)
    labels = torch.stack([torch.arange(60) % 6, torch.arange(60) % 6 // 3], 1)
    plots.plot_embedding_map(emb, labels, tmp_path / "map.png", label_names=["fine", "group"], method="pca")
    (ax,) = figures[0].axes
    sizes = sorted(len(c.get_offsets()) for c in ax.collections)
    assert sum(sizes) == 60 + 6  # every sample and every class mean
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["group 0", "group 1"]
    assert "60 samples" in ax.get_title() and "6 class means" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["0", "1", "2", "3", "4", "5"]  # no names: the ids label the means


def test_embedding_map_and_grid_name_the_classes(figures, tmp_path):
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(24, 8, generator=g), dim=1)
    labels = torch.stack([torch.arange(24) % 4, torch.arange(24) % 4 // 2], 1)
    names = {0: "circle/disc/red", 1: "circle/ring/blue", 2: "star/star5/cyan", 3: "star/star4/cyan"}
    plots.plot_embedding_map(emb, labels, tmp_path / "map.png", label_names=["fine", "shape"], method="pca",
                             class_names=names)  # fmt: skip
    (ax,) = figures[0].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["circle", "star"]  # coarse names from the fine
    assert sorted(t.get_text() for t in ax.texts) == ["disc/red", "ring/blue", "star4/cyan", "star5/cyan"]
    figures.clear()
    plots.plot_retrieval_grid(emb, labels, _Images(24), tmp_path / "grid.png", num_queries=2, top_k=3,
                              class_names=names)  # fmt: skip
    texts = [a.get_xlabel() for a in figures[0].axes]
    assert len(texts) == 2 * 4 and all(t.split(" ", 1)[1] in {n[-18:] for n in names.values()} for t in texts)
    marks = {t.split(" ", 1)[0] for t in texts}
    assert "query" in marks and marks <= {"query", "✓", "~", "✗"}


@pytest.mark.slow
def test_user_names_never_reach_mathtext_and_figures_are_150_dpi(tmp_path):
    g = torch.Generator().manual_seed(1)
    emb = torch.nn.functional.normalize(torch.randn(30, 8, generator=g), dim=1)
    labels = torch.stack([torch.arange(30) % 5, torch.arange(30) % 5 // 3], 1)
    columns = [r"$\undefinedmacro$", "$x^2$ & <b>"]
    names = {i: f"$\\bad{i}$/x" for i in range(5)}
    files = plots.plot_all(emb, labels, tmp_path, label_names=columns, image_dataset=_Images(30), class_names=names)
    history = [{"step": 0, "epoch": 0, "eval/h_ap": 0.2}, {"step": 5, "epoch": 0, "loss": 1.0, "eval/h_ap": 0.3}]
    plots.plot_training_curves(history, tmp_path / "curves.png", label_names=columns)
    from PIL import Image

    for name in [*files, "curves.png"]:
        with Image.open(tmp_path / name) as im:
            assert round(im.info["dpi"][0]) == 150


def test_every_precision_recall_legend_gives_the_map(figures, tmp_path):
    g = torch.Generator().manual_seed(2)
    emb = torch.nn.functional.normalize(torch.randn(40, 8, generator=g), dim=1)
    labels = torch.stack([torch.arange(40) % 8, torch.arange(40) % 8 // 4], 1)
    plots.plot_hierarchical_precision_recall(emb, labels, tmp_path / "h.png", label_names=["fine", "coarse"],
                                             compare={"before": emb.flip(0)}, max_queries=None)  # fmt: skip
    from pml_suprank.metrics import RetrievalEvaluator

    texts = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert len(texts) == 4 and all(": mAP " in t for t in texts)
    exact = RetrievalEvaluator(metrics=["ap"]).evaluate(emb, labels[:, 1])["ap"]
    assert texts[1] == f"coarse (trained): mAP {100 * exact:.2f}"
