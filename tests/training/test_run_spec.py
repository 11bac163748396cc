"""The loss registry (pml_suprank.losses.register_loss) and the run specification (pml_suprank.training.RunSpec):
a loss registered with one decorator trains by name through a recipe; a recipe run builds and validates its RunSpec
exactly once; config.json and the model card are written from the spec and the registry."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
import torch
from _helpers import ROOT, import_recipe, parse_recipe, recipe_parser

from pml_suprank import losses
from pml_suprank.losses.registry import SUPRANK_PAPER, loss_entry, register_loss, unregister_loss
from pml_suprank.training import RunSpec

TINY = [
    "--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "4", "--embedding_size", "8",
    "--batch_size", "16", "--eval_batch_size", "64", "--with_tracking", "false", "--cpu", "--no_plots",
    "--max_train_steps", "2", "--skip_initial_eval",
]  # fmt: skip

TEMPORARY_LOSS = '''
from pml_suprank.losses import SupAPLoss, register_loss


@register_loss("TMP-AP", hierarchical=False, paper=("A temporary AP loss (tests, 2026)", "https://example.org/tmp"))
class TmpAPLoss(SupAPLoss):
    """SupAP under another name: a third-party loss registered with one decorator."""

    def __init__(self, tau: float = 0.01, kernel: str = "auto"):
        super().__init__(tau=tau, kernel=kernel)
'''


@pytest.fixture
def temporary_loss(tmp_path):
    """A loss defined in a module of its own (written to tmp_path), registered by importing it; unregistered after."""
    (tmp_path / "tmp_ap_loss.py").write_text(textwrap.dedent(TEMPORARY_LOSS))
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("tmp_ap_loss")
    finally:
        sys.path.remove(str(tmp_path))
    yield module.TmpAPLoss
    unregister_loss("TMP-AP")
    sys.modules.pop("tmp_ap_loss", None)


@pytest.fixture
def counted(monkeypatch):
    """Count RunSpec constructions, runs of the rules between its parts and loss resolutions."""
    from pml_suprank.training import run_spec

    counts = {"built": 0, "rules": 0, "resolved": 0}
    init, rules, resolve = RunSpec.__init__, run_spec.spec_problems, run_spec.resolve_loss

    def counted_init(self, *args, **kwargs):
        counts["built"] += 1
        init(self, *args, **kwargs)

    def counted_rules(*args, **kwargs):
        counts["rules"] += 1
        return rules(*args, **kwargs)

    def counted_resolve(*args, **kwargs):
        counts["resolved"] += 1
        return resolve(*args, **kwargs)

    monkeypatch.setattr(RunSpec, "__init__", counted_init)
    monkeypatch.setattr(run_spec, "spec_problems", counted_rules)
    monkeypatch.setattr(run_spec, "resolve_loss", counted_resolve)
    return counts


# ------------------------------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------------------------------
def _package_losses(**kwargs):
    """The registered losses the package itself defines (a docs example run in this process may add its own)."""
    return {n for n, e in losses.registered_losses(**kwargs).items() if e.cls.__module__.startswith("pml_suprank.")}


def test_the_recipe_losses_are_registered_with_their_properties():
    registered = losses.registered_losses()
    assert _package_losses() == {
        "HAPPIER", "ROADMAP", "ROD-NDCG", "Smooth-AP", "SupAP", "Sup-R@k", "ROD-R@k", "Sup-H-AP", "Sup-NDCG", "CSL"
    }  # fmt: skip
    assert _package_losses(hierarchical=True) == {"HAPPIER", "ROD-NDCG", "Sup-H-AP", "Sup-NDCG", "CSL"}
    assert _package_losses(multilabel=True) == {"HAPPIER", "Sup-H-AP", "Sup-NDCG"}
    for name, cls in [("Smooth-AP", losses.SmoothAPLoss), ("SupAP", losses.SupAPLoss), ("CSL", losses.CSLLoss),
                      ("Sup-R@k", losses.SupRecallLoss), ("ROD-R@k", losses.RODRecallLoss),
                      ("Sup-H-AP", losses.SupHAPLoss), ("Sup-NDCG", losses.SupNDCGLoss)]:  # fmt: skip
        assert registered[name].cls is cls
    assert registered["HAPPIER"].cls is losses.HAPPIERLoss and "Hierarchical" in registered["HAPPIER"].paper[0]
    assert registered["ROADMAP"].paper == SUPRANK_PAPER and not registered["ROADMAP"].hierarchical
    assert loss_entry("RODNDCGLoss") is registered["ROD-NDCG"]  # by class name, as save_pretrained writes it
    with pytest.raises(ValueError, match=r"loss must be one of \['CSL', 'HAPPIER', .*\]; got 'nope'"):
        loss_entry("nope")


def test_register_loss_validates_its_arguments():
    with pytest.raises(TypeError, match="name must be a non-empty string"):
        register_loss("", hierarchical=False)
    with pytest.raises(TypeError, match="hierarchical must be a bool; got int 1"):
        register_loss("X", hierarchical=1)
    with pytest.raises(TypeError, match="paper must be None or a"):
        register_loss("X", hierarchical=False, paper="title only")
    with pytest.raises(TypeError, match="options must be None or a sequence"):
        register_loss("X", hierarchical=False, options="tau")
    with pytest.raises(TypeError, match="decorates an nn.Module class"):
        register_loss("X", hierarchical=False)(object)
    with pytest.raises(ValueError, match="'HAPPIER' is already registered for HAPPIERLoss"):
        register_loss("HAPPIER", hierarchical=True)(losses.SupAPLoss)
    with pytest.raises(KeyError, match="not registered"):
        unregister_loss("X")


def test_a_registered_loss_is_a_recipe_choice_a_hub_config_name_and_a_card_paper(temporary_loss):
    from pml_suprank.hub._card_sections import _paper
    from pml_suprank.training.hub_config import validate_hub_config
    from pml_suprank.training.options import build_loss, loss_keys

    assert loss_keys("TMP-AP") == ("tau", "kernel")  # the loss options its constructor names
    assert isinstance(build_loss("TMP-AP", {"tau": 0.05, "alpha": 3.0}, 4, 8), temporary_loss)
    parser = recipe_parser("train_roadmap")[1]
    assert "TMP-AP" in parser.epilog  # --help / --list_losses list every registered loss
    base = {"name": "t", "model": {"backbone": "test_resnet"}, "data": {"dataset": "synthetic"}}
    validate_hub_config({**base, "loss": {"name": "TMP-AP", "tau": 0.02}})
    with pytest.raises(ValueError, match="'loss.rho' does not apply to loss TMP-AP"):
        validate_hub_config({**base, "loss": {"name": "TMP-AP", "rho": 10.0}})
    assert _paper("TMP-AP") == _paper("TmpAPLoss") == ("A temporary AP loss (tests, 2026)", "https://example.org/tmp")
    assert _paper("SomethingElse") == SUPRANK_PAPER


def test_a_loss_registered_in_a_temporary_module_trains_two_recipe_steps_by_name(temporary_loss, counted, tmp_path):
    train_roadmap = import_recipe("train_roadmap")
    out = tmp_path / "run"
    summary = train_roadmap.main([*TINY, "--loss", "TMP-AP", "--tau", "0.02", "--output_dir", str(out)])
    assert summary["steps"] == 2 and all(torch.isfinite(torch.tensor(v)) for v in summary["after"].values())
    assert counted == {"built": 1, "rules": 1, "resolved": 1}  # the configuration is built and checked once
    config = json.loads((out / "final" / "config.json").read_text())["training"]
    assert config["loss"] == "TMP-AP" and config["loss_kwargs"] == {"tau": 0.02, "kernel": "auto"}
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["loss"] == {"name": "TMP-AP", "tau": 0.02, "kernel": "auto"}
    assert "A temporary AP loss (tests, 2026)" in (out / "final" / "README.md").read_text()


# ------------------------------------------------------------------------------------------------------------------
# the spec
# ------------------------------------------------------------------------------------------------------------------
def test_a_hub_config_run_builds_and_validates_its_spec_once(counted, tmp_path):
    train_roadmap = import_recipe("train_roadmap")
    out = tmp_path / "run"
    config = ROOT / "pml_suprank" / "hub_configs" / "synthetic_shapes_roadmap.yaml"
    summary = train_roadmap.main(["--config", str(config), *TINY, "--output_dir", str(out)])
    assert summary["steps"] == 2
    assert counted == {"built": 1, "rules": 1, "resolved": 1}
    saved = json.loads((out / "final" / "config.json").read_text())["training"]
    assert saved["loss_kwargs"] == {
        "decomposability": "calibration", "decomposability_weight": 0.1, "tau": 0.01, "rho": 100.0, "delta": None,
        "start": None, "offset": None, "kernel": "auto",
    }  # fmt: skip
    assert "ROADMAP" in (out / "final" / "README.md").read_text()


def test_flags_override_the_config_which_overrides_the_recipe_defaults(tmp_path):
    common, parser = recipe_parser("train_happier")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("training: {epochs: 7, seed: 3}\nloss: {name: ROD-NDCG, tau: 0.05}\nmodel: {embedding_size: 32}\n")
    spec = parse_recipe(parser, ["--config", str(cfg), "--seed", "4", "--rho", "50"])
    assert (spec.train.epochs, spec.train.seed, spec.train.lr_backbone) == (7, 4, 1e-3)  # file, flag, recipe
    assert (spec.loss.loss, spec.loss.tau, spec.loss.rho, spec.model.embedding_size) == ("ROD-NDCG", 0.05, 50.0, 32)
    assert spec.training_config().hierarchical_labels and not spec.hub_config.get("name")
    assert spec.loss_kwargs()["tau"] == 0.05 and "alpha" not in spec.loss_kwargs()  # ROD-NDCG takes no alpha
    roadmap = parse_recipe(recipe_parser("train_roadmap")[1], [])
    assert not roadmap.training_config().hierarchical_labels
    assert roadmap.training_config(multilabel=True).hierarchical_labels


def test_command_line_values_get_the_hub_config_checks(capsys):
    common, parser = recipe_parser("train_happier")
    with pytest.raises(SystemExit):
        parse_recipe(parser, ["--image_size", "4"])
    assert "image_size must be an int in [8, 4096]; got 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_recipe(recipe_parser("train_happier")[1], ["--backbone", "resnet5000"])
    assert "backbone must be a timm model name" in capsys.readouterr().err


def test_from_values_names_unknown_options_and_training_errors():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['epoch'\]"):
        RunSpec.from_values({"epoch": 3})
    with pytest.raises(ValueError, match="batch_size must be a multiple of samples_per_class"):
        RunSpec.from_values({"batch_size": 30, "samples_per_class": 4})
    with pytest.raises(ValueError, match="--dataset sop: .*--data_root"):
        RunSpec.from_values({"dataset": "sop"})
    spec = RunSpec.from_values({"dataset": "sop", "data_root": "/nowhere"})
    assert (
        spec.run_options("no")["data"]["train_split"] == "train" and "data_root" not in spec.run_options("no")["data"]
    )


def test_the_training_rules_name_where_the_value_came_from(tmp_path, capsys):
    """A batch the sampler's groups do not divide, a warm-up as long as training: the flag or the file and key that
    set the value is named, as a field check names it; in Python, the bare field name."""
    parser = recipe_parser("train_happier")[1]
    config = tmp_path / "batch.yaml"
    config.write_text("sampler_options: {batch_size: 16}\ntraining: {warmup_epochs: 3, epochs: 3}\n")
    multiple = "must be a multiple of samples_per_class = 3; got"
    for argv, where in [
        (["--batch_size", "32", "--samples_per_class", "3"], f"--batch_size {multiple} 32 (use e.g. 33 or 30)"),
        (["--config", str(config), "--samples_per_class", "3", "--warmup_epochs", "0"],
         f"{config}: sampler_options.batch_size {multiple} 16"),
        (["--config", str(config)], f"{config}: training.warmup_epochs must be < epochs = 3; got 3"),
        (["--virtual_batch_size", "30", "--batch_size", "30"], "--virtual_batch_size 30 is not a whole number"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            parse_recipe(parser, argv)
        assert exit_info.value.code == 2 and where in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^batch_size must be a multiple of samples_per_class = 4; got 30 \(use e"):
        RunSpec.from_values({"batch_size": 30, "samples_per_class": 4})


def test_run_options_is_the_run_fingerprint_unchanged():
    """``run_options`` identifies a run (resume compares it): its keys, their order and its values are pinned."""
    spec = RunSpec.from_values({"dataset": "sop", "data_root": "/x", "loss": "ROADMAP", "tau": 0.05})
    assert json.dumps(spec.run_options("fp16")) == (
        '{"model": {"backbone": "test_resnet", "pretrained": false, "pooling": "avg", "embedding_size": 128, '
        '"layer_norm": true, "projection_init": "random", "backbone_kwargs": null, "crop_pct": null, '
        '"crop_mode": null}, '
        '"data": {"dataset": "sop", "label_columns": null, "train_split": "train", "test_split": "test", '
        '"num_per_class": 32, "image_size": 48, "crop_scale": [0.5, 1.0], "auto_augment": null, "re_prob": 0.0, '
        '"open_set": false, "train_classes_per_coarse": null, "train_class_fraction": null}, '
        '"loss": {"name": "ROADMAP", "decomposability": "calibration", "decomposability_weight": 0.1, "tau": 0.05, '
        '"rho": 100.0, "delta": null, "start": null, "offset": null, "kernel": "auto"}, "mixed_precision": "fp16"}'
    )


def test_a_config_file_never_sets_a_flag_only_option(capsys):
    """``option(..., file=False)`` (``push_to_hub``, ``hub_model_id``, ``hub_private``, ``model``): ``parse`` refuses
    it from any ``--config`` layer, naming the file and the flag; the same value typed as a flag is taken."""
    from dataclasses import dataclass

    from pml_suprank.training.options import ModelUseOptions, RunOptions
    from pml_suprank.training.spec import parse, shared

    @dataclass
    class Spec:
        push_to_hub: bool = shared(RunOptions, "push_to_hub")
        model: str | None = shared(ModelUseOptions, "model")
        batch_size: int = shared(ModelUseOptions, "batch_size")

        @classmethod
        def read_config(cls, path):
            flag_only = {} if path == "ok" else {path: (f"{path}: recipe.{path}", "x")}
            return {}, {"batch_size": (f"{path}: recipe.batch_size", 8), **flag_only}

    assert parse(Spec, ["--config", "ok", "--push_to_hub"]) == Spec(push_to_hub=True, batch_size=8)
    for name in ("push_to_hub", "model"):
        with pytest.raises(SystemExit):
            parse(Spec, ["--config", name])
        assert f"{name}: recipe.{name}: a config file cannot set {name}; give --{name}" in capsys.readouterr().err
