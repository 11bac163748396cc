"""Tests for pml_suprank/models.py: RetrievalModel, pooling layers, backbone validation."""

from __future__ import annotations

import pytest
import torch

from pml_suprank.models import GeneralizedMeanPooling, Pooling, RetrievalModel, check_backbone_name

TINY = "test_resnet"  # timm's tiny test CNN (~0.4M parameters), built without weights


@pytest.fixture(scope="module")
def tiny_model() -> RetrievalModel:
    torch.manual_seed(0)
    return RetrievalModel(TINY, embedding_size=16, image_size=32, num_classes=5).eval()


def test_forward_shapes_and_unit_norm(tiny_model):
    x = torch.randn(3, 3, 32, 32)
    emb = tiny_model(x)
    assert emb.shape == (3, 16)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(3))
    logits = tiny_model.forward_logits(x)
    assert logits.shape == (3, 5)
    emb2, logits2 = tiny_model.forward_with_logits(x)
    torch.testing.assert_close(emb2, emb)
    torch.testing.assert_close(logits2, logits)


def test_head_is_layernorm_projection_l2(tiny_model):
    """forward == normalize(Linear(LayerNorm_without_affine(pool(features))))."""
    x = torch.randn(2, 3, 32, 32)
    fmap = tiny_model.forward_features(x)
    assert fmap.dim() == 4 and fmap.shape[1] == tiny_model.num_features
    pooled = fmap.mean(dim=(2, 3))
    torch.testing.assert_close(tiny_model.forward_pooled(x), pooled)
    normed = (pooled - pooled.mean(1, keepdim=True)) / torch.sqrt(pooled.var(1, unbiased=False, keepdim=True) + 1e-5)
    proj = normed @ tiny_model.projection.weight.T + tiny_model.projection.bias
    torch.testing.assert_close(tiny_model(x), proj / proj.norm(dim=1, keepdim=True), rtol=1e-4, atol=1e-5)
    assert not any(p.requires_grad for p in tiny_model.norm.parameters())  # no affine parameters


def test_gem_hand_computed_and_limits():
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # (1, 1, 2, 2)
    gem = GeneralizedMeanPooling(p=3.0)
    expected = ((1 + 8 + 27 + 64) / 4) ** (1 / 3)
    torch.testing.assert_close(gem(x), torch.tensor([[expected]]))
    torch.testing.assert_close(GeneralizedMeanPooling(p=1.0)(x), x.mean(dim=(2, 3)))
    assert abs(float(GeneralizedMeanPooling(p=60.0)(x).detach()) - 4.0) < 0.1  # p → ∞ tends to max pooling
    assert isinstance(gem.p, torch.nn.Parameter)
    assert "p" in dict(GeneralizedMeanPooling(learnable=False).named_buffers())


def test_gem_gradcheck_float64():
    gem = GeneralizedMeanPooling(p=2.5).double()
    x = (torch.rand(2, 3, 4, 4, dtype=torch.float64) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda inp: gem(inp), (x,))
    p = gem.p

    def fn(pp):
        return (x.detach().clamp(min=gem.eps).pow(pp).mean(dim=(-2, -1)).pow(1 / pp)).sum()

    assert torch.autograd.gradcheck(fn, (p.detach().clone().requires_grad_(),))


@pytest.mark.parametrize("pooling", ["avg", "gem", "max"])
def test_pooling_on_maps_nhwc_and_tokens(pooling):
    x = torch.rand(2, 5, 3, 4)
    nchw = Pooling(pooling)(x)
    nhwc = Pooling(pooling, output_fmt="NHWC")(x.permute(0, 2, 3, 1))
    torch.testing.assert_close(nchw, nhwc)
    tokens = x.flatten(2).transpose(1, 2)  # (B, T, C)
    with_cls = torch.cat([torch.full((2, 1, 5), 100.0), tokens], dim=1)
    torch.testing.assert_close(Pooling(pooling, num_prefix_tokens=1)(with_cls), nchw)
    ref = {"avg": x.mean(dim=(2, 3)), "max": x.amax(dim=(2, 3))}.get(pooling)
    if ref is not None:
        torch.testing.assert_close(nchw, ref)


@pytest.mark.parametrize("pooling", ["avg", "gem", "max"])
def test_every_pooling_trains(pooling):
    torch.manual_seed(0)
    model = RetrievalModel(TINY, pooling=pooling, embedding_size=8, image_size=32)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    groups = model.parameter_groups()
    assert groups["backbone"] and groups["head"]
    assert all(p.grad is not None for p in groups["head"])
    if pooling == "gem":
        assert any(p is model.pool.gem.p for p in groups["head"])


def test_vit_backbone_tokens():
    model = RetrievalModel("test_vit", pooling="gem", embedding_size=8, image_size=32, backbone_kwargs={"img_size": 32})
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 8)
    assert model.pool.num_prefix_tokens >= 1


def test_no_projection_and_no_layer_norm():
    model = RetrievalModel(TINY, embedding_size=None, layer_norm=False)
    x = torch.randn(2, 3, 32, 32)
    pooled = model.forward_pooled(x)
    torch.testing.assert_close(model(x), torch.nn.functional.normalize(pooled, dim=1))
    assert model.embedding_size == model.num_features


def test_data_config_overrides():
    model = RetrievalModel(TINY, embedding_size=8, image_size=48, mean=(0.1, 0.2, 0.3), std=(1.0, 1.0, 2.0))
    cfg = model.data_config
    assert cfg["input_size"] == (3, 48, 48)
    assert cfg["mean"] == (0.1, 0.2, 0.3) and cfg["std"] == (1.0, 1.0, 2.0)
    assert RetrievalModel(TINY, embedding_size=8).data_config["input_size"] == (3, 160, 160)  # timm default


def test_get_config_is_jsonable_and_never_pretrained():
    import json

    model = RetrievalModel(TINY, embedding_size=8, backbone_kwargs={"drop_rate": 0.1})
    model.config["pretrained"] = True  # as if created with ImageNet weights
    cfg = model.get_config()
    assert cfg["pretrained"] is False
    assert json.loads(json.dumps(cfg)) == cfg
    rebuilt = RetrievalModel(**cfg)
    assert rebuilt.state_dict().keys() == model.state_dict().keys()


def test_freeze_batch_norm():
    model = RetrievalModel(TINY, embedding_size=8).train().freeze_batch_norm()
    bns = [m for m in model.backbone.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert bns and all(not m.training for m in bns)
    assert all(not p.requires_grad for m in bns for p in m.parameters())


def test_dtype_agnostic(dtype):
    model = RetrievalModel(TINY, embedding_size=8).to(dtype).eval()
    out = model(torch.randn(2, 3, 32, 32, dtype=dtype))
    assert out.dtype == dtype


def test_unknown_backbone_raises_clear_error():
    with pytest.raises(ValueError, match="not a timm model name"):
        RetrievalModel("resnet5000")
    with pytest.raises(ValueError, match="not a timm model name"):
        check_backbone_name("definitely_not_a_model.tag")
    with pytest.raises(TypeError, match="backbone"):
        check_backbone_name(None)
    assert check_backbone_name("resnet50.a1_in1k") == "resnet50.a1_in1k"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"pooling": "mean"}, "pooling must be one of"),
        ({"embedding_size": 0}, "embedding_size"),
        ({"num_classes": -1}, "num_classes"),
        ({"backbone_kwargs": {"num_classes": 3}}, "must not contain 'num_classes'"),
        ({"image_size": 0}, "image_size"),
        ({"mean": (0.5, 0.5)}, "mean"),
        ({"std": (1.0, 0.0, 1.0)}, "std"),
        ({"pretrained": "yes"}, "pretrained"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        RetrievalModel(TINY, **kwargs)


def test_bad_input_and_missing_head(tiny_model):
    with pytest.raises(ValueError, match=r"\(B, C=3, H, W\); got \(3, 32, 32\)"):
        tiny_model(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match=r"\(B, C=3, H, W\); got \(2, 1, 32, 32\)"):  # a grey batch, 3-channel model
        tiny_model(torch.randn(2, 1, 32, 32))
    with pytest.raises(TypeError, match="must be a torch.float32 image batch .* got dtype torch.uint8"):
        tiny_model(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))  # raw pixels: not normalised floats
    with pytest.raises(TypeError, match="got dtype torch.float64"):
        tiny_model(torch.zeros(2, 3, 32, 32, dtype=torch.float64))
    with pytest.raises(TypeError, match="must be a torch.Tensor image batch"):
        tiny_model([[0.0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts a float32 input
        assert tiny_model(torch.zeros(2, 3, 32, 32)).shape[0] == 2
    grey = RetrievalModel(TINY, embedding_size=8, backbone_kwargs={"in_chans": 1}).eval()
    assert grey(torch.randn(2, 1, 32, 32)).shape == (2, 8)
    model = RetrievalModel(TINY, embedding_size=8).eval()
    with pytest.raises(ValueError, match="num_classes > 0"):
        model.forward_logits(torch.randn(2, 3, 32, 32))


def test_device_agnostic(device):
    model = RetrievalModel(TINY, pooling="gem", embedding_size=8, num_classes=2).to(device).eval()
    emb, logits = model.forward_with_logits(torch.randn(2, 3, 32, 32, device=device))
    assert emb.device.type == device.type and logits.device.type == device.type
