"""Loading saved RMDS / ASH / SCALE / NNGuide / GEN folders never trusts the files: each tensor is checked against
what the config implies (missing, NaN, inf, wrong shape, wrong dtype kind, foreign payload), a missing
``model.safetensors`` is named, and the fitted flag is validated (the patterns of ``test_detector_loading.py``)."""

from __future__ import annotations

import json

import pytest
import torch

from pml_suprank import ood

safetensors_torch = pytest.importorskip("safetensors.torch")

D, C, N = 8, 3, 60


def _fitted(name):
    g = torch.Generator().manual_seed(0)
    z = torch.rand(N, D, generator=g)
    w, b = torch.randn(C, D, generator=g), torch.randn(C, generator=g)
    det = {
        "RMDS": lambda: ood.RMDS(),
        "ASH": lambda: ood.ASH(percentile=60, weight=w, bias=b),
        "SCALE": lambda: ood.SCALE(weight=w, bias=b),
        "NNGuide": lambda: ood.NNGuide(k=5, alpha=0.5),
    }[name]()
    test = {"features": z[:7], "logits": z[:7] @ w.T + b}
    return det.fit(features=z, logits=z @ w.T + b, labels=torch.arange(N) % C), test


#: (detector, key, variant) combinations that describe another valid detector: nothing else in the state fixes D
VALID_VARIANTS = {
    ("ASH", "weight", "extra column"),
    ("SCALE", "weight", "extra column"),
    ("NNGuide", "bank", "extra column"),
}


def _save(det, folder):
    det.save_pretrained(folder, model_card=False)
    return folder / "model.safetensors", safetensors_torch.load_file(folder / "model.safetensors")


@pytest.mark.parametrize("name", ["RMDS", "ASH", "SCALE", "NNGuide"])
def test_every_tensor_is_checked_before_use(name, tmp_path):
    det, test = _fitted(name)
    weights, state = _save(det, tmp_path)
    torch.testing.assert_close(ood.Detector.from_pretrained(tmp_path).score(**test), det.score(**test))
    for key, value in state.items():
        variants = {"missing": None, "extra column": torch.cat([value, value[..., :1]], dim=-1)}
        if value.is_floating_point():
            variants["nan"] = value.clone().reshape(-1).index_fill(0, torch.tensor([0]), float("nan")).view_as(value)
            variants["inf"] = value.clone().reshape(-1).index_fill(0, torch.tensor([0]), float("inf")).view_as(value)
            variants["integer"] = value.round().long()
        else:
            variants["float"] = value.double()
        for variant, bad in variants.items():
            if (key == "bias" and variant == "missing") or (name, key, variant) in VALID_VARIANTS:
                continue
            broken = {k: v for k, v in state.items() if k != key}
            if bad is not None:
                broken[key] = bad
            safetensors_torch.save_file(broken, weights)
            with pytest.raises(ValueError) as info:
                ood.Detector.from_pretrained(tmp_path)
            message = str(info.value)
            assert str(weights) in message and repr(key) in message, (name, key, variant, message)
    safetensors_torch.save_file({**state, "payload": torch.zeros(2)}, weights)
    with pytest.raises(ValueError, match="payload"):
        ood.Detector.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("name", "key", "value", "match"),
    [
        ("RMDS", "background_cholesky", lambda t: t.T.contiguous(), "Cholesky factor"),
        ("RMDS", "cholesky", lambda t: t * 0, "Cholesky factor"),
        ("RMDS", "class_weights", lambda t: -t, "must be >= 0"),
        ("ASH", "weight", lambda t: torch.zeros_like(t), "all zeros"),
        ("SCALE", "weight", lambda t: torch.zeros_like(t), "all zeros"),
        ("NNGuide", "bank", lambda t: torch.zeros_like(t), "all zeros"),
        ("NNGuide", "bank", lambda t: t[:2], "N must be >= 5"),
    ],
)
def test_values_no_fitted_detector_can_hold_are_refused(name, key, value, match, tmp_path):
    weights, state = _save(_fitted(name)[0], tmp_path)
    safetensors_torch.save_file({**state, key: value(state[key]).contiguous()}, weights)
    with pytest.raises(ValueError, match=match) as info:
        ood.Detector.from_pretrained(tmp_path)
    assert str(weights) in str(info.value) and repr(key) in str(info.value)


@pytest.mark.parametrize("name", ["RMDS", "ASH", "SCALE", "NNGuide"])
def test_missing_weights_file_is_named(name, tmp_path):
    weights, _ = _save(_fitted(name)[0], tmp_path)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing") as info:
        ood.Detector.from_pretrained(tmp_path)
    assert str(weights) in str(info.value)


def test_fitted_flag_is_validated(tmp_path):
    _save(_fitted("RMDS")[0], tmp_path)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    for bad, match in ((False, "key 'fitted' is false"), ("yes", "key 'fitted' must be true or false")):
        config_path.write_text(json.dumps({**config, "fitted": bad}))
        with pytest.raises(ValueError, match=match):
            ood.Detector.from_pretrained(tmp_path)


def test_gen_is_stateless_and_refuses_any_tensor(tmp_path):
    ood.GEN(gamma=0.3, M=5).save_pretrained(tmp_path)
    loaded = ood.Detector.from_pretrained(tmp_path)
    assert isinstance(loaded, ood.GEN) and (loaded.gamma, loaded.M) == (0.3, 5)
    safetensors_torch.save_file({"weight": torch.ones(2, 2)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="'weight'"):
        ood.Detector.from_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_args"]["gamma"] = 3.0
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="gamma must lie in"):
        ood.Detector.from_pretrained(tmp_path)
