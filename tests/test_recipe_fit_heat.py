"""Smoke test of recipes/fit_heat.py on a tiny SyntheticShapes run (offline, CPU)."""

from __future__ import annotations

import importlib
import json
import re
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
    assert set(table) == set(fit_heat.methods())
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
    assert args.cifar_stem and args.detector_options["knn_k"] == 7 and args.detector_options["vim_dim"] == 256
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
    from pml_suprank.recipes import ood_spec

    registered = [n for n in ood.list_detectors() if n != "HEAT"]
    assert [m for m in fit_heat.methods() if m in registered] == registered
    assert fit_heat.methods()[-1] == "HEAT" and "SSD+" in fit_heat.methods()
    args = fit_heat.parse_args([])
    options = args.detector_options
    assert [options[k] for k in ("knn_k", "dice_p", "react_percentile", "vim_dim")] == [50, 0.9, 95.0, None]
    assert (options["odin_temperature"], options["odin_eps"], options["energy_temperature"]) == (1000.0, 0.0014, 1.0)
    for name in registered:  # every plain constructor argument has its flag
        for argument in ood_spec.detector_options(name):
            assert f"{name.lower()}_{argument}" in options, (name, argument)
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
        m for m in fit_heat.methods() if m != "ODIN"
    )


def test_a_hand_built_spec_builds_the_detectors_of_a_parsed_one():
    from dataclasses import replace

    from pml_suprank.recipes.ood_spec import FitHeatSpec

    fit_heat = _import_fit_heat()
    model = torch.nn.Module()
    model.get_classifier = lambda: torch.nn.Linear(8, 3)
    parsed, by_hand = fit_heat.parse_args([]), FitHeatSpec()  # no parse: detector_options and heat_settings None
    partial = replace(by_hand, detector_options={"knn_k": 50})  # the other options take their defaults
    for method in (m for m in fit_heat.selected_methods(parsed) if m != "HEAT"):
        expected = fit_heat.build_detector(method, parsed, model, n_train=20, dim=8).config()
        assert fit_heat.build_detector(method, by_hand, model, n_train=20, dim=8).config() == expected, method
        assert fit_heat.build_detector(method, partial, model, n_train=20, dim=8).config() == expected, method
    knn_7 = replace(by_hand, detector_options={"knn_k": 7})
    assert fit_heat.build_detector("KNN", knn_7, model, n_train=20, dim=8).k == 7
    assert by_hand.heat().config() == parsed.heat().config()
    typo = replace(by_hand, detector_options={"knn_kk": 7})
    with pytest.raises(ValueError, match=r"detector_options: unknown key\(s\) \['knn_kk'\]; valid keys: .*'knn_k'"):
        fit_heat.build_detector("Energy", typo, model, n_train=20, dim=8)
    with pytest.raises(ValueError, match=r"knn_k must be an int >= 0; got 2\.5"):  # checked as the flag is
        fit_heat.build_detector("KNN", replace(by_hand, detector_options={"knn_k": 2.5}), model, n_train=20, dim=8)


@pytest.mark.parametrize(
    "path", sorted((RECIPES.parent / "pml_suprank" / "hub_configs").glob("heat_*.yaml")), ids=lambda p: p.stem
)
def test_every_heat_hub_config_parses(path):
    import yaml

    fit_heat = _import_fit_heat()
    raw = yaml.safe_load(path.read_text())
    args = fit_heat.parse_args(["--config", str(path)])
    for key, value in {**raw["recipe"], **{k: v for k, v in raw["heat"].items() if k != "settings"}}.items():
        assert (args.detector_options[key] if key in args.detector_options else getattr(args, key)) == value, key
    assert args.heat_settings == raw["heat"]["settings"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("recipe:\n  batch_size: [1, 2]\n", r"recipe\.batch_size must be an int in \[1, 65536\]; got \[1, 2\]"),
        ("recipe:\n  num_per_class: 1000000000000\n", r"recipe\.num_per_class must be an int in \[1, 100000\]"),
        ("recipe:\n  knn_k: 2.5\n", r"recipe\.knn_k must be an int >= 0; got 2\.5"),
        ("recipe:\n  backbone_name: resnet18\n", r"unknown key 'recipe\.backbone_name'"),
        ("heat:\n  beta: .nan\n", r"heat\.beta must be a number or ±inf"),
        ("heat:\n  settings: {gmm: {hidden_dimm: 5}}\n", r"unknown HEAT settings \['hidden_dimm'\]"),
        ("heat:\n  priors: [gmm, nope]\n", r"--priors: unknown \['nope'\]"),
        ("trainer:\n  epochs: 3\n", r"unknown top-level key 'trainer'"),
        (
            "name: x\nmodel:\n  backbone: y\ntraining:\n  epochs: 3\n",
            r"heat\.yaml: a training config \(sections "
            r"model, training\), not a fit_heat one; give it to a training recipe: pml_suprank\.recipes\.train",
        ),
        ("- a\n- b\n", r"must be a YAML mapping of sections; got list"),
    ],
)
@pytest.mark.slow
def test_fit_heat_and_ood_benchmark_config_values_are_checked_before_any_work(tmp_path, capsys, text, message):
    """A --config value that its option refuses exits 2 at parse time, naming the file and key (never a TypeError
    deep inside, a MemoryError or an allocation); ood_benchmark hands the same file to the same checks."""
    fit_heat = _import_fit_heat()
    benchmark = importlib.import_module("pml_suprank.recipes.ood_benchmark")
    config = tmp_path / "heat.yaml"
    config.write_text(text)
    out = str(tmp_path / "out")
    for parse, argv in ((fit_heat.parse_args, ["--config", str(config)]),
                        (benchmark.main, ["--config", str(config), "--output_dir", out])):  # fmt: skip
        with pytest.raises(SystemExit) as raised:
            parse(argv)
        assert raised.value.code == 2
        assert re.search(message, capsys.readouterr().err), message
    assert not (tmp_path / "out").exists()  # nothing was written


@pytest.mark.slow
def test_fit_heat_flags_python_and_files_give_one_verdict(tmp_path, capsys):
    """Each bounded option: the flag, the file value and FitHeatSpec.from_options accept and refuse the same values."""
    from pml_suprank.recipes.ood_spec import FitHeatSpec
    from pml_suprank.training.config import OptionError

    fit_heat = _import_fit_heat()
    cases = {"num_per_class": (1, 100_000, 0, 100_001), "batch_size": (1, 65_536, 0, 65_537),
             "image_size": (8, 4096, 7, 4097), "heat_epochs": (1, 100_000, 0, 100_001),
             "threads": (1, 4096, 0, 4097)}  # fmt: skip
    for name, (low, high, below, above) in cases.items():
        for value, ok in ((low, True), (high, True), (below, False), (above, False)):
            config = tmp_path / f"{name}_{value}.yaml"
            text = f"heat:\n  epochs: {value}\n" if name == "heat_epochs" else f"recipe:\n  {name}: {value}\n"
            config.write_text(text)
            verdicts = []
            for build, arg in ((fit_heat.parse_args, [f"--{name}", str(value)]),
                               (fit_heat.parse_args, ["--config", str(config)]),
                               (FitHeatSpec.from_options, {name: value})):  # fmt: skip
                try:
                    spec = build(arg)
                    verdicts.append(getattr(spec, name) == value)
                except (SystemExit, OptionError):
                    verdicts.append(False)
            assert verdicts == [ok] * 3, (name, value, verdicts)
    capsys.readouterr()


def test_fit_heat_checkpoint_of_a_retrieval_model_points_to_model(tmp_path, capsys):
    """``--checkpoint RUN/final/model.safetensors`` of the package's own retrieval model: a one-line message
    pointing to ``--model RUN/final``, not a state-dict traceback."""
    from pml_suprank.models import RetrievalModel
    from pml_suprank.recipes.ood_data import build_model

    fit_heat = _import_fit_heat()
    final = tmp_path / "final"
    RetrievalModel(backbone="test_resnet", embedding_size=16, image_size=32).save_pretrained(final)
    spec = fit_heat.parse_args(["--checkpoint", str(final / "model.safetensors")])
    with pytest.raises(ValueError, match=rf"use --model {re.escape(str(final))}") as raised:
        build_model(spec, 4)
    assert len(str(raised.value).splitlines()) == 1
    other = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    save_file({"fc.weight": torch.zeros(3, 3)}, str(other))
    with pytest.raises(ValueError, match=r"does not fit --backbone test_resnet: missing keys \[.*\] \(\d+\)"):
        build_model(fit_heat.parse_args(["--checkpoint", str(other)]), 4)


def test_fit_heat_refuses_an_untrained_head_and_warns_about_few_heat_steps(tmp_path, capsys):
    fit_heat = _import_fit_heat()
    spec = fit_heat.parse_args(["--id_dataset", str(tmp_path)])
    assert fit_heat.resolved(spec, model_image_size=32).train_epochs == 5  # a user's data: the head is trained
    assert fit_heat.resolved(fit_heat.parse_args(["--checkpoint", "x.pt"]), model_image_size=32).train_epochs == 0
    untrained = fit_heat.resolved(fit_heat.parse_args(["--train_epochs", "0"]), model_image_size=32)
    with pytest.raises(SystemExit) as refused:
        fit_heat.check_trained_head(untrained)
    assert refused.value.code == 2 and "classifier head would be untrained" in capsys.readouterr().err
    heat = fit_heat.parse_args(["--heat_epochs", "1"]).heat(_Head().get_classifier())
    lines = fit_heat.heat_step_warnings(heat, n_train=40)
    assert len(lines) == 3 and "gmm: 1 optimizer step(s)" in lines[0] and "--heat_epochs" in lines[0]
    enough = fit_heat.parse_args(["--heat_epochs", "30", "--heat_batch_size", "4"]).heat(_Head().get_classifier())
    assert fit_heat.heat_step_warnings(enough, n_train=40) == []


@pytest.mark.parametrize("recipe", ["fit_heat", "ood_benchmark"])
def test_feature_map_refusal_leaves_no_output_folder(recipe, tmp_path, capsys):
    """A model whose feature map has one spatial position is refused (exit 2, one line) before ``--output_dir`` is
    created, by fit_heat and by ood_benchmark's extraction (which failed later, inside HEAT's std pooling)."""
    main = importlib.import_module(f"pml_suprank.recipes.{recipe}").main
    out = tmp_path / "runs" / "out"
    argv = ["--image_size", "8", "--num_per_class", "1", "--num_test_per_class", "1", "--num_noise", "1",
            "--progress", "false", "--output_dir", str(out)]  # fmt: skip
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert raised.value.code == 2 and "has 1 spatial position(s)" in err[-1] and err[-1].count("error:") == 1
    assert not (tmp_path / "runs").exists()


class _Head(torch.nn.Module):
    def get_classifier(self):
        return torch.nn.Linear(4, 3)


def test_ood_folders_are_read_from_the_split_they_have(tmp_path):
    """``--ood_datasets DIR`` without ``:SPLIT``: a folder with a test split gives it, a folder of class folders
    without one is used whole (its only split), never a split that does not exist."""
    import numpy as np
    from PIL import Image

    from pml_suprank.recipes.ood_data import ood_source

    spec = _import_fit_heat().parse_args([])
    layouts = {"whole": ["a/0.png", "a/1.png", "b/0.png", "b/1.png"],
               "split": ["train/a/0.png", "train/b/0.png", "test/a/0.png", "test/b/0.png"]}  # fmt: skip
    for folder, names in layouts.items():
        root = tmp_path / folder
        for name in names:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8, 3), 90, dtype=np.uint8)).save(root / name)
    assert ood_source(str(tmp_path / "whole"), spec) == (str(tmp_path / "whole"), "train", "label")
    assert ood_source(str(tmp_path / "split"), spec) == (str(tmp_path / "split"), "test", "label")
    assert ood_source(f"{tmp_path / 'split'}:train:label", spec)[1] == "train"
    assert ood_source("org/hub-set", spec) == ("org/hub-set", "test", "label")


def test_fit_heat_hub_model_id_is_held_to_the_training_recipes_rule(capsys):
    """The one rule of the run options (``options.run_rules``): ``--push_to_hub`` needs ``--hub_model_id``, and a
    repo id that is no ``org/name`` is refused before any work (it was accepted, and failed at the upload)."""
    fit_heat = _import_fit_heat()
    refused = {"--push_to_hub true needs --hub_model_id": ["--push_to_hub", "true"],
               "--hub_model_id: repo_id must look like": ["--push_to_hub", "--hub_model_id", "heat"]}  # fmt: skip
    for message, argv in refused.items():
        with pytest.raises(SystemExit) as raised:
            fit_heat.parse_args(argv)
        assert raised.value.code == 2 and message in capsys.readouterr().err
