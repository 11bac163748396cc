"""``detector.fit_model(model, loader)`` / ``detector.predict(model, x)`` on a timm classifier and a RetrievalModel:
the same scores as extracting features by hand and calling ``fit`` / ``score``."""

from __future__ import annotations

import pytest
import torch

from pml_suprank import ood
from pml_suprank.ood.features import extract_model_features

timm = pytest.importorskip("timm")


def _loader(n=24, batch=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 3, 64, 64, generator=g)  # 64 px: a 2x2 last feature map (std pooling needs >= 2)
    labels = torch.arange(n) % 3
    return [{"image": images[i : i + batch], "labels": labels[i : i + batch]} for i in range(0, n, batch)]


@pytest.fixture(scope="module")
def timm_model():
    torch.manual_seed(0)
    return timm.create_model("test_resnet", num_classes=3).eval()


@pytest.fixture(scope="module")
def retrieval_model():
    from pml_suprank.models import RetrievalModel

    torch.manual_seed(0)
    return RetrievalModel("test_resnet", embedding_size=8, image_size=64, num_classes=3).eval()


def _manual(det, model, train, test, **kw):
    feats = extract_model_features(model, train, **kw)
    det.fit(**feats.as_kwargs())
    t = extract_model_features(model, test, **kw)
    return det.score(**{k: v for k, v in t.as_kwargs().items() if k != "labels"})


@pytest.mark.parametrize("name", ["KNN", "RMDS", "ASH", "GEN", "NNGuide", "ViM"])
def test_timm_fit_model_predict_equal_the_feature_api(timm_model, name):
    train, x = _loader(), _loader(8, seed=1)[0]["image"]
    make = {
        "KNN": lambda: ood.KNN(k=3),
        "RMDS": lambda: ood.RMDS(),
        "ASH": lambda: ood.ASH(percentile=50),  # no head given: taken from the model
        "GEN": lambda: ood.GEN(),
        "NNGuide": lambda: ood.NNGuide(k=3, alpha=1.0),
        "ViM": lambda: ood.ViM(dim=2),
    }[name]
    det = make().fit_model(timm_model, train)
    scores = det.predict(timm_model, x)
    assert scores.shape == (8,)
    head = {"head": timm_model.get_classifier()} if name in ("ASH", "ViM") else {}
    reference = make() if not head else type(make())(**{**make().config(), **head})
    torch.testing.assert_close(scores, _manual(reference, timm_model, train, [x]))
    if name == "ASH":
        torch.testing.assert_close(det.weight, timm_model.get_classifier().weight.detach())


def test_retrieval_model_features_and_detectors(retrieval_model):
    train, x = _loader(), _loader(8, seed=1)[0]["image"]
    feats = extract_model_features(retrieval_model, [x])
    with torch.no_grad():
        torch.testing.assert_close(feats.features, retrieval_model.forward_pooled(x))
        torch.testing.assert_close(feats.logits, retrieval_model.forward_logits(x))
        emb = extract_model_features(retrieval_model, x, features="embedding").features
        torch.testing.assert_close(emb, retrieval_model(x))
    assert feats.std_features.shape == feats.features.shape
    for det in (ood.SCALE(), ood.Mahalanobis(), ood.Energy()):
        scores = det.fit_model(retrieval_model, train).predict(retrieval_model, x)
        assert scores.shape == (8,) and bool(torch.isfinite(scores).all())
    knn = ood.KNN(k=3).fit_model(retrieval_model, train, features="embedding")
    torch.testing.assert_close(knn.bank, torch.nn.functional.normalize(extract_model_features(
        retrieval_model, train, features="embedding").features, dim=-1))  # fmt: skip
    assert knn.predict(retrieval_model, x, features="embedding").shape == (8,)


def test_a_detector_remembers_the_feature_kind_it_was_fitted_on(retrieval_model):
    train, x = _loader(), _loader(8, seed=1)[0]["image"]
    knn = ood.KNN(k=3).fit_model(retrieval_model, train, features="embedding")
    assert knn.feature_kind == "embedding"
    torch.testing.assert_close(knn.predict(retrieval_model, x), knn.predict(retrieval_model, x, features="embedding"))
    emb = extract_model_features(retrieval_model, x, features="embedding").features
    torch.testing.assert_close(knn.predict(retrieval_model, x), knn.score(features=emb))
    with pytest.raises(ValueError, match="fitted on 'embedding' features"):
        knn.predict(retrieval_model, x, features="pooled")
    pooled = ood.KNN(k=3).fit_model(retrieval_model, train)
    assert pooled.feature_kind == "pooled" and pooled.predict(retrieval_model, x).shape == (8,)


def test_a_saved_detector_keeps_its_feature_kind(retrieval_model, tmp_path):
    import json

    train, x = _loader(), _loader(8, seed=1)[0]["image"]
    knn = ood.KNN(k=3).fit_model(retrieval_model, train, features="embedding")
    loaded = ood.Detector.from_pretrained(knn.save_pretrained(tmp_path / "knn"))
    assert loaded.feature_kind == "embedding"
    torch.testing.assert_close(loaded.predict(retrieval_model, x), knn.predict(retrieval_model, x))
    config = json.loads((tmp_path / "knn" / "config.json").read_text())
    (tmp_path / "knn" / "config.json").write_text(json.dumps({**config, "feature_kind": "logits"}))
    with pytest.raises(ValueError, match="'feature_kind' must be 'pooled' or 'embedding'; got 'logits'"):
        ood.Detector.from_pretrained(tmp_path / "knn")


def test_odin_binds_the_model_and_scores_images(timm_model):
    x = _loader(8)[0]["image"]
    det = ood.ODIN(temperature=10.0, eps=0.01).fit_model(timm_model, _loader())
    torch.testing.assert_close(det.predict(timm_model, x), ood.ODIN(timm_model, 10.0, 0.01).score(inputs=x))


def test_errors_name_the_problem(timm_model, retrieval_model):
    from pml_suprank.models import RetrievalModel

    no_head = RetrievalModel("test_resnet", embedding_size=8, image_size=64).eval()
    with pytest.raises(ValueError, match="needs a classifier head and the model has none"):
        ood.ASH().fit_model(no_head, _loader())
    with pytest.raises(ValueError, match="logits are required"):
        ood.GEN().predict(no_head, _loader(8)[0]["image"])
    with pytest.raises(TypeError, match=r"image tensor \(B, C, H, W\)"):
        ood.GEN().predict(timm_model, torch.rand(3, 64, 64))
    with pytest.raises(ValueError, match="needs a RetrievalModel"):
        ood.KNN(k=2).fit_model(timm_model, _loader(), features="embedding")
