"""recipes/ood_benchmark.py: from a feature file (fast) and end to end on tiny SyntheticShapes (slow)."""

from __future__ import annotations

import csv
import importlib
import json
import re
from pathlib import Path

import pytest
import torch

from pml_suprank import ood

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def _import_recipe():
    return importlib.import_module("pml_suprank.recipes.ood_benchmark")


def _feature_file(path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 8, generator=g), torch.randn(3, generator=g)

    def make(n, spread, labels=False):
        z = torch.rand(n, 8, generator=g) if spread is None else torch.randn(n, 8, generator=g) * spread
        return ood.OODFeatures(z, z.abs() + 0.1, z @ w.T + b, torch.arange(n) % 3 if labels else None)

    sets = {"id_train": make(60, None, True), "id_test": make(20, None), "synthetic-heldout": make(15, 0.5)}
    sets["noise-uniform"] = make(15, 3.0)
    return ood.save_features(path, sets, weight=w, bias=b, metadata={"backbone": "toy"})


def test_recipe_from_a_feature_file(tmp_path, capsys):
    recipe = _import_recipe()
    features = _feature_file(tmp_path / "features.safetensors")
    names = [n for n in recipe.available_detectors() if n != "HEAT"]
    argv = ["--features", str(features), "--output_dir", str(tmp_path / "out"), "--progress", "false", "--no_plots",
            "--detectors", *names]  # fmt: skip
    summary = recipe.main(argv)
    assert summary["groups"] == {"near": ["synthetic-heldout"], "far": ["noise-uniform"]}
    assert "ODIN" not in names and {"GEN", "RMDS", "ASH", "SCALE", "NNGuide", "SSD+"} <= set(names)
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert {r["detector"] for r in rows} == set(names) and len(rows) == 4 * len(names)
    far = {r["detector"]: float(r["auroc"]) for r in rows if r["set"] == "noise-uniform"}
    assert far["KNN"] > 0.9 and far["RMDS"] > 0.9  # random directions: easy for feature distances
    assert "| KNN | far | mean |" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "results.json").read_text())["feature_metadata"] == {"backbone": "toy"}
    with pytest.raises(SystemExit, match="not in the feature file"):
        recipe.main([*argv, "--far", "svhn"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as raised:
        recipe.main([*argv, "--num_per_class", "3"])
    lines = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert raised.value.code == 2 and len(lines) == 1 and "unknown flags ['--num_per_class', '3']" in lines[0]


def test_unknown_detectors_and_set_names_are_refused_before_any_work(tmp_path, capsys):
    """``--detectors`` names are checked when the command line is parsed, and ``--near`` / ``--far`` against
    ``--ood_datasets``: before fit_heat's steps would train a classifier and extract features (no ``--features``),
    and before ``--output_dir`` is created."""
    out = tmp_path / "out"
    for name in ("Nope", "ODIN"):  # ODIN scores images through the network: no row of a feature benchmark
        with pytest.raises(SystemExit) as raised:
            _import_recipe().main(["--detectors", "KNN", name, "--output_dir", str(out), "--progress", "false"])
        lines = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert raised.value.code == 2 and len(lines) == 1 and f"--detectors: unknown ['{name}']" in lines[0]
        assert "'KNN'" in lines[0] and not out.exists()
    with pytest.raises(SystemExit, match=r"not in --ood_datasets: \['svhn'\]; it holds \['synthetic-heldout'"):
        _import_recipe().main(["--far", "svhn", "--output_dir", str(out), "--progress", "false"])
    assert not out.exists()


def test_a_refused_feature_file_writes_nothing(tmp_path, capsys):
    """A missing ``--features`` file, or one without the ``id_train`` / ``id_test`` sets: one ``error:`` line naming
    ``--features``, exit 2, before ``--output_dir`` is created."""
    recipe = _import_recipe()
    z = torch.rand(4, 8)
    partial = ood.save_features(tmp_path / "partial.safetensors", {"id_test": ood.OODFeatures(z, z + 0.1, z[:, :3])})
    out = tmp_path / "out"
    for features, expected in ((tmp_path / "missing.safetensors", "does not exist"),
                               (partial, r"lacks the set\(s\) \['id_train'\]")):  # fmt: skip
        with pytest.raises(SystemExit) as raised:
            recipe.main(["--features", str(features), "--output_dir", str(out), "--progress", "false"])
        lines = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert raised.value.code == 2 and len(lines) == 1 and f"--features {features}" in lines[0]
        assert re.search(expected, lines[0]) and not out.exists()


@pytest.mark.slow
def test_recipe_end_to_end_on_tiny_synthetic_data(tmp_path):
    recipe = _import_recipe()
    argv = [
        "--output_dir", str(tmp_path), "--progress", "false", "--heat_epochs", "1", "--threads", "1",
        "--num_per_class", "3", "--num_test_per_class", "2", "--num_noise", "12", "--train_epochs", "1",
    ]  # fmt: skip
    with torch.random.fork_rng():
        summary = recipe.main(argv)
    assert summary["groups"] == {"near": ["synthetic-heldout"], "far": ["noise-uniform", "noise-blobs"]}
    detectors = {r["detector"] for r in summary["rows"]}
    assert detectors == set(recipe.available_detectors())
    for row in summary["rows"]:
        assert 0.0 <= row["auroc"] <= 1.0 and 0.0 <= row["fpr_id_positive"] <= 1.0
    assert (tmp_path / "score_histograms.png").stat().st_size > 0
    saved = ood.load_features(tmp_path / "features.safetensors")  # the fit_heat.py format, reusable
    assert set(saved.sets) == {"id_train", "id_test", "synthetic-heldout", "noise-uniform", "noise-blobs"}
    assert saved.weight is not None and saved.sets["id_train"].labels is not None


def test_near_and_far_names_from_the_file_are_accepted(tmp_path):
    """The docs' command: ``--near synthetic-heldout --far noise-uniform`` names sets the file holds."""
    recipe = _import_recipe()
    names = ["synthetic-heldout", "noise-uniform", "noise-blobs"]
    groups = recipe.group_sets(names, ["synthetic-heldout"], ["noise-uniform", "noise-blobs"])
    assert groups == {"near": ["synthetic-heldout"], "far": ["noise-uniform", "noise-blobs"]}
    assert recipe.group_sets(names, ["synthetic-heldout"], None)["far"] == ["noise-uniform", "noise-blobs"]
    with pytest.raises(SystemExit, match=r"\['svhn'\]"):
        recipe.group_sets(names, ["svhn"], ["noise-uniform"])
    features = _feature_file(tmp_path / "features.safetensors")
    summary = recipe.main(["--features", str(features), "--output_dir", str(tmp_path / "out"), "--progress", "false",
                           "--no_plots", "--detectors", "KNN", "MSP", "--near", "synthetic-heldout", "--far",
                           "noise-uniform"])  # fmt: skip
    assert summary["groups"] == {"near": ["synthetic-heldout"], "far": ["noise-uniform"]}
