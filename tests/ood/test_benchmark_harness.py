"""The near / far harness: it reproduces the single-set numbers of the existing evaluation (HEAT's reference metrics
on the stored golden scores, and ``ood.metrics`` / ``recipes/fit_heat.py``'s table for every old detector), group
means, outputs (CSV, markdown, figure) and the feature files written by ``recipes/fit_heat.py``."""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import pytest
import torch

from pml_suprank import ood
from pml_suprank.ood import metrics
from pml_suprank.ood.benchmark import METRICS

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _golden_sets(g):
    d = g["derived_features"]
    t = lambda key: torch.tensor(d[key])  # noqa: E731
    train = ood.OODFeatures(
        t("train_avg"), t("train_std"), t("train_logits"), torch.tensor(g["inputs"]["labels_train"])
    )
    test_id = ood.OODFeatures(t("test_id_avg"), t("test_id_std"), t("test_id_logits"))
    test_ood = ood.OODFeatures(t("test_ood_avg"), t("test_ood_std"), t("test_ood_logits"))
    head = {"weight": torch.tensor(g["inputs"]["fc_weight"]), "bias": torch.tensor(g["inputs"]["fc_bias"])}
    return train, test_id, test_ood, head


def test_reproduces_heat_reference_metrics_for_the_energy_score(heat_golden):
    train, test_id, test_ood, _ = _golden_sets(heat_golden)
    result = ood.benchmark({"Energy": ood.Energy()}, test_id, {"far": {"golden-ood": test_ood}}, id_train=train,
                           progress=False)  # fmt: skip
    ref = heat_golden["metrics_heat_reference"]["EL_energy"]
    row = result.row("Energy", "golden-ood")
    assert row["auroc"] == pytest.approx(ref["AUROC"], abs=1e-12)
    assert row["fpr_id_positive"] == pytest.approx(ref["FPR95"], abs=1e-12)
    assert row["aupr_in"] == pytest.approx(ref["AUPR_IN"], abs=1e-9)
    assert row["aupr_out"] == pytest.approx(ref["AUPR_OUT"], abs=1e-9)
    assert result.row("Energy", "mean", "far")["auroc"] == row["auroc"]  # one-set group: the mean is the set


def _old_detectors(head):
    return {
        "MSP": ood.MSP(),
        "MaxLogit": ood.MaxLogit(),
        "Energy": ood.Energy(),
        "Mahalanobis": ood.Mahalanobis(),
        "SSD+": ood.Mahalanobis(normalize=True),
        "KNN": ood.KNN(k=5),
        "ViM": ood.ViM(dim=8, **head),
        "DICE": ood.DICE(p=0.7, **head),
        "ReAct": ood.ReAct(**head),
    }


def test_reproduces_single_set_numbers_of_every_old_detector(heat_golden):
    train, test_id, test_ood, head = _golden_sets(heat_golden)
    half = len(test_ood) // 2
    near = ood.OODFeatures(test_ood.features[:half], test_ood.std_features[:half], test_ood.logits[:half])
    far = ood.OODFeatures(test_ood.features[half:], test_ood.std_features[half:], test_ood.logits[half:])
    detectors = _old_detectors(head)
    result = ood.benchmark(detectors, test_id, {"near": {"a": near}, "far": {"b": far, "all": test_ood}},
                           id_train=train, progress=False)  # fmt: skip
    assert set(result.fit_seconds) == set(detectors)
    for name, det in _old_detectors(head).items():  # fresh detectors, fitted and scored by hand
        det.fit(**train.as_kwargs())
        s_id = det.score(**test_id.as_kwargs())
        for set_name, feats in (("a", near), ("b", far), ("all", test_ood)):
            s = det.score(**feats.as_kwargs())
            row = result.row(name, set_name)
            torch.testing.assert_close(result.scores[name][set_name], s)
            assert row["auroc"] == metrics.auroc(s_id, s)
            assert row["fpr_id_positive"] == metrics.fpr_at_tpr(s_id, s, convention="id_positive")
            assert row["fpr_ood_positive"] == metrics.fpr_at_tpr(s_id, s, convention="ood_positive")
            assert row["aupr_in"] == metrics.aupr_in(s_id, s) and row["aupr_out"] == metrics.aupr_out(s_id, s)
        group = result.row(name, "mean", "far")
        for m in METRICS:
            assert group[m] == pytest.approx((result.row(name, "b")[m] + result.row(name, "all")[m]) / 2)


def test_matches_the_fit_heat_recipe_table(heat_golden):
    fit_heat = importlib.import_module("pml_suprank.recipes.fit_heat")
    train, test_id, test_ood, head = _golden_sets(heat_golden)
    result = ood.benchmark(_old_detectors(head), test_id, {"far": {"x": test_ood}}, id_train=train, progress=False)
    id_scores = {n: s["ID"] for n, s in result.scores.items()}
    table = fit_heat.results_table(id_scores, {"x": {n: s["x"] for n, s in result.scores.items()}}, "id_positive")
    for name, row in table.items():
        assert row["x"]["auroc"] == result.row(name, "x")["auroc"]
        assert row["x"]["fpr95"] == result.row(name, "x")["fpr_id_positive"]


def test_outputs_and_prefitted_detectors(tmp_path, heat_golden):
    train, test_id, test_ood, head = _golden_sets(heat_golden)
    dets = [ood.GEN(), ood.RMDS().fit(**train.as_kwargs()), ood.ASH(percentile=50, **head)]
    result = ood.benchmark(
        dets, test_id, {"near": test_ood}, output_dir=tmp_path, progress=False, ap_method="trapezoid"
    )
    assert list(result.scores) == ["GEN", "RMDS", "ASH"] and result.fit_seconds == {}
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 6 and {r["set"] for r in rows} == {"near", "mean"}
    assert float(rows[0]["auroc"]) == pytest.approx(result.rows[0]["auroc"])
    md = (tmp_path / "results.md").read_text()
    assert "| RMDS | near | mean |" in md and "FPR95 (OOD+)" in md
    png = tmp_path / "score_histograms.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 1000
    assert "AUROC" in str(result)


def test_input_validation(heat_golden):
    train, test_id, test_ood, head = _golden_sets(heat_golden)
    with pytest.raises(ood.NotFittedError, match="RMDS"):
        ood.benchmark([ood.RMDS()], test_id, {"far": test_ood}, progress=False)
    with pytest.raises(ValueError, match="two detectors are named 'KNN'"):
        ood.benchmark([ood.KNN(k=2), ood.KNN(k=3)], test_id, {"far": test_ood}, id_train=train, progress=False)
    with pytest.raises(ValueError, match="used twice"):
        ood.benchmark([ood.MSP()], test_id, {"near": {"x": test_ood}, "far": {"x": test_ood}}, progress=False)
    with pytest.raises(TypeError, match="id_test"):
        ood.benchmark([ood.MSP()], [1, 2], {"far": test_ood}, progress=False)
    with pytest.raises(ValueError, match="ood_sets must be"):
        ood.benchmark([ood.MSP()], test_id, {}, progress=False)
    with pytest.raises(TypeError, match="must be an ood.Detector"):
        ood.benchmark({"x": object()}, test_id, {"far": test_ood}, progress=False)
    with pytest.raises(ValueError, match="tpr"):
        ood.benchmark([ood.MSP()], test_id, {"far": test_ood}, tpr=0.0, progress=False)


def test_feature_file_round_trip_and_tampering(tmp_path, heat_golden):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    train, test_id, test_ood, head = _golden_sets(heat_golden)
    path = ood.save_features(tmp_path / "f.safetensors", {"id_train": train, "id_test": test_id, "x.y:z": test_ood},
                             metadata={"backbone": "toy"}, **head)  # fmt: skip
    saved = ood.load_features(path)
    assert list(saved.sets) == ["id_train", "id_test", "x.y:z"] and saved.metadata == {"backbone": "toy"}
    torch.testing.assert_close(saved.sets["id_train"].labels, train.labels)
    torch.testing.assert_close(saved.sets["x.y:z"].std_features, test_ood.std_features)
    torch.testing.assert_close(saved.weight, head["weight"])
    state = safetensors_torch.load_file(path)
    with safetensors_torch.safe_open(path, "pt") as f:
        header = f.metadata()
    for key, bad, match in [
        ("0.features", None, "has no tensor '0.features'"),
        ("1.logits", state["1.logits"][:3], r"'1.logits' has shape \(3, .*dimension 0 must be"),
        ("2.features", state["2.features"].clone().fill_(float("nan")), "NaN"),
        ("0.labels", state["0.labels"].double(), "'0.labels' must be a integer tensor"),
        ("head.weight", state["head.weight"][:, :3].contiguous(), r"dimension 1 must be 3 \(D, as .*'head.weight'"),
        ("payload", torch.zeros(2), r"holds tensors \['payload'\] that are not part of the state"),
    ]:
        broken = {k: v for k, v in state.items() if k != key}
        if bad is not None:
            broken[key] = bad
        safetensors_torch.save_file(broken, path, metadata=header)
        with pytest.raises(ValueError, match=match) as info:
            ood.load_features(path)
        assert str(path) in str(info.value)
    safetensors_torch.save_file(state, path, metadata={"format": "other"})
    with pytest.raises(ValueError, match="not a feature file"):
        ood.load_features(path)
