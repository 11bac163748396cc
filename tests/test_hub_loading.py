"""Loading a RetrievalModel from an untrusted folder: the config's backbone and backbone_kwargs are restricted to an
allow-list and sizes are bounded unless ``trust_config=True``; implausible tensors are refused naming file and key;
the model card's usage line loads the folder it is written in; files get the umask's permissions."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from pml_suprank import ood
from pml_suprank.models import RetrievalModel

pytestmark = pytest.mark.hub

safetensors_torch = pytest.importorskip("safetensors.torch")
TINY = "test_resnet"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("saved") / "tiny-model"
    RetrievalModel(TINY, pooling="gem", embedding_size=8, image_size=32, num_classes=3).save_pretrained(folder)
    return folder


@pytest.fixture()
def folder(saved, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    for f in saved.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def _edit_config(folder, **model_args):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["model_args"].update(model_args)
    path.write_text(json.dumps(config))
    return path


@pytest.fixture()
def create_model_calls(monkeypatch):
    """Record every timm.create_model call; build the real tiny model without the recorded extra kwargs (nothing is
    read from disk, nothing is unpickled, nothing is downloaded)."""
    import timm

    calls = []
    real = timm.create_model

    def spy(name, **kwargs):
        calls.append((name, dict(kwargs)))
        return real(TINY, pretrained=False, num_classes=kwargs.get("num_classes", 0))

    monkeypatch.setattr(timm, "create_model", spy)
    return calls


def test_planted_checkpoint_path_is_refused_unless_trusted(folder, tmp_path, create_model_calls):
    payload = tmp_path / "payload.pth"
    payload.write_bytes(b"not read")
    path = _edit_config(folder, backbone_kwargs={"checkpoint_path": str(payload)})
    with pytest.raises(ValueError, match=r"backbone_kwargs\['checkpoint_path'\] is not allowed") as info:
        RetrievalModel.from_pretrained(folder)
    assert str(path) in str(info.value) and "trust_config=True" in str(info.value)
    assert create_model_calls == []  # refused before timm is called
    RetrievalModel.from_pretrained(folder, trust_config=True)
    assert create_model_calls == [(TINY, {"pretrained": False, "num_classes": 0, "checkpoint_path": str(payload)})]


@pytest.mark.parametrize(
    ("backbone_kwargs", "key"),
    [
        ({"pretrained_cfg_overlay": {"file": "/etc/passwd"}}, "pretrained_cfg_overlay"),
        ({"pretrained_cfg": {"hf_hub_id": "org/other"}}, "pretrained_cfg"),
        ({"pretrained": True}, "pretrained"),
        ({"features_only": True}, "features_only"),
        ({"global_pool": "hf-hub:org/other"}, "global_pool"),
        ({"act_layer": "../../x"}, "act_layer"),
        ({"drop_rate": 5.0}, "drop_rate"),
        ({"drop_path_rate": float("nan")}, "drop_path_rate"),
        ({"img_size": 10**6}, "img_size"),
        ({"in_chans": True}, "in_chans"),
    ],
)
def test_backbone_kwargs_outside_the_allow_list_are_refused(folder, backbone_kwargs, key, create_model_calls):
    path = _edit_config(folder, backbone_kwargs=backbone_kwargs)
    with pytest.raises(ValueError, match=rf"model_args.backbone_kwargs\['{key}'\]") as info:
        RetrievalModel.from_pretrained(folder)
    assert str(path) in str(info.value)
    assert create_model_calls == []


def test_allowed_backbone_kwargs_and_caller_overrides_load(folder, create_model_calls):
    _edit_config(folder, backbone_kwargs={"drop_rate": 0.1, "drop_path_rate": 0.05, "zero_init_last": True})
    RetrievalModel.from_pretrained(folder)
    assert create_model_calls[-1][1] == {
        "pretrained": False,
        "num_classes": 0,
        "drop_rate": 0.1,
        "drop_path_rate": 0.05,
        "zero_init_last": True,
    }
    # the caller's own arguments replace the saved ones and are not checked against the allow-list
    _edit_config(folder, backbone_kwargs={"checkpoint_path": "/nonexistent"})
    RetrievalModel.from_pretrained(folder, backbone_kwargs={"my_option": 1})
    assert create_model_calls[-1][1] == {"pretrained": False, "num_classes": 0, "my_option": 1}


@pytest.mark.parametrize("backbone", ["hf-hub:org/other-model", "local-dir:/tmp/x", "/tmp/x", "resnet50:evil", ""])
def test_backbone_must_be_a_plain_timm_name_unless_trusted(folder, backbone, create_model_calls):
    path = _edit_config(folder, backbone=backbone)
    with pytest.raises(ValueError, match="model_args.backbone must be a plain timm model name") as info:
        RetrievalModel.from_pretrained(folder)
    assert str(path) in str(info.value) and create_model_calls == []
    if backbone.startswith("hf-hub:"):
        RetrievalModel.from_pretrained(folder, trust_config=True)
        assert create_model_calls[-1][0] == backbone


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("embedding_size", 10**9),
        ("embedding_size", 1e9),
        ("embedding_size", 0),
        ("num_classes", 10**8),
        ("num_classes", -1),
        ("image_size", 10**6),
        ("gem_p", float("inf")),
        ("mean", [0.5, float("nan"), 0.5]),
    ],
)
def test_sizes_of_a_loaded_config_are_bounded(folder, key, value, create_model_calls):
    path = _edit_config(folder, **{key: value})
    with pytest.raises(ValueError, match=rf"model_args\.{key} must be") as info:
        RetrievalModel.from_pretrained(folder)
    assert str(path) in str(info.value) and create_model_calls == []


def test_trust_config_must_be_a_bool(folder):
    with pytest.raises(TypeError, match=r"trust_config must be a bool \(true or false\); got str 'yes'"):
        RetrievalModel.from_pretrained(folder, trust_config="yes")


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("projection.weight", lambda t: t.clone().fill_(float("nan")), "NaN or infinite"),
        ("projection.bias", lambda t: t.clone().fill_(float("-inf")), "NaN or infinite"),
        ("backbone.conv1.0.weight", lambda t: t.clone().fill_(float("nan")), "NaN or infinite"),
        ("projection.weight", torch.zeros_like, "all zeros"),
        ("pool.gem.p", lambda t: -t, "GeM exponent"),
        ("backbone.bn1.running_var", lambda t: -t - 1, "negative values"),
    ],
)
def test_implausible_weights_are_refused_naming_file_and_key(folder, key, value, match):
    weights = folder / "model.safetensors"
    state = safetensors_torch.load_file(weights)
    assert key in state, sorted(state)
    safetensors_torch.save_file({**state, key: value(state[key]).contiguous()}, weights)
    for strict in (True, False):
        with pytest.raises(ValueError, match=match) as info:
            RetrievalModel.from_pretrained(folder, strict=strict)
        assert str(weights) in str(info.value) and repr(key) in str(info.value)


def _usage_target(card_text: str, call: str) -> str:
    (target,) = re.findall(rf'{re.escape(call)}\("([^"]+)"\)', card_text)
    return target


def test_card_usage_line_loads_the_folder_it_is_written_in(tmp_path, monkeypatch):
    model = RetrievalModel(TINY, embedding_size=8, image_size=32)
    # the recipes passed a name that is not a repo id: the snippet used to say from_pretrained("happier-x")
    out = model.save_pretrained(tmp_path / "runs" / "happier_synthetic", repo_id="happier-happier_synthetic")
    target = _usage_target((out / "README.md").read_text(), "RetrievalModel.from_pretrained")
    assert target == "./happier_synthetic"
    monkeypatch.chdir(out.parent)  # the snippet's path is relative to the folder's parent
    loaded = RetrievalModel.from_pretrained(target)
    assert loaded.get_config() == model.get_config()
    # with a Hub repo id the snippet names the repo
    out = model.save_pretrained(tmp_path / "pushed", repo_id="org/tiny")
    assert _usage_target((out / "README.md").read_text(), "RetrievalModel.from_pretrained") == "org/tiny"
    # the same for detectors
    det = ood.KNN(k=2).fit(features=torch.rand(6, 3))
    out = det.save_pretrained(tmp_path / "runs" / "knn")
    target = _usage_target((out / "README.md").read_text(), "ood.Detector.from_pretrained")
    assert target == "./knn" and type(ood.Detector.from_pretrained(target)) is ood.KNN
    out = det.save_pretrained(tmp_path / "d2", repo_id="org/knn")
    assert _usage_target((out / "README.md").read_text(), "ood.Detector.from_pretrained") == "org/knn"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_saved_files_follow_the_umask_and_leave_no_temporaries(tmp_path, umask):
    from PIL import Image

    plot = tmp_path / "curve.png"
    Image.new("RGB", (4, 4)).save(plot)
    previous = os.umask(umask)
    try:
        model_dir = RetrievalModel(TINY, embedding_size=8, image_size=32).save_pretrained(
            tmp_path / "m", metrics={"map": 0.5}, plots=[plot]
        )
        det_dir = ood.KNN(k=2).fit(features=torch.rand(6, 3)).save_pretrained(tmp_path / "d")
        ood.MSP().save_pretrained(tmp_path / "s")
    finally:
        os.umask(previous)
    files = [p for d in (model_dir, det_dir, tmp_path / "s") for p in d.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"config.json", "model.safetensors", "README.md", "metrics.json", "curve.png"}
    assert not [p for p in tmp_path.rglob(".*")], "a temporary file or folder was left behind"
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, (f, oct(f.stat().st_mode & 0o777))


def test_constructor_errors_of_a_loaded_config_name_the_folder(folder, tmp_path):
    _edit_config(folder, backbone="not_a_timm_model")
    with pytest.raises(ValueError, match="config.json of .*: model_args rejected by RetrievalModel: backbone=") as info:
        RetrievalModel.from_pretrained(folder)
    assert str(folder) in str(info.value)
    det = tmp_path / "det"
    ood.KNN(k=2).fit(features=torch.rand(6, 3)).save_pretrained(det)
    config = json.loads((det / "config.json").read_text())
    config["model_args"]["k"] = -1
    (det / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model_args rejected by KNN: k must be a positive integer") as info:
        ood.Detector.from_pretrained(det)
    assert str(det) in str(info.value)


@pytest.mark.parametrize(
    ("training", "match"),
    [
        ([1], r"'training' must be a JSON object \(the training metadata\); got list"),
        ({"card_hub": {"paper_results": [1]}}, r"'training.card_hub.paper_results' must be null or a JSON object"),
        ({"data_summary": "x"}, r"'training.data_summary' must be null or a JSON object; got 'x'"),
        ({"label_names": 5}, r"'training.label_names' must be null or a list of strings; got 5"),
        ({"data_summary": {"train": {"classes": None}}}, r"'training.data_summary.train.classes' must be an int"),
        ({"schedule": {"steps_per_epoch": "x"}}, r"'training.schedule.steps_per_epoch' must be null or an int"),
    ],
)
def test_training_metadata_a_card_cannot_read_is_refused_on_load(saved, tmp_path, training, match):
    """The ``training`` metadata of ``config.json`` becomes the card of every re-save: a list there made loading fail
    with ``cannot convert dictionary update sequence element`` (no file named) and kinds the card did not expect made
    ``save_pretrained`` fail half-way (``AttributeError: 'list' object has no attribute 'items'``)."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(saved, folder)
    config = json.loads((folder / "config.json").read_text())
    config["training"] = training
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match) as info:
        RetrievalModel.from_pretrained(folder)
    assert str(folder / "config.json") in str(info.value)
