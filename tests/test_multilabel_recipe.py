"""recipes/train_happier.py on the multi-label SyntheticMultiShapes (``--dataset synthetic_multilabel``): the
multi-label HAPPIER loss (thesis Algorithm 1 relevance), MultiLabelSampler, the multi-label evaluator, and the clear
refusals of the settings without a multi-label variant (ROADMAP, ROD-NDCG, the hierarchical sampler)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import parse_recipe, recipe_parser

from pml_suprank.data.source import DatasetSource, data_option_errors, dataset_source
from pml_suprank.training import hub_config
from pml_suprank.training.options import build_loss
from pml_suprank.training.run_spec import multilabel_option_errors

pytest.importorskip("accelerate")
pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
TINY = ["--backbone", "test_resnet", "--pretrained", "false", "--image_size", "16", "--embedding_size", "8",
        "--num_per_class", "4", "--batch_size", "32", "--eval_batch_size", "64", "--cpu",
        "--with_tracking", "false"]  # fmt: skip


def test_data_section_accepts_synthetic_multilabel_and_its_kwargs():
    assert data_option_errors({"dataset": "synthetic_multilabel"}) == []
    source = dataset_source({"dataset": "synthetic_multilabel", "image_size": 16}, "test")
    assert source == DatasetSource("synthetic", "synthetic_multilabel", "test", options={"image_size": 16})
    assert dataset_source({"dataset": "synthetic"}, "train").kind == "synthetic"
    errors = data_option_errors({"dataset": "synthetic_multilabel", "label_columns": ["a"]})
    assert any("'data.label_columns'" in e and "synthetic_multilabel" in e for e in errors)


def test_a_split_of_a_synthetic_dataset_is_one_it_has_and_is_read(capsys):
    """``train`` / ``test`` / ``all``: read as given; another split is refused naming the key, the flag and the
    splits (it was silently replaced by the part's own)."""
    from _helpers import parse_recipe, recipe_parser

    for name in ("synthetic", "synthetic_multilabel"):
        assert data_option_errors({"dataset": name, "test_split": "nope"}) == [
            f"'data.test_split' (--test_split) must be a split of the built-in dataset {name} ['train', 'test', "
            "'all']; got 'nope'"
        ]
        assert dataset_source({"dataset": name, "test_split": "all"}, "test").split == "all"
        assert dataset_source({"dataset": name}, "train").split == "train"
    with pytest.raises(SystemExit) as exit_info:
        parse_recipe(recipe_parser("train_happier")[1], ["--train_split", "nope"])
    assert exit_info.value.code == 2 and "'data.train_split' (--train_split) must be" in capsys.readouterr().err


@pytest.mark.parametrize(
    "loss, sampler, match",
    [
        ("ROADMAP", None, r"'loss' ROADMAP has no multi-label variant.*HAPPIER"),
        ("ROD-NDCG", None, r"'loss' ROD-NDCG has no multi-label variant"),
        ("HAPPIER", "hierarchical", r"'sampler' hierarchical: .*MultiLabelSampler"),
    ],
)
def test_multilabel_option_errors_name_the_option(loss, sampler, match):
    errors = multilabel_option_errors("synthetic_multilabel", loss, sampler)
    assert len(errors) == 1
    with pytest.raises(ValueError, match=match):
        raise ValueError(errors[0])
    assert multilabel_option_errors("synthetic", loss, sampler) == []
    assert multilabel_option_errors("synthetic_multilabel", "HAPPIER", "m_per_class") == []


@pytest.mark.parametrize(
    "recipe, extra, match",
    [
        ("train_happier", ["--loss", "ROD-NDCG"], "'loss' ROD-NDCG has no multi-label variant"),
        ("train_roadmap", [], "'loss' ROADMAP has no multi-label variant"),
    ],
)
def test_recipe_refuses_unsupported_multilabel_settings_before_building(recipe, extra, match, capsys):
    common, parser = recipe_parser(recipe)
    with pytest.raises(SystemExit) as exit_info:
        parse_recipe(parser, ["--dataset", "synthetic_multilabel", *TINY, *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--dataset synthetic_multilabel" in err and match in err


def test_hub_config_validation_refuses_multilabel_roadmap():
    cfg = {"data": {"dataset": "synthetic_multilabel"}, "loss": {"name": "ROADMAP"}}
    match = r"(?s)cfg.yaml: invalid hub_config.*'loss' ROADMAP has no multi-label variant"
    with pytest.raises(ValueError, match=match):
        hub_config.validate_hub_config(cfg, source="cfg.yaml", partial=True)
    cfg["loss"] = {"name": "HAPPIER"}
    assert hub_config.validate_hub_config(cfg, source="cfg.yaml", partial=True) is cfg


def test_build_loss_passes_the_multilabel_arguments():
    hierarchy = torch.tensor([[0, 0], [1, 0], [2, 1]])
    loss = build_loss("HAPPIER", {}, 3, 8, relevance="multilabel", hierarchy=hierarchy)
    labels = torch.tensor([[0, 1], [1, -1], [2, -1], [0, 2]])
    value = loss(torch.nn.functional.normalize(torch.randn(4, 8), dim=-1), labels)
    assert value.dim() == 0 and torch.isfinite(value)
    with pytest.raises(TypeError):
        build_loss("HAPPIER", {}, 3, 8, not_an_argument=1)


def test_recipe_builds_the_multilabel_parts():
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.samplers import MultiLabelSampler

    common, parser = recipe_parser()
    spec = parse_recipe(parser, ["--dataset", "synthetic_multilabel", *TINY])
    model = common.build_model(spec)
    train, test = common.build_datasets(spec, model)
    assert train.multilabel and test.multilabel and train.labels.dim() == 2
    assert torch.equal(train.hierarchy, test.hierarchy) and len(train.hierarchy) == 54
    assert train[0]["image"].shape == (3, 16, 16)

    class _Acc:
        num_processes, process_index = 1, 0

    parts = common.multilabel_parts(spec, _Acc(), train, test)
    assert isinstance(parts["sampler"], MultiLabelSampler) and parts["sampler"].m == spec.train.samples_per_class
    assert isinstance(parts["evaluator"], RetrievalEvaluator) and parts["evaluator"].multilabel
    single = parse_recipe(recipe_parser()[1], ["--dataset", "synthetic", *TINY])
    train1, test1 = common.build_datasets(single, model)
    assert common.multilabel_parts(single, _Acc(), train1, test1) == {}


@pytest.mark.slow
def test_train_happier_multilabel_two_steps(tmp_path):
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the test
    env.update({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = tmp_path / "run"
    argv = [sys.executable, str(RECIPES / "train_happier.py"), *TINY, "--dataset", "synthetic_multilabel",
            "--max_train_steps", "2", "--output_dir", str(out)]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test metrics before / after training:" in proc.stdout
    assert "plots skipped: they need one label per item" in proc.stdout
    final = out / "final"
    for name in ("config.json", "model.safetensors", "README.md", "metrics.json", "training_summary.json"):
        assert (final / name).is_file(), name
    assert not (final / "precision_recall.png").exists()
    metrics = json.loads((final / "metrics.json").read_text())
    for key in ("h_ap", "ndcg", "mean_label_ap", "ap", "recall_at_1"):
        assert 0.0 <= metrics[key] <= 1.0, key
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["steps"] == 2 and set(summary["before"]) >= {"h_ap", "ndcg", "mean_label_ap"}
    config = json.loads((final / "config.json").read_text())
    assert config["training"]["dataset"] == "synthetic_multilabel" and config["training"]["loss"] == "HAPPIER"
