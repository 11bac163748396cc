"""Files are data: reading or validating a hub_config, a ``--config`` YAML or a model folder's ``data_spec.json``
never imports a module, never uploads, never fetches code and never reads a path the user did not name; a loss name
typed on the command line is imported (from the working directory too, as ``python -m`` does) with its real error;
loss arguments and learning rates are bounded where they are declared."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from _helpers import import_recipe

from pml_suprank.losses import registry
from pml_suprank.losses.registry import ENTRY_POINT_GROUP, check_loss_name, register_loss, resolve_loss
from pml_suprank.training import RunSpec
from pml_suprank.training import recipe as common
from pml_suprank.training.hub_config import load_hub_config, read_hub_config, validate_hub_config
from pml_suprank.training.spec import parse

PAYLOAD = """
from pathlib import Path

Path(__file__).with_name("IMPORTED").write_text("payload ran")


class Loss:
    pass
"""


@pytest.fixture
def payload(tmp_path, monkeypatch):
    """A module next to a downloaded config, importable (its folder on sys.path) and marking its own import."""
    (tmp_path / "payload_mod_files_data.py").write_text(PAYLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("payload_mod_files_data", None)


def _config(tmp_path: Path, name: str, loss: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "model": {"backbone": "test_resnet"},
                                    "data": {"dataset": "synthetic"}, "loss": {"name": loss}}))  # fmt: skip
    return path


def test_a_module_loss_in_a_hub_config_is_refused_without_importing_it(payload):
    path = _config(payload, "evil", "payload_mod_files_data:Loss")
    for read in (read_hub_config, load_hub_config):
        with pytest.raises(ValueError, match="imported only when typed on the command line"):
            read(path)
    with pytest.raises(ValueError, match="never from a file"):
        validate_hub_config(yaml.safe_load(path.read_text()))
    assert "payload_mod_files_data" not in sys.modules and not (payload / "IMPORTED").exists()
    # the standard library's "this" is not imported (and its text not printed) by a validation either
    sys.modules.pop("this", None)
    with pytest.raises(ValueError, match="loss.name"):
        load_hub_config(_config(payload, "zen", "this:Nope"))
    assert "this" not in sys.modules


def test_the_training_command_refuses_a_config_files_module_loss_in_one_line(payload, capsys):
    path = _config(payload, "evil", "payload_mod_files_data:Loss")
    with pytest.raises(SystemExit) as e:
        common.main(["--config", str(path), "--cpu"], "test", common.PRESETS["train"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert e.value.code == 2 and len(err) == 1 and "never from a file" in err[0]
    assert "payload_mod_files_data" not in sys.modules and not (payload / "IMPORTED").exists()


def test_a_typed_module_loss_is_imported_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "cwd_loss_files_data.py").write_text(
        textwrap.dedent("""
        from pytorch_metric_learning.losses import ContrastiveLoss


        class CwdLoss(ContrastiveLoss):
            pass
    """)
    )
    monkeypatch.chdir(tmp_path)
    assert str(tmp_path) not in sys.path and "" not in sys.path[:1]
    try:
        spec = parse(RunSpec, ["--loss", "cwd_loss_files_data:CwdLoss"])  # typed: imported from the working dir
        assert spec.loss_entry.cls.__name__ == "CwdLoss" and str(tmp_path) not in sys.path
    finally:
        sys.modules.pop("cwd_loss_files_data", None)


@pytest.mark.parametrize(
    ("loss", "cause"),
    [
        ("no_such_module_files_data:Loss", "ModuleNotFoundError: No module named 'no_such_module_files_data'"),
        (
            "pml:MultiSimilarityLos",
            "AttributeError: .* has no attribute 'MultiSimilarityLos'; did you mean 'MultiSimilarityLoss'",
        ),
        ("broken_dep_files_data:Loss", "ModuleNotFoundError: No module named 'a_dependency_that_is_missing'"),
        ("torch.nn:MSELoss", "is not a metric loss"),
    ],
)
def test_a_typed_loss_that_cannot_be_used_names_the_real_cause_in_one_line(loss, cause, tmp_path, monkeypatch,
                                                                          capsys):  # fmt: skip
    (tmp_path / "broken_dep_files_data.py").write_text("import a_dependency_that_is_missing\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        common.main(["--loss", loss, "--cpu"], "test", common.PRESETS["train"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert e.value.code == 2 and len(err) == 1
    import re

    assert re.search(cause, err[0]), err[0]
    sys.modules.pop("broken_dep_files_data", None)


def test_entry_points_come_from_installed_distributions_not_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "evil_plugin_files_data.py").write_text(PAYLOAD)
    info = tmp_path / "evil_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nEvilAP = evil_plugin_files_data:Loss\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the working directory first on sys.path, as `python -m` puts it
    assert "EvilAP" not in registry.installed_plugins() and check_loss_name("EvilAP") is not None
    with pytest.raises(ValueError, match="got 'EvilAP'"):
        resolve_loss("EvilAP")
    assert "evil_plugin_files_data" not in sys.modules and not (tmp_path / "IMPORTED").exists()


def test_a_registered_name_is_not_replaced_by_another_modules_class():
    from pml_suprank.losses import HAPPIERLoss

    impostor = type("HAPPIERLoss", (HAPPIERLoss,), {"__module__": "someone_else"})
    with pytest.raises(ValueError, match="'HAPPIER' is already registered for HAPPIERLoss"):
        register_loss("HAPPIER", hierarchical=True)(impostor)
    assert registry.loss_entry("HAPPIER").cls is HAPPIERLoss


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"loss": "pml:ContrastiveLoss", "loss_kwargs": {"pos_margin": float("nan")}}, "loss_kwargs must be"),
        ({"loss": "pml:ArcFaceLoss", "loss_kwargs": {"scale": 1e30}}, "loss_kwargs must be"),
        ({"loss": "pml:ArcFaceLoss", "loss_kwargs": {"num_classes": 10}}, r"\['num_classes'\] set what the num_cl"),
        ({"loss": "SupAP", "tau": 0.5, "loss_kwargs": {"tau": 0.01}}, r"--loss_kwargs \['tau'\] set what --tau"),
        ({"loss": "pml:ContrastiveLoss", "loss_kwargs": {"pos_margin": {"nested": 1}}}, "loss_kwargs must be"),
        ({"loss": "pml:ContrastiveLoss", "loss_kwargs": {f"k{i}": 1 for i in range(40)}}, "at most 32 keys"),
        ({"lr_backbone": 1e38}, r"lr_backbone must be a number in \[0, 100\]"),
        ({"lr_head": float("inf")}, r"lr_head must be a number in \[0, 100\]"),
        ({"weight_decay": 1e20}, r"weight_decay must be a number in \[0, 10\]"),
        ({"loss": "torch.nn:MSELoss"}, "is not a metric loss"),
    ],
)
def test_loss_arguments_and_rates_are_bounded_where_declared(values, match):
    with pytest.raises(ValueError, match=match):
        RunSpec.from_values(values)


def test_yaml_dates_and_other_non_json_values_are_refused_when_read(tmp_path):
    path = tmp_path / "dated.yaml"
    path.write_text("name: dated\nmodel: {backbone: test_resnet}\ndata: {dataset: synthetic}\nloss: {name: HAPPIER}\n"
                    "description: 2026-12-01\n")  # fmt: skip
    with pytest.raises(ValueError, match=r"line 5: '2026-12-01' is a date or time \(quote it"):
        read_hub_config(path)
    path.write_text("name: dated\nnotes: !!set {a, b}\n")
    with pytest.raises(ValueError, match="is a set"):
        read_hub_config(path, partial=True)


@pytest.mark.parametrize(
    ("recipe", "match"),
    [
        ({"push_to_hub": True}, "recipe.push_to_hub: a config file cannot set push_to_hub"),
        ({"hub_model_id": "someone/else"}, "recipe.hub_model_id: a config file cannot set hub_model_id"),
        ({"backbone": "hf-hub:someone/weights"}, "plain timm model name"),
        ({"backbone": "local-dir:/tmp/x"}, "plain timm model name"),
        ({"model": "someone/model"}, "recipe.model: a config file cannot set model"),
        ({"checkpoint": "/etc/passwd"}, "recipe.checkpoint: a config file cannot set checkpoint"),
    ],
)
def test_a_heat_config_cannot_upload_or_fetch(recipe, match, tmp_path, capsys):
    path = tmp_path / "heat.yaml"
    path.write_text(yaml.safe_dump({"recipe": recipe}))
    with pytest.raises(SystemExit) as e:
        import_recipe("fit_heat").parse_args(["--config", str(path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and match in err and "--" in err


# ------------------------------------------------------------------------------------------------ data_spec.json
def _model_folder(tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    spec = {"version": 1, "data": {"dataset": "synthetic", "num_per_class": 4, "image_size": 32}, "seed": 0,
            "k_values": [1, 2], "alpha": 1.0}  # fmt: skip
    for key, value in changes.items():
        if key.startswith("data_"):
            spec["data"][key[5:]] = value
        else:
            spec[key] = value
    (folder / "data_spec.json").write_text(json.dumps(spec, allow_nan=True))
    return folder


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"k_values": "abc"}, "k_values must be"),
        ({"alpha": float("nan")}, "alpha"),
        ({"data_num_per_class": 10**9}, r"data.num_per_class must be an int in \[1, 100000\]"),
        ({"data_image_size": 100000}, r"data.image_size must be an int in \[8, 4096\]"),
        ({"version": 99}, "'version' must be an int in"),
        ({"extra": 1}, "unknown key 'extra'"),
        ({"local_dataset": "yes"}, "'local_dataset' must be a bool; got 'yes'"),
        ({"class_split": {"train_classes": [1]}}, "'class_split' must be a mapping of train_classes / test_classes"),
        ({"data_script": "x.py"}, "unknown key 'data.script'"),
    ],
)
def test_a_recorded_data_spec_passes_the_flags_checks(changes, match, tmp_path, capsys):
    from pml_suprank.training.spec import model_data

    with pytest.raises(ValueError, match=match):
        model_data(_model_folder(tmp_path, **changes))
    assert model_data(_model_folder(tmp_path))["data"]["num_per_class"] == 4
    # the recipes read it once, in parse: one error line naming --model, exit 2
    folder = _model_folder(tmp_path, **changes)
    with pytest.raises(SystemExit) as e:
        import_recipe("evaluate").parse_args(["--model", str(folder)])
    assert e.value.code == 2 and "--model:" in capsys.readouterr().err


def test_the_recorded_evaluator_options_are_a_layer_under_the_flags(tmp_path):
    folder = _model_folder(tmp_path, seed=3)
    spec = import_recipe("evaluate").parse_args(["--model", str(folder)])
    assert (spec.seed, spec.k_values, spec.alpha, spec.model_data["data"]["num_per_class"]) == (3, [1, 2], 1.0, 4)
    spec = import_recipe("evaluate").parse_args(["--model", str(folder), "--seed", "1", "--k_values", "5"])
    assert (spec.seed, spec.k_values) == (1, [5])
    spec = import_recipe("search").parse_args(["--model", str(folder), "--output_dir", str(tmp_path / "s")])
    assert spec.seed == 3 and spec.model_data["data"]["dataset"] == "synthetic"
    # another dataset typed: the recorded data section does not apply, the recorded seed still does
    spec = import_recipe("search").parse_args(["--model", str(folder), "--gallery", "org/other", "--output_dir", "o"])
    assert spec.model_data["data"] is None and spec.seed == 3


def test_a_recorded_path_outside_the_model_folder_is_not_followed_unasked(tmp_path):
    from pml_suprank.training.spec import model_data as read_data_spec

    elsewhere = tmp_path / "private_photos"
    (elsewhere / "a").mkdir(parents=True)
    folder = _model_folder(tmp_path, data_dataset=str(elsewhere), data_num_per_class=None, data_image_size=None)
    spec = json.loads((folder / "data_spec.json").read_text())
    spec["data"] = {"dataset": str(elsewhere), "label_columns": ["label"]}
    (folder / "data_spec.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="a path outside the model folder.*give --dataset"):
        read_data_spec(folder)
    assert read_data_spec(folder, str(elsewhere))["data"]["dataset"] == str(elsewhere)
    # a folder shipped inside the model folder is the model's own data
    (folder / "gallery" / "a").mkdir(parents=True)
    spec["data"] = {"dataset": "gallery", "label_columns": ["label"]}
    (folder / "data_spec.json").write_text(json.dumps(spec))
    assert read_data_spec(folder)["data"]["dataset"] == str((folder / "gallery").resolve())


@pytest.mark.parametrize(
    ("section", "values", "match"),
    [
        ("model", {"backbone": "hf-hub:someone/weights"}, "plain timm model name"),
        ("model", {"backbone": "local-dir:/tmp/weights"}, "plain timm model name"),
        ("training", {"push_to_hub": True}, "unknown key 'training.push_to_hub'"),
        ("training", {"hub_model_id": "someone/else"}, "unknown key 'training.hub_model_id'"),
    ],
)
def test_a_training_config_file_cannot_upload_or_fetch(section, values, match, tmp_path, capsys):
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump({section: values}))
    with pytest.raises(SystemExit) as e:
        common.main(["--config", str(path), "--cpu"], "test", common.PRESETS["train"])
    assert e.value.code == 2 and match in capsys.readouterr().err
