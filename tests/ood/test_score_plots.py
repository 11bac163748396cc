"""The OOD score histograms: one row per detector and one panel per group (near and far apart), every set in its own
colour with its AUROC / FPR95 (equal to the metrics module's numbers) in the legend, the FPR convention stated,
150 dpi, names drawn literally, and a symmetric-log axis for heavy-tailed scores."""

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


@pytest.mark.slow
def test_one_row_per_detector_near_and_far_apart_every_set_with_its_metrics(kept_figure, tmp_path):
    id_scores, ood_scores = _scores()
    g = torch.Generator().manual_seed(1)
    sets = {
        "far": ood_scores["far"],
        "noise": {
            "Mahalanobis": torch.randn(200, generator=g).exp() * 3e4,
            "Energy": torch.randn(200, generator=g) + 4,
        },
        "near $x$": {"Mahalanobis": torch.randn(100, generator=g).exp() * 30, "Energy": torch.randn(100, generator=g)},
    }
    groups = {"near": ["near $x$"], "far": ["far", "noise"]}
    path = plot_score_histograms(id_scores, sets, tmp_path / "h.png", groups=groups)
    from PIL import Image

    with Image.open(path) as im:
        assert round(im.info["dpi"][0]) == 150
    fig = kept_figure()
    assert len(fig.axes) == 4  # 2 detectors x 2 groups
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["Mahalanobis — near", "Mahalanobis — far", "Energy — near", "Energy — far"]
    heavy_far, light_far = fig.axes[1], fig.axes[3]
    texts = [t.get_text() for t in light_far.get_legend().get_texts()]
    assert texts[0] == "ID test" and len(texts) == 3  # every far set apart, each with its own numbers
    for text, name in zip(texts[1:], ["far", "noise"]):
        a, f = auroc(id_scores["Energy"], sets[name]["Energy"]), fpr_at_tpr(id_scores["Energy"], sets[name]["Energy"])
        assert text == f"{name}: AUROC {100 * a:.1f} · FPR95 {100 * f:.1f}"
    assert [t.get_text() for t in fig.axes[2].get_legend().get_texts()][1].startswith("near \\$x\\$: AUROC")
    assert heavy_far.get_xscale() == "symlog" and light_far.get_xscale() == "linear"
    assert (
        light_far.get_xlabel().startswith("score (higher = more OOD)")
        and light_far.get_ylabel() == "fraction of the set"
    )
    assert "share of OOD accepted at the threshold keeping 95 % of ID (ID positive)" in fig._suptitle.get_text()
    # every set is drawn whole: each histogram's bar heights sum to 1 (outliers counted in the outer bins)
    id_bars = light_far.containers[0]
    assert sum(p.get_height() for p in id_bars) == pytest.approx(1.0)


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
    with pytest.raises(ValueError, match=r"groups\['near'\] must name sets"):
        plot_score_histograms(id_scores, ood_scores, tmp_path / "x.png", groups={"near": ["svhn"]})
