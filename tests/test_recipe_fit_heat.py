"""Smoke test of recipes/fit_heat.py on a tiny SyntheticShapes run (offline, CPU)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def _import_fit_heat():
    return importlib.import_module("pml_suprank.recipes.fit_heat")


@pytest.mark.slow
def test_fit_heat_tiny_synthetic_run(tmp_path, capsys):
    fit_heat = _import_fit_heat()
    argv = [
        "--num_per_class", "3", "--num_test_per_class", "2", "--num_noise", "12", "--image_size", "32",
        "--train_epochs", "1", "--heat_epochs", "1", "--knn_k", "5", "--threads", "1",
        "--output_dir", str(tmp_path),
    ]  # fmt: skip
    with torch.random.fork_rng():
        results = fit_heat.main(argv)
    out = capsys.readouterr().out
    assert "FPR95 (id_positive) / AUROC" in out and "average" in out
    table = results["table"]
    assert set(table) == set(fit_heat.METHODS)
    for method, row in table.items():
        assert set(row) == {"synthetic-heldout", "noise-uniform", "noise-blobs", "average"}, method
        for cell in row.values():
            assert 0.0 <= cell["fpr95"] <= 1.0 and 0.0 <= cell["auroc"] <= 1.0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["table"]["HEAT"]["average"] == pytest.approx(table["HEAT"]["average"])
    assert (tmp_path / "score_histograms.png").stat().st_size > 0
    from pml_suprank import ood

    heat = ood.Detector.from_pretrained(tmp_path / "heat_detector")
    assert isinstance(heat, ood.HEAT) and heat.priors == ("gmm", "gmm_std", "el")


def test_fit_heat_config_file_sets_defaults_and_flags_win():
    fit_heat = _import_fit_heat()
    cfg = Path(__file__).resolve().parents[1] / "pml_suprank" / "hub_configs" / "heat_cifar10_resnet34.yaml"
    args = fit_heat.parse_args(["--config", str(cfg), "--knn_k", "7"])
    assert args.backbone == "resnet34" and args.preset == "cifar10" and args.tie_hidden_weights
    assert args.cifar_stem and args.knn_k == 7 and args.vim_dim == 256
    assert args.heat_settings["gmm"]["sgld_steps"] == 40
    with pytest.raises(SystemExit):
        fit_heat.parse_args(["--preset", "mnist"])


def _image_folder(root: Path, splits=("train", "test"), n=16, seed=0):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in splits:
        (root / split).mkdir(parents=True)
        rows = ["file_name,label"]
        for i in range(n):
            arr = (rng.random((32, 32, 3)) * 80 + (150 if i % 2 else 20)).astype(np.uint8)
            Image.fromarray(arr).save(root / split / f"{i}.png")
            rows.append(f"{i}.png,{i % 2}")
        (root / split / "metadata.csv").write_text("\n".join(rows) + "\n")
    return root


@pytest.mark.slow
def test_fit_heat_on_local_folders(tmp_path):
    fit_heat = _import_fit_heat()
    id_root = _image_folder(tmp_path / "id")
    ood_root = _image_folder(tmp_path / "ood", splits=("test",), seed=1)
    argv = [
        "--id_dataset", str(id_root), "--label_column", "label", "--ood_datasets", f"{ood_root}:test:label",
        "noise-uniform", "--num_noise", "8", "--image_size", "32", "--output_stride", "16", "--train_epochs", "1",
        "--heat_epochs", "1", "--knn_k", "3", "--no_odin", "--no_plots", "--threads", "1",
        "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "out"),
    ]  # fmt: skip
    with torch.random.fork_rng():
        results = fit_heat.main(argv)
    assert set(results["table"]["HEAT"]) == {f"{ood_root}:test:label", "noise-uniform", "average"}
    assert "ODIN" not in results["table"] and results["classifier_test_accuracy"] is not None


def test_fit_heat_flags_are_snake_case_with_defaults_in_help(capsys):
    fit_heat = _import_fit_heat()
    parser = fit_heat.build_parser()
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    assert all("-" not in f[2:] for f in flags), [f for f in flags if "-" in f[2:]]
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert "(default: fast)" in help_text and "(default: outputs/fit_heat)" in help_text
    args = fit_heat.parse_args(["--pretrained", "true", "--cifar_stem", "--tie_hidden_weights", "false"])
    assert args.pretrained is True and args.cifar_stem is True and args.tie_hidden_weights is False
    assert args.output_dir == "outputs/fit_heat" and args.push_to_hub is False and args.progress is True
    args = fit_heat.parse_args(["--push_to_hub", "true", "--hub_model_id", "me/heat", "--output_dir", "x"])
    assert args.push_to_hub and args.hub_model_id == "me/heat" and args.output_dir == "x"
    for bad in (["--push_to_hub", "true"], ["--output-dir", "x"], ["--pretrained", "maybe"], ["--detectors", "XYZ"]):
        with pytest.raises(SystemExit):
            fit_heat.parse_args(bad)


def test_fit_heat_detector_rows_and_flags_come_from_the_registry():
    fit_heat = _import_fit_heat()
    from pml_suprank import ood

    registered = [n for n in ood.list_detectors() if n != "HEAT"]
    assert [m for m in fit_heat.METHODS if m in registered] == registered
    assert fit_heat.METHODS[-1] == "HEAT" and "SSD+" in fit_heat.METHODS
    args = fit_heat.parse_args([])
    assert (args.knn_k, args.dice_p, args.react_percentile, args.vim_dim) == (50, 0.9, 95.0, None)
    assert (args.odin_temperature, args.odin_eps, args.energy_temperature) == (1000.0, 0.0014, 1.0)
    for name in registered:  # every plain constructor argument has its flag
        for argument in fit_heat.detector_options(name):
            assert hasattr(args, f"{name.lower()}_{argument}"), (name, argument)
    model = torch.nn.Module()
    model.get_classifier = lambda: torch.nn.Linear(8, 3)
    knn = fit_heat.build_detector("KNN", args, model, n_train=20, dim=8)
    assert isinstance(knn, ood.KNN) and knn.k == 20  # clamped to the training set
    ssd = fit_heat.build_detector("SSD+", args, model, n_train=20, dim=8)
    assert isinstance(ssd, ood.Mahalanobis) and ssd.normalize
    vim = fit_heat.build_detector("ViM", fit_heat.parse_args(["--vim_dim", "3"]), model, n_train=20, dim=8)
    assert vim.dim == 3 and fit_heat.build_detector("ViM", args, model, n_train=20, dim=8).dim == 4
    odin = fit_heat.build_detector("ODIN", args, model, n_train=20, dim=8)
    assert odin.model is model and odin.temperature == 1000.0
    assert fit_heat.selected_methods(fit_heat.parse_args(["--no_odin"])) == tuple(
        m for m in fit_heat.METHODS if m != "ODIN"
    )


@pytest.mark.parametrize(
    "path", sorted((RECIPES.parent / "pml_suprank" / "hub_configs").glob("heat_*.yaml")), ids=lambda p: p.stem
)
def test_every_heat_hub_config_parses(path):
    import yaml

    fit_heat = _import_fit_heat()
    raw = yaml.safe_load(path.read_text())
    args = fit_heat.parse_args(["--config", str(path)])
    for key, value in {**raw["recipe"], **{k: v for k, v in raw["heat"].items() if k != "settings"}}.items():
        assert getattr(args, key) == value, key
    assert args.heat_settings == raw["heat"]["settings"]
