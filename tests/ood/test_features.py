"""Tests for pml_suprank.ood.features: pooling (golden, ddof = 1) and extraction from timm models."""

from __future__ import annotations

import pytest
import torch

from pml_suprank import ood


def test_pooling_matches_golden(heat_golden):
    maps = torch.tensor(heat_golden["inputs"]["feature_maps_test_ood"], dtype=torch.float64)
    z, sigma = ood.pool_feature_map(maps)
    d = heat_golden["derived_features"]
    torch.testing.assert_close(z, torch.tensor(d["test_ood_avg"], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(sigma, torch.tensor(d["test_ood_std"], dtype=torch.float64), atol=1e-6, rtol=0)


def test_pooling_hand_computed():
    fmap = torch.tensor([1.0, 2.0, 3.0, 6.0]).reshape(1, 1, 2, 2)
    z, sigma = ood.pool_feature_map(fmap)
    assert float(z) == 3.0
    assert float(sigma) == pytest.approx(((4 + 1 + 0 + 9) / 3) ** 0.5)  # unbiased (ddof = 1)
    tokens = torch.tensor([[[1.0], [3.0]]])
    z, sigma = ood.pool_feature_map(tokens)
    assert float(z) == 2.0 and float(sigma) == pytest.approx(2**0.5)


def test_pooling_bad_input():
    with pytest.raises(ValueError, match="feature_map"):
        ood.pool_feature_map(torch.rand(3, 4))
    with pytest.raises(ValueError, match="2 spatial positions"):
        ood.pool_feature_map(torch.rand(3, 4, 1, 1))


@pytest.mark.slow  # importing timm and building the models takes a few seconds
@pytest.mark.parametrize("name", ["test_resnet", "test_vit", "test_convnext"])
def test_extract_features_from_timm(name):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=5)
    size = model.pretrained_cfg.get("input_size", (3, 160, 160))[1:]
    images = torch.rand(6, 3, *size)
    labels = torch.tensor([[0, 1], [1, 1], [2, 0], [3, 0], [4, 1], [0, 1]])
    batches = [{"image": images[:4], "labels": labels[:4]}, {"image": images[4:], "labels": labels[4:]}]
    model.train()
    out = ood.extract_features(model, batches)
    assert model.training  # restored
    num_features = model.num_features
    assert out.features.shape == (6, num_features) and out.std_features.shape == (6, num_features)
    assert out.logits.shape == (6, 5) and out.labels.tolist() == [0, 1, 2, 3, 4, 0]
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(out.logits, model(images), atol=1e-4, rtol=1e-4)
        fmap = model.forward_features(images)
    if name == "test_resnet":  # ResNet: z is exactly the spatial mean (HEAT's avg pooling)
        torch.testing.assert_close(out.features, fmap.mean((2, 3)), atol=1e-5, rtol=1e-5)
    # z is the classifier's input, so head-based detectors (EL, ViM, DICE, ReAct) see the model's logits
    torch.testing.assert_close(model.get_classifier()(out.features), out.logits, atol=1e-4, rtol=1e-4)
    assert bool((out.std_features >= 0).all())
    kwargs = out.as_kwargs()
    assert set(kwargs) == {"features", "std_features", "logits", "labels"}
    # tuple batches work too
    again = ood.extract_features(model, [(images, labels[:, 0])])
    torch.testing.assert_close(again.features, out.features, atol=1e-5, rtol=1e-5)


def test_extract_features_rejects_non_timm():
    with pytest.raises(TypeError, match="timm model"):
        ood.extract_features(torch.nn.Linear(3, 2), [torch.rand(2, 3)])


def test_feature_files_and_state_dicts_that_are_not_are_refused_by_name(tmp_path):
    from safetensors.torch import save_file

    from pml_suprank.ood.features import feature_map_positions
    from pml_suprank.ood.model_api import read_state_dict

    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="garbage.safetensors is not a readable safetensors feature file"):
        ood.load_features(garbage)
    foreign = tmp_path / "weights.safetensors"
    save_file({"layer.weight": torch.zeros(2, 2)}, str(foreign))
    with pytest.raises(ValueError, match="weights.safetensors is not a feature file"):
        ood.load_features(foreign)
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="list.pt holds a list, not a state dict"):
        read_state_dict(tmp_path / "list.pt")
    torch.save({"model": {"w": torch.zeros(1)}, "epoch": 3}, tmp_path / "nested.pt")
    with pytest.raises(ValueError, match=r"nests dicts under \['model'\]"):
        read_state_dict(tmp_path / "nested.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.pt cannot be read as a state dict"):
        read_state_dict(tmp_path / "junk.pt")
    assert read_state_dict(foreign).keys() == {"layer.weight"}
    timm = pytest.importorskip("timm")
    model = timm.create_model("test_resnet", num_classes=3)
    assert feature_map_positions(model, 32) == 1 and feature_map_positions(model, 64) == 4
