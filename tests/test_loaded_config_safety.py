"""Loaded configs (issue 20 items 5 and 6): booleans strictly typed, unknown timm layer names a clear ValueError
naming the file and the key."""

from __future__ import annotations

import json

import pytest
import torch

from pml_suprank.models import RetrievalModel

pytestmark = pytest.mark.hub
pytest.importorskip("safetensors.torch")
TINY = "test_resnet"


@pytest.fixture()
def folder(tmp_path):
    torch.manual_seed(0)
    out = tmp_path / "tiny-model"
    RetrievalModel(TINY, embedding_size=8, image_size=32).save_pretrained(out)
    return out


def _edit(folder, **model_args):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["model_args"].update(model_args)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("value", ["false", "False", 0, None, [False]])
def test_string_boolean_layer_norm_is_refused(folder, value):
    # issue 20 item 5: "layer_norm": "false" built a model with LayerNorm on
    path = _edit(folder, layer_norm=value)
    with pytest.raises(ValueError, match="layer_norm must be a bool") as info:
        RetrievalModel.from_pretrained(folder)
    assert str(path) in str(info.value)
    with pytest.raises(TypeError, match="layer_norm must be a bool") as info:  # trusted: the constructor refuses
        RetrievalModel.from_pretrained(folder, trust_config=True)
    assert str(folder) in str(info.value)


def test_layer_norm_false_is_honoured(folder):
    _edit(folder, layer_norm=False)
    model = RetrievalModel.from_pretrained(folder)
    assert isinstance(model.norm, torch.nn.Identity)


def test_constructor_refuses_a_non_bool_layer_norm():
    with pytest.raises(TypeError, match="layer_norm must be a bool; got str 'false'"):
        RetrievalModel(TINY, embedding_size=8, layer_norm="false")


@pytest.mark.parametrize("key", ["act_layer", "norm_layer"])
def test_unknown_timm_layer_name_is_a_value_error_naming_file_and_key(folder, key):
    # issue 20 item 6: a raw KeyError from deep inside timm
    _edit(folder, backbone_kwargs={key: "nolayer"})
    with pytest.raises(ValueError, match=rf"backbone_kwargs\['{key}'\] must name a timm .*'nolayer'") as info:
        RetrievalModel.from_pretrained(folder)
    assert str(folder) in str(info.value)
    with pytest.raises(ValueError, match=rf"backbone_kwargs\['{key}'\]"):
        RetrievalModel(TINY, embedding_size=8, backbone_kwargs={key: "nolayer"})


def test_known_timm_layer_names_build():
    model = RetrievalModel(TINY, embedding_size=8, image_size=32, backbone_kwargs={"act_layer": "gelu"})
    assert "GELU" in {type(m).__name__ for m in model.backbone.modules()}  # timm.layers.GELU


def test_errors_show_loaded_values_truncated(folder):
    # issue 20 item 3: an error message must not echo a huge loaded value
    huge = list(range(100_000))
    _edit(folder, embedding_size=huge)
    with pytest.raises(ValueError, match="embedding_size must be null or an int") as info:
        RetrievalModel.from_pretrained(folder)
    assert len(str(info.value)) < 600
    _edit(folder, embedding_size=8, backbone_kwargs={"drop_rate": "x" * 100_000})
    with pytest.raises(ValueError, match=r"backbone_kwargs\['drop_rate'\]") as info:
        RetrievalModel.from_pretrained(folder)
    assert len(str(info.value)) < 600


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ({"backbone": "hf-hub:timm/resnet18.a1_in1k"}, r"model\.backbone must be a plain timm model name"),
        ({"backbone": "local-dir:/tmp/x"}, r"model\.backbone must be a plain timm model name"),
        ({"backbone_kwargs": {"checkpoint_path": "/tmp/x.pth"}}, r"model\.backbone_kwargs\['checkpoint_path'\] is not"),
        ({"backbone_kwargs": {"pretrained_cfg_overlay": {"f": 1}}}, r"backbone_kwargs\[.pretrained_cfg_overlay.\]"),
        ({"backbone_kwargs": {"drop_rate": 5.0}}, r"model\.backbone_kwargs\['drop_rate'\] must be a number in \[0, 1"),
    ],
)
def test_hub_config_is_held_to_the_loaded_config_rule(tmp_path, model, match):
    from pml_suprank.training import hub_config

    config = hub_config.read_hub_config("synthetic_shapes_happier")
    config["model"].update(model)
    with pytest.raises(ValueError, match=match) as info:
        hub_config.validate_hub_config(config, "shared.yaml")
    assert "held to the rule of a loaded config.json" in str(info.value)
    # the same values in a saved config.json: refused by the same rule
    path = tmp_path / "m" / "config.json"
    RetrievalModel(TINY, embedding_size=8, image_size=32).save_pretrained(path.parent)
    _edit(path.parent, **model)
    with pytest.raises(ValueError, match=match.replace(r"model\.", r"model_args\.")) as info:
        RetrievalModel.from_pretrained(path.parent)
    assert str(path) in str(info.value) and "trust_config=True" in str(info.value)


def test_hub_config_with_allowed_backbone_kwargs_is_valid():
    from pml_suprank.training import hub_config

    config = hub_config.read_hub_config("synthetic_shapes_happier")
    config["model"]["backbone_kwargs"] = {"drop_rate": 0.1}
    assert hub_config.validate_hub_config(config, "shared.yaml") is config


@pytest.mark.parametrize(
    ("model_args", "match"),
    [
        ({"backbone_kwargs": {"output_stride": 9}}, r"backbone_kwargs\['output_stride'\] must be 8, 16 or 32; got 9"),
        ({"backbone_kwargs": {"norm_layer": ""}}, r"backbone_kwargs\['norm_layer'\] must be a short name; got ''"),
        ({"std": [1e-300, 1, 1]}, r"model_args.std must be null or a list of numbers in \[0.001, 10\]"),
        ({"mean": [1e308, 0, 0]}, r"model_args.mean must be null or a list of numbers in \[-10, 10\]"),
    ],
)
def test_a_loaded_value_timm_asserts_on_or_that_makes_features_overflow_is_refused(folder, model_args, match):
    """An output stride timm asserts on (a raw AssertionError), an empty layer name (``'NoneType' object is not
    callable``), a normalisation that scales pixels to ±1e300 (infinite features, silently): refused by name."""
    path = _edit(folder, **model_args)
    with pytest.raises(ValueError, match=match) as info:
        RetrievalModel.from_pretrained(folder)
    assert str(path) in str(info.value)


def test_the_supported_output_strides_and_a_usual_normalisation_load(folder):
    _edit(folder, backbone_kwargs={"output_stride": 16}, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    assert RetrievalModel.from_pretrained(folder).data_config["std"] == (0.5, 0.5, 0.5)
