"""The benchmarks by name in the recipes and hub_configs: ``dataset: sop`` + ``--data_root`` builds the native archive
(tiny fixtures of each layout), the errors before anything is built, and recipes/evaluate.py's DyML and landmark
protocols against hand-computed values."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import _hub_helpers
import pytest
import torch
import yaml
from _benchmark_fixtures import MAKERS
from _helpers import import_recipe, parse_recipe, recipe_parser

from pml_suprank.data.benchmarks import BENCHMARKS, load_benchmark
from pml_suprank.data.source import DatasetSource, data_option_errors, dataset_source, resolved_split
from pml_suprank.training import hub_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
CONFIGS = sorted(p for p in (ROOT / "pml_suprank" / "hub_configs").glob("*.yaml") if not p.name.startswith("heat_"))
BENCHMARK_CONFIGS = [p for p in CONFIGS if yaml.safe_load(p.read_text())["data"]["dataset"] in BENCHMARKS]
TINY = ["--backbone", "test_resnet", "--pretrained", "false", "--image_size", "16", "--embedding_size", "8",
        "--cpu", "--with_tracking", "false"]  # fmt: skip


def test_shipped_configs_name_their_benchmark():
    names = {p.stem: yaml.safe_load(p.read_text())["data"]["dataset"] for p in BENCHMARK_CONFIGS}
    assert names["happier_sop"] == names["roadmap_sop"] == names["rod_ndcg_sop"] == "sop"
    assert names["roadmap_cub"] == "cub"
    assert names["happier_inat_base"] == names["roadmap_inat"] == "inat_base"
    assert names["happier_inat_full"] == "inat_full"
    assert {names[f"happier_dyml_{x}"] for x in ("vehicle", "animal", "product")} == {
        "dyml_vehicle", "dyml_animal", "dyml_product"
    }  # fmt: skip
    assert names["happier_gldv2"] == names["roadmap_gldv2"] == "gldv2_hier"
    for p in BENCHMARK_CONFIGS:
        assert "convert Ebay" not in p.read_text(), p.name


@pytest.mark.parametrize("path", BENCHMARK_CONFIGS, ids=lambda p: p.stem)
def test_hub_config_builds_its_benchmark_from_data_root(path, tmp_path):
    cfg = hub_config.load_hub_config(path)
    name = cfg["data"]["dataset"]
    root = MAKERS[name](tmp_path / name)
    for part in ("train", "test"):
        split = resolved_split(cfg, part)
        assert split == cfg["data"].get(f"{part}_split", split) and split in BENCHMARKS[name].splits
        assert dataset_source(cfg["data"], part, data_root=root) == DatasetSource("benchmark", name, split,
                                                                                 root=str(root))  # fmt: skip
        built = _hub_helpers.build_dataset(cfg, part, data_root=root)
        native = load_benchmark(name, root, split)
        assert torch.equal(built.labels, native.labels) and built.names == native.names, (name, part)
    # the data root may also come from the file (e.g. a personal override file)
    cfg["data"]["data_root"] = str(root)
    assert len(_hub_helpers.build_dataset(cfg, "train")) == len(load_benchmark(name, root, resolved_split(
        cfg, "train")))  # fmt: skip


def test_benchmark_defaults_to_its_own_splits_and_label_names():
    cfg = {"data": {"dataset": "cifar100"}}
    assert resolved_split(cfg, "train") == "open_train" and resolved_split(cfg, "test") == ("open_test")
    assert resolved_split({"data": {"dataset": "data/sop"}}, "test") == "test"  # a prepared copy: as before
    assert data_option_errors({"dataset": "sop"}) == []  # label_columns optional for a benchmark
    with pytest.raises(ValueError, match=r"dyml_vehicle has no single test split.*query_fine"):
        resolved_split({"data": {"dataset": "dyml_vehicle"}}, "test")


@pytest.mark.parametrize(
    "data, match",
    [
        ({"dataset": "sop", "label_columns": ["class_id"]},
         r"\['class_id'\] does not match the label names \['class_id', 'super_class_id'\] of benchmark sop"),
        ({"dataset": "sop", "train_split": "val"}, r"'data.train_split' must be a split of benchmark sop"),
        ({"dataset": "cub", "open_set": True, "train_class_fraction": 0.5}, r"cub has its own train / test splits"),
        ({"dataset": "dyml_animal"}, r"dyml_animal has no single test split"),
        ({"dataset": "data/sop", "label_columns": ["a"], "data_root": "/x"}, r"'data.data_root' is for a benchmark"),
        ({"dataset": "synthetic_multilabel"}, r"'sampler' hierarchical: dataset synthetic_multilabel is sampled by"),
    ],
)  # fmt: skip
def test_data_section_errors(data, match):
    cfg = copy.deepcopy(hub_config.load_hub_config("happier_sop"))  # bundled, by name
    cfg["data"] = data
    with pytest.raises(ValueError, match=match):
        hub_config.validate_hub_config(cfg, source="test.yaml")


def test_missing_data_root_is_an_error_before_anything_is_built(capsys):
    with pytest.raises(ValueError, match=r"benchmark sop is read from its archive: give its folder with --data_root"):
        _hub_helpers.build_dataset({"data": {"dataset": "sop"}}, "train")
    common, parser = recipe_parser()
    with pytest.raises(SystemExit) as exit_info:
        parse_recipe(parser, ["--config", str(ROOT / "pml_suprank" / "hub_configs" / "happier_sop.yaml")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--dataset sop" in err and "--data_root" in err and "Ebay_" in err


def test_synthetic_multilabel_unsupported_loss_is_refused_early_and_synthetic_unchanged(capsys):
    common, parser = recipe_parser()
    with pytest.raises(SystemExit):
        parse_recipe(parser, ["--dataset", "synthetic_multilabel", "--loss", "ROD-NDCG", *TINY])
    assert "'loss' ROD-NDCG has no multi-label variant" in capsys.readouterr().err
    spec = parse_recipe(recipe_parser()[1], ["--dataset", "synthetic", *TINY])
    assert spec.data.dataset == "synthetic" and spec.data.data_root is None
    assert dataset_source(spec.data_section(), "train").kind == "synthetic"


def test_recipe_builds_the_benchmark_by_name(tmp_path):
    root = MAKERS["sop"](tmp_path / "Stanford_Online_Products")
    common, parser = recipe_parser()
    argv = ["--config", str(ROOT / "pml_suprank" / "hub_configs" / "happier_sop.yaml"), "--data_root", str(root), *TINY]
    spec = parse_recipe(parser, argv)
    assert (
        spec.data.dataset == "sop" and spec.data.data_root == str(root) and "data_root" not in spec.hub_config["data"]
    )
    model = common.build_model(spec)
    train, test = common.build_datasets(spec, model)
    assert torch.equal(train.labels, load_benchmark("sop", root, "train").labels)
    assert torch.equal(test.labels, load_benchmark("sop", root, "test").labels)
    assert train[0]["image"].shape == (3, 16, 16)
    options = spec.run_options("no")
    assert options["data"]["train_split"] == "train" and options["data"]["test_split"] == "test"
    assert "data_root" not in options["data"]  # moving the archive keeps the run's fingerprint
    # open_set on a benchmark checks the training / test fine classes: CIFAR-100's closed-set splits overlap
    cifar = MAKERS["cifar100"](tmp_path / "cifar")
    argv = ["--dataset", "cifar100", "--data_root", str(cifar), "--train_split", "train", "--test_split", "test",
            "--open_set", "true", *TINY]  # fmt: skip
    spec = parse_recipe(recipe_parser()[1], argv)
    with pytest.raises(ValueError, match=r"benchmark cifar100: an open-set split was requested"):
        common.build_datasets(spec, model)
    spec.data.train_split, spec.data.test_split = None, None  # its own open-set splits
    train, test = common.build_datasets(spec, model)
    assert not set(train.labels[:, 0].tolist()) & set(test.labels[:, 0].tolist())


# ------------------------------------------------------------------------------------------------------------------
# recipes/evaluate.py: the DyML and landmark protocols
# ------------------------------------------------------------------------------------------------------------------
def _tiny_model(folder: Path, constant: bool) -> Path:
    """A tiny model; ``constant``: a negligible projection weight (1e-30) and the bias e_1, so every embedding is
    exactly e_1 in float32 and every score ties (the pessimistic tie rule ranks all negatives first, which gives
    hand-computable metrics)."""
    from pml_suprank.models import RetrievalModel

    torch.manual_seed(0)
    model = RetrievalModel(backbone="test_resnet", pretrained=False, image_size=16, embedding_size=8)
    if constant:
        with torch.no_grad():
            model.projection.weight.fill_(1e-30)
            model.projection.bias.zero_()
            model.projection.bias[0] = 1.0
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def constant_model(tmp_path_factory):
    return _tiny_model(tmp_path_factory.mktemp("constant"), constant=True)


def _evaluate(*argv):
    torch.set_num_threads(1)
    return import_recipe("evaluate").main([*map(str, argv), "--cpu"])


def test_evaluate_dyml_protocol_hand_computed(constant_model, tmp_path):
    root = MAKERS["dyml_vehicle"](tmp_path / "dyml_vehicle")
    out = _evaluate("--model", constant_model, "--benchmark", "dyml_vehicle", "--data_root", root,
                    "--output_dir", tmp_path / "eval")  # fmt: skip
    # all scores tie, negatives first. fine: 3 queries, each 2 positives of 4 -> AP = (1/3 + 2/4) / 2 = 5/12;
    # middle / coarse: one query with 1 positive of 3 (AP 1/3), one with 2 of 3 (AP (1/2 + 2/3) / 2 = 7/12)
    assert out["ap_fine"] == pytest.approx(5 / 12)
    assert out["ap_middle"] == pytest.approx(11 / 24) and out["ap_coarse"] == pytest.approx(11 / 24)
    assert out["ap"] == pytest.approx((5 / 12 + 11 / 24 + 11 / 24) / 3)
    assert out["recall_at_1"] == 0.0 and out["num_queries_fine"] == 3.0
    assert (tmp_path / "eval" / "metrics.json").is_file()


def test_evaluate_landmark_protocols_hand_computed(constant_model, tmp_path):
    gldv2 = MAKERS["gldv2_hier"](tmp_path / "gldv2")
    out = _evaluate("--model", constant_model, "--benchmark", "gldv2_hier", "--data_root", gldv2)
    # queries of landmarks 10, 11, 10 against a gallery of 6 (3 of landmark 10, 2 of 11): positives last;
    # landmark 10: (1/4 + 2/5 + 3/6) / 3 = 23/60; landmark 11: (1/5 + 2/6) / 2 = 4/15
    assert out["map_at_100"] == pytest.approx((2 * 23 / 60 + 4 / 15) / 3)
    assert {"h_ap", "asi", "ndcg"} <= set(out)
    oxford = MAKERS["roxford5k"](tmp_path / "roxford5k")
    out = _evaluate("--model", constant_model, "--benchmark", "roxford5k", "--data_root", oxford, "--max_side", 24)
    # trapezoidal AP with the positives last: easy q0 (5/12), q1 (1/6); medium q1 7/24; hard only q1 (1/6)
    assert out["easy_map"] == pytest.approx((5 / 12 + 1 / 6) / 2)
    assert out["medium_map"] == pytest.approx((5 / 12 + 7 / 24) / 2)
    assert out["hard_map"] == pytest.approx(1 / 6)


def test_evaluate_benchmark_modes_match_the_library(tmp_path):
    """A non-constant model: the protocol values equal the library functions on the same embeddings."""
    from pml_suprank import data
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.metrics.landmark import landmark_map_at_k
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training import embed_loader, make_loader

    folder = _tiny_model(tmp_path / "model", constant=False)
    root = MAKERS["gldv2_hier"](tmp_path / "gldv2")
    out = _evaluate("--model", folder, "--benchmark", "gldv2_hier", "--data_root", root)
    model = RetrievalModel.from_pretrained(folder).eval()
    tf = data.build_transforms(model.data_config, train=False)
    q, ql, _ = embed_loader(model, make_loader(load_benchmark("gldv2_hier", root, "query", tf), 4))
    g, gl, _ = embed_loader(model, make_loader(load_benchmark("gldv2_hier", root, "gallery", tf), 4))
    expected = RetrievalEvaluator(k_values=(1, 10, 100)).evaluate(q, ql, g, gl)
    assert out["h_ap"] == pytest.approx(float(expected["h_ap"])) and out["ndcg"] == pytest.approx(
        float(expected["ndcg"])
    )
    mapk = torch.nanmean(landmark_map_at_k(q @ g.T, ql[:, None, 0] == gl[None, :, 0], k=100))
    assert out["map_at_100"] == pytest.approx(float(mapk))
    dyml = MAKERS["dyml_product"](tmp_path / "dyml_product")
    out = _evaluate("--model", folder, "--benchmark", "dyml_product", "--data_root", dyml)
    for key in ("ap", "asi", "recall_at_1", "map_at_r"):
        assert out[key] == pytest.approx(sum(out[f"{key}_{g}"] for g in ("fine", "middle", "coarse")) / 3)
    # a benchmark without a protocol, or --split: one test set
    single = _evaluate("--model", folder, "--dataset", "dyml_product", "--data_root", dyml, "--split", "test")
    assert single["num_queries"] == 3


def test_evaluate_benchmark_errors(capsys, tmp_path):
    evaluate = import_recipe("evaluate")
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "m", "--benchmark", "dyml_vehicle"])
    assert "--data_root is required for benchmark dyml_vehicle" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "m", "--benchmark", "sop", "--data_root", str(tmp_path), "--split", "val"])
    assert "--split must be a split of sop" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "m", "--benchmark", "imagenet", "--data_root", str(tmp_path)])
    assert "--benchmark must be null or one of" in capsys.readouterr().err  # the field's check names the flag


@pytest.mark.slow
def test_train_happier_on_a_benchmark_by_name_then_evaluate(tmp_path):
    """``train_happier.py --config hub_configs/happier_sop.yaml --data_root DIR`` (tiny overrides) trains on the native
    SOP layout, and evaluate.py reads the same benchmark by name."""
    import json
    import os
    import subprocess

    root = MAKERS["sop"](tmp_path / "Stanford_Online_Products")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # noqa: TID251
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    config = ROOT / "pml_suprank" / "hub_configs" / "happier_sop.yaml"
    cmd = [sys.executable, str(RECIPES / "train_happier.py"), "--config", str(config),
           "--data_root", str(root), *TINY, "--sampler", "m_per_class", "--batch_size", "4", "--samples_per_class", "2",
           "--max_train_steps", "2", "--epochs", "2", "--warmup_epochs", "0", "--eval_every", "0", "--no_plots",
           "--output_dir", str(tmp_path / "run")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "HAPPIER on sop: 6 training / 4 test images, 3 training classes" in proc.stdout
    trained = json.loads((tmp_path / "run" / "final" / "metrics.json").read_text())
    out = _evaluate("--model", tmp_path / "run" / "final", "--dataset", "sop", "--data_root", root, "--no_plots")
    assert out["h_ap"] == pytest.approx(trained["h_ap"], abs=1e-6)
