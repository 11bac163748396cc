"""Tests for hub_configs/*.yaml and pml_suprank/hub_config.py: every config validates, builds its model (at tiny size)
and loss; the loader rejects bad configs with clear errors."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml
from _hub_helpers import build_dataset, flat_options, model_kwargs, nest_options, recipe_options

from pml_suprank.data.source import DatasetSource, dataset_source
from pml_suprank.models import RetrievalModel
from pml_suprank.training.hub_config import (
    HUB_CONFIG_SCHEMA,
    HUB_SECTION,
    load_hub_config,
    validate_hub_config,
)
from pml_suprank.training.options import build_loss
from pml_suprank.training.run_spec import merge_hub_configs

ROOT = Path(__file__).resolve().parents[2] / "pml_suprank" / "hub_configs"
# heat_*.yaml belong to the HEAT recipe and follow their own schema
CONFIGS = sorted(p for p in ROOT.glob("*.yaml") if not p.name.startswith("heat_"))
REQUIRED_SETTINGS = {
    "roadmap_sop",
    "roadmap_cub",
    "roadmap_inat",
    "happier_sop",
    "happier_inat_base",
    "happier_inat_full",
    "happier_dyml_vehicle",
    "happier_dyml_animal",
    "happier_dyml_product",
    "rod_ndcg_sop",
    "happier_cifar100",
    "synthetic_shapes_happier",
    "synthetic_shapes_roadmap",
}


def test_every_published_setting_has_a_config():
    assert REQUIRED_SETTINGS <= {p.stem for p in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_validates_and_builds_tiny_model_and_loss(path):
    cfg = load_hub_config(path)
    assert cfg["name"] == path.stem
    # only known sections and keys (validate_hub_config enforces it; checked here against the raw YAML too)
    raw = yaml.safe_load(path.read_text())
    for section, value in raw.items():
        if isinstance(value, dict):
            assert set(value) <= set(HUB_CONFIG_SCHEMA.get(section, HUB_SECTION)), section
    # the model at tiny size: same head options, a tiny trunk and small images
    kwargs = model_kwargs(cfg, backbone="test_resnet", pretrained=False, image_size=32)
    model = RetrievalModel(**kwargs).eval()
    emb = model(torch.randn(2, 3, 32, 32))
    assert emb.shape == (2, cfg["model"].get("embedding_size", 512))
    options = recipe_options(cfg)
    loss_fn = build_loss(options["loss"], options, num_classes=6, embedding_size=emb.shape[1])
    levels = len(cfg["data"].get("label_columns", ["fine_label", "coarse_label"]))
    labels = torch.stack([torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]) // (2**lvl) for lvl in range(levels)], 1)
    emb = torch.nn.functional.normalize(torch.randn(12, emb.shape[1]), dim=1).requires_grad_()
    hierarchical = cfg["loss"]["name"] in ("HAPPIER", "ROD-NDCG")
    value = loss_fn(emb, labels if hierarchical else labels[:, 0])
    assert torch.isfinite(value)
    value.backward()
    assert emb.grad is not None and torch.isfinite(emb.grad).all()
    # metadata for the model card
    results = cfg.get("hub", {}).get("paper_results", {})
    assert all(0 <= v <= 100 for v in results.values())
    if not cfg["name"].startswith("synthetic") and cfg["name"] != "happier_cifar100":
        assert results, "a published setting must carry the paper's numbers"
    # the recipe options: flattened without metadata
    flat = flat_options(cfg)
    assert "name" not in flat and "paper_results" not in flat and flat["backbone"] == cfg["model"]["backbone"]


def _one_per_architecture(paths):
    seen, out = set(), []
    for p in paths:
        m = yaml.safe_load(p.read_text())["model"]
        key = (m["backbone"], m.get("pooling"), m.get("embedding_size"))
        if key not in seen and not p.stem.startswith("synthetic"):
            seen.add(key)
            out.append(p)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", _one_per_architecture(CONFIGS), ids=lambda p: p.stem)
def test_config_builds_its_real_backbone(path):
    cfg = load_hub_config(path)
    model = RetrievalModel(**model_kwargs(cfg, pretrained=False)).eval()  # never downloads in tests
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, cfg["model"]["embedding_size"])
    assert model.data_config["input_size"] == (3, cfg["data"]["image_size"], cfg["data"]["image_size"])


def test_dataset_source():
    cifar = load_hub_config(ROOT / "happier_cifar100.yaml")
    assert dataset_source(cifar["data"], "train") == DatasetSource(
        "retrieval",
        "uoft-cs/cifar100",
        "train",
        options={"label_columns": ["fine_label", "coarse_label"], "open_set": "train", "train_classes_per_coarse": 3},
    )
    assert dataset_source(cifar["data"], "test").options["open_set"] == "test"
    synth = load_hub_config(ROOT / "synthetic_shapes_happier.yaml")
    assert dataset_source(synth["data"], "test") == DatasetSource(
        "synthetic", "synthetic", "test", options={"num_per_class": 32, "image_size": 48}
    )
    with pytest.raises(ValueError, match="part must be"):
        dataset_source(synth["data"], "val")
    with pytest.raises(ValueError, match="part must be"):
        build_dataset(synth, "val")
    test = build_dataset(synth, "test", num_per_class=1)  # overrides are passed to the loader
    assert len(test) == 18 and test.image_size == 48


def test_dataset_source_feeds_load_retrieval_dataset():
    """The CIFAR-100 open-set arguments work end to end on a tiny in-memory stand-in with the same columns."""
    datasets = pytest.importorskip("datasets")
    import numpy as np
    from PIL import Image

    from pml_suprank.data import check_disjoint_classes, load_retrieval_dataset

    fine = list(range(10))
    feats = datasets.Features(
        {
            "img": datasets.Image(),
            "fine_label": datasets.ClassLabel(num_classes=10),
            "coarse_label": datasets.ClassLabel(num_classes=2),
        }
    )
    img = Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8))
    split = datasets.Dataset.from_dict(
        {"img": [img] * 10, "fine_label": fine, "coarse_label": [f // 5 for f in fine]}, features=feats
    )
    dd = datasets.DatasetDict({"train": split, "test": split})
    cfg = load_hub_config(ROOT / "happier_cifar100.yaml")
    parts = {}
    for part in ("train", "test"):
        source = dataset_source(cfg["data"], part)
        assert source.kind == "retrieval" and source.name == "uoft-cs/cifar100"
        kw = {**source.options, "split": source.split}
        parts[part] = load_retrieval_dataset(dd, **kw)
    check_disjoint_classes(parts["train"], parts["test"])
    assert len(parts["train"]) == 6 and len(parts["test"]) == 4


def _base():
    return copy.deepcopy(load_hub_config(ROOT / "happier_sop.yaml"))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda c: c.pop("name"), "missing required key 'name'"),
        (lambda c: c["model"].pop("backbone"), "missing required key 'model.backbone'"),
        (lambda c: c["model"].update(backbone="resnet5000"), "'model.backbone' must be a timm model name"),
        (lambda c: c["model"].update(pooling="sum"), "'model.pooling' must be one of avg, gem, max"),
        (lambda c: c["model"].update(embeding_size=3), "unknown key 'model.embeding_size'"),
        (lambda c: c.update(trainer={}), "unknown top-level key 'trainer'"),
        (lambda c: c["loss"].update(name="TripletLoss"), "'loss.name' must be one of"),
        (lambda c: c["loss"].update(decomposability="proxy"), "'loss.decomposability' does not apply to loss HAPPIER"),
        (lambda c: c["optimizer"].update(lr_backbone=-1.0), r"'optimizer.lr_backbone' must be a number in \[0, 100\]"),
        (lambda c: c["data"].update(dataset="data/sop") or c["data"].pop("label_columns"), "columns' is required"),
        (lambda c: c["data"].update(train_classes_per_coarse=3, train_class_fraction=0.5), "give one open-set rule"),
        (lambda c: c["data"].update(open_set=False, train_class_fraction=0.5), "needs 'data.open_set: true'"),
        (lambda c: c["sampler_options"].update(batch_size=255), "must be a multiple"),
        (lambda c: c["training"].update(warmup_epochs=100), "'training.warmup_epochs' must be <"),  # TrainingConfig's
        (lambda c: c["loss"].update(tau=0.0), r"'loss.tau' must be a number in \(0, 100\]"),
        (lambda c: c["evaluation"].update(eval_batch_size=0), "'evaluation.eval_batch_size' must be an int >= 1"),
        (lambda c: c["hub"].update(paper_results={"h_ap": 0.594 * 1000}), "paper_results"),
        (lambda c: c.update(model=[1, 2]), "section 'model' must be a mapping"),
    ],
)
def test_validation_errors(mutate, match):
    cfg = _base()
    mutate(cfg)
    with pytest.raises(ValueError, match=match):
        validate_hub_config(cfg, source="test.yaml")


def test_loader_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_hub_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(ValueError, match=r"bad\.yaml:1:17: invalid YAML: expected"):
        load_hub_config(bad)
    renamed = tmp_path / "other_name.yaml"
    renamed.write_text((ROOT / "happier_sop.yaml").read_text())
    with pytest.raises(ValueError, match="must equal the file name"):
        load_hub_config(renamed)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3")
    with pytest.raises(ValueError, match="must be a YAML mapping"):
        load_hub_config(scalar)


# ------------------------------------------------------------------------------------------------------------------
# the schema is derived from the option dataclasses; partial files; the one loss builder
# ------------------------------------------------------------------------------------------------------------------
def test_a_fit_heat_config_is_named_as_such_in_one_line(tmp_path, capsys):
    """A fit_heat config given to a training recipe: one line naming its kind and command, not every unknown key;
    a file mixing both kinds keeps the listing of its problems."""
    from pml_suprank.training import recipe

    with pytest.raises(SystemExit) as raised:
        recipe.preset_command("train_happier")[0](["--config", "heat_cifar10_resnet34"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert raised.value.code == 2 and "unknown" not in err
    assert err.endswith("heat_cifar10_resnet34.yaml: a fit_heat config (sections recipe, heat), not a training one; "
                        "give it to pml_suprank.recipes.fit_heat --config (or ood_benchmark --config)")  # fmt: skip
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("name: mixed\nmodel:\n  backbone: test_resnet\nheat:\n  beta: 0\n")
    with pytest.raises(ValueError, match=r"invalid hub_config: unknown top-level key 'heat'"):
        load_hub_config(mixed, partial=True)


def test_schema_is_derived_from_the_option_dataclasses():
    from dataclasses import fields

    from pml_suprank.training import TrainingConfig
    from pml_suprank.training.options import OPTION_CLASSES

    located = {(f.metadata["section"], f.metadata["key"] or f.name) for c in OPTION_CLASSES for f in fields(c)}
    schema_keys = {(s, k) for s, keys in HUB_CONFIG_SCHEMA.items() for k in keys}
    assert schema_keys == {loc for loc in located if loc[0] is not None}
    assert ("loss", "name") in schema_keys and ("evaluation", "eval_batch_size") in schema_keys
    # a value is checked by its option's field (the expectation shown in errors comes from the field metadata)
    assert HUB_CONFIG_SCHEMA["sampler_options"]["batch_size"] == "batch_size"
    with pytest.raises(ValueError, match=r"'sampler_options.batch_size' must be an int >= 2; got 1"):
        validate_hub_config({"sampler_options": {"batch_size": 1, "samples_per_class": 1}}, partial=True)
    # every training field of a hub_config reaches TrainingConfig under its own name
    names = {f.name for f in fields(TrainingConfig)}
    assert {k for k in flat_options(load_hub_config(ROOT / "happier_sop.yaml"))} & names >= {"epochs", "lr_backbone"}


def test_loss_table_and_builder_are_one():
    from pml_suprank.losses import registered_losses
    from pml_suprank.training.options import loss_keys

    base = {"model": {"backbone": "test_resnet"}, "data": {"dataset": "synthetic"}}
    for name in [*registered_losses(), "pml:TripletMarginLoss"]:
        validate_hub_config({**base, "loss": {"name": name}}, partial=True)
    for name in ("Triplet", "pml:NotALoss"):
        with pytest.raises(ValueError, match="'loss.name' must be"):
            validate_hub_config({**base, "loss": {"name": name}}, partial=True)
    assert "alpha" in loss_keys("HAPPIER") and "alpha" not in loss_keys("ROADMAP")
    assert "decomposability" in loss_keys("ROADMAP") and "decomposability" not in loss_keys("ROD-NDCG")
    from pml_suprank import losses
    from pml_suprank.training import build_loss as build_by_name

    roadmap = build_by_name("ROADMAP", {"decomposability": "proxy", "alpha": 3.0, "tau": 0.05}, 4, 8)
    assert isinstance(roadmap, losses.ROADMAPLoss)
    assert sum(p.numel() for p in roadmap.parameters()) == 4 * 8  # ClusterLoss proxies: one per class
    assert isinstance(build_by_name("ROADMAP", {"offset": None}, 4, 8), losses.ROADMAPLoss)
    with pytest.raises(ValueError, match="loss must be one of"):
        build_by_name("Triplet", {}, 4, 8)


def test_partial_override_files(tmp_path):
    override = tmp_path / "faster.yaml"
    override.write_text("training: {epochs: 10}\nevaluation: {eval_every: 0}\n")
    part = load_hub_config(override, partial=True)
    assert part == {"training": {"epochs": 10}, "evaluation": {"eval_every": 0}}
    with pytest.raises(ValueError, match="missing required key 'name'"):
        load_hub_config(override)  # a complete file is required unless partial
    base = load_hub_config(ROOT / "happier_sop.yaml")
    merged = merge_hub_configs(base, part)
    assert merged["training"] == {**base["training"], "epochs": 10} and merged["model"] == base["model"]
    assert base["training"]["epochs"] == 100  # the inputs are untouched
    validate_hub_config(merged)
    # a partial file is still checked key by key and by building the real objects
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampler_options: {batch_size: 30, samples_per_class: 4}\n")
    with pytest.raises(ValueError, match="must be a multiple of samples_per_class"):
        load_hub_config(bad, partial=True)
    bad.write_text("loss: {name: ROADMAP, rho: 2.0, decomposability_weight: 0.2}\n")
    load_hub_config(bad, partial=True)
    bad.write_text("loss: {name: Smooth-AP, rho: 2.0}\n")
    with pytest.raises(ValueError, match="'loss.rho' does not apply to loss Smooth-AP"):
        load_hub_config(bad, partial=True)
    # alpha is also the evaluator's H-AP exponent: accepted with any loss, in a file as on the command line
    bad.write_text("loss: {name: ROADMAP, alpha: 2.0}\n")
    load_hub_config(bad, partial=True)


def test_recipe_options_round_trip():
    cfg = load_hub_config(ROOT / "roadmap_sop.yaml")
    options = recipe_options(cfg)
    assert options["loss"] == "ROADMAP" and "name" not in options and "paper_results" not in options
    nested = nest_options({**options, "not_an_option": 1, "grad_clip": None})
    assert nested["loss"]["name"] == "ROADMAP" and "not_an_option" not in str(nested)
    assert recipe_options(nested) == options
