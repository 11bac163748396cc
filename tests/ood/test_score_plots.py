"""The OOD score histograms: axis labels, one figure legend, AUROC / FPR95 of every group in each panel's title
(equal to the metrics module's numbers), and a symmetric-log axis for heavy-tailed scores."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("matplotlib")

from pml_suprank.ood.metrics import auroc, fpr_at_tpr  # noqa: E402
from pml_suprank.ood.score_plots import plot_score_histograms  # noqa: E402


@pytest.fixture
def kept_figure(monkeypatch):
    import matplotlib.pyplot as plt

    plt.close("all")
    monkeypatch.setattr(plt, "close", lambda *a, **k: None)
    yield lambda: plt.figure(plt.get_fignums()[-1])
    plt.close("all")


def _scores():
    g = torch.Generator().manual_seed(0)
    heavy_id, heavy_ood = torch.randn(400, generator=g).exp() * 10, torch.randn(300, generator=g).exp() * 1e4
    light_id, light_ood = torch.randn(400, generator=g), torch.randn(300, generator=g) + 2
    return {"Mahalanobis": heavy_id, "Energy": light_id}, {"far": {"Mahalanobis": heavy_ood, "Energy": light_ood}}


def test_panels_are_labelled_with_their_metrics_and_one_legend(kept_figure, tmp_path):
    id_scores, ood_scores = _scores()
    path = plot_score_histograms(id_scores, ood_scores, tmp_path / "h.png")
    assert path.is_file() and path.stat().st_size > 0
    fig = kept_figure()
    heavy, light = fig.axes[:2]
    for ax, name in ((heavy, "Mahalanobis"), (light, "Energy")):
        a, f = auroc(id_scores[name], ood_scores["far"][name]), fpr_at_tpr(id_scores[name], ood_scores["far"][name])
        assert ax.get_title() == f"{name}\nfar: AUROC {100 * a:.1f} · FPR95 {100 * f:.1f}"
        assert ax.get_xlabel().startswith("score (higher = more OOD)") and ax.get_ylabel() == "fraction of the set"
        assert ax.get_legend() is None
    assert heavy.get_xscale() == "symlog" and light.get_xscale() == "linear"
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["ID test", "OOD far"]
    # every set is drawn whole: each histogram's bar heights sum to 1 (outliers counted in the outer bins)
    sums = [sum(p.get_height() for p in container) for container in light.containers]
    assert sums == pytest.approx([1.0, 1.0])


def test_bad_inputs_are_refused_by_name(tmp_path):
    id_scores, ood_scores = _scores()
    with pytest.raises(ValueError, match=r"ood_scores\['far'\] lacks the detectors \['Energy'\]"):
        plot_score_histograms(id_scores, {"far": {"Mahalanobis": ood_scores["far"]["Mahalanobis"]}}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="non-empty and finite"):
        plot_score_histograms(
            {"E": torch.tensor([1.0, float("nan")])}, {"far": {"E": torch.ones(3)}}, tmp_path / "x.png"
        )
    with pytest.raises(ValueError, match="at least one detector"):
        plot_score_histograms({}, {}, tmp_path / "x.png")
