"""Tests of pml_suprank.plots: hand-computed precision-recall curves (incl. pessimistic ties), files written, errors."""

from __future__ import annotations

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
    assert plots._relation(labels[0], labels[1]) == "fine"
    assert plots._relation(labels[0], labels[5]) == "coarse"
    assert plots._relation(labels[0], labels[25]) == "negative"
