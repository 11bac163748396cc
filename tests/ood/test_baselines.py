"""Tests for the OOD baselines: golden scores (HEAT / OpenOOD / pytorch-ood), hand-computed cases, bad input, I/O."""

from __future__ import annotations

import math

import pytest
import torch

from pml_suprank import ood


def _golden(g, dtype=torch.float32):
    inp = g["inputs"]
    maps_tr = torch.tensor(inp["feature_maps_train"], dtype=dtype)
    maps_te = torch.cat([torch.tensor(inp["feature_maps_test_id"]), torch.tensor(inp["feature_maps_test_ood"])])
    maps_te = maps_te.to(dtype)
    w, b = torch.tensor(inp["fc_weight"], dtype=dtype), torch.tensor(inp["fc_bias"], dtype=dtype)
    z_tr, z_te = maps_tr.mean((2, 3)), maps_te.mean((2, 3))
    train = {"features": z_tr, "logits": z_tr @ w.T + b, "labels": torch.tensor(inp["labels_train"])}
    test = {"features": z_te, "logits": z_te @ w.T + b}
    return train, test, w, b, maps_te


def _ref(values, dtype, sign=1.0):
    return sign * torch.tensor(values, dtype=dtype)


def test_logit_baselines_match_golden(heat_golden, dtype):
    _, test, *_ = _golden(heat_golden, dtype)
    h, oo, po = heat_golden["heat_reference"], heat_golden["openood_reference"], heat_golden["pytorch_ood_reference"]
    tol = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(ood.MSP().score(**test), _ref(h["MSP_score"], dtype), **tol)
    torch.testing.assert_close(ood.MSP().score(**test), _ref(oo["MSP_conf"], dtype, -1), **tol)
    torch.testing.assert_close(ood.MSP().score(**test), _ref(po["MaxSoftmax_score"], dtype), **tol)
    torch.testing.assert_close(ood.MaxLogit().score(**test), _ref(h["MaxLogit_score"], dtype), **tol)
    torch.testing.assert_close(ood.Energy().score(**test), _ref(h["EL_energy"], dtype), **tol)
    torch.testing.assert_close(ood.Energy().score(**test), _ref(oo["EBO_T1_conf"], dtype, -1), **tol)
    torch.testing.assert_close(ood.Energy().score(**test), _ref(po["EnergyBased_T1_score"], dtype), **tol)


def test_mahalanobis_and_ssd_match_golden(heat_golden, dtype):
    train, test, *_ = _golden(heat_golden, dtype)
    h, oo, po = heat_golden["heat_reference"], heat_golden["openood_reference"], heat_golden["pytorch_ood_reference"]
    maha = ood.Mahalanobis().fit(**train).score(**test)
    torch.testing.assert_close(maha, _ref(h["Mahalanobis_score_unnormalized"], dtype), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(maha, _ref(oo["MDS_conf"], dtype, -1), rtol=1e-4, atol=1e-5)
    # pytorch-ood does not divide its covariance by N and halves: score_pood = 0.5 * maha / N
    torch.testing.assert_close(0.5 * maha / 60, _ref(po["Mahalanobis_score"], dtype), rtol=1e-4, atol=1e-5)
    ssd = ood.Mahalanobis(normalize=True).fit(**train).score(**test)
    torch.testing.assert_close(ssd, _ref(h["SSDplus_score"], dtype), rtol=1e-4, atol=1e-5)


def test_knn_matches_golden(heat_golden, dtype):
    train, test, *_ = _golden(heat_golden, dtype)
    h, oo, po = heat_golden["heat_reference"], heat_golden["openood_reference"], heat_golden["pytorch_ood_reference"]
    knn = ood.KNN(k=5).fit(**train).score(**test)
    torch.testing.assert_close(knn, _ref(h["KNN_k5_score"], dtype), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(knn, _ref(oo["KNN_K5_conf"], dtype, -1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(knn.sqrt(), _ref(po["KNN_k5_score"], dtype), rtol=1e-4, atol=1e-5)


def test_vim_matches_official_golden(heat_golden, dtype):
    train, test, w, b, _ = _golden(heat_golden, dtype)
    oo, po = heat_golden["openood_reference"], heat_golden["pytorch_ood_reference"]
    vim = ood.ViM(dim=8, weight=w, bias=b).fit(**train)
    assert float(vim.alpha) == pytest.approx(oo["ViM_dim8_alpha"], rel=1e-5)
    scores = vim.score(**test)
    # OpenOOD and pytorch-ood (float32 references) disagree by 5e-5 themselves, hence atol 1e-4
    torch.testing.assert_close(scores, _ref(oo["ViM_dim8_conf"], dtype, -1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(scores, _ref(po["ViM_d8_score"], dtype), rtol=1e-4, atol=1e-4)
    # HEAT's reference ViM deviates from the official method (centred covariance, logits fc(z - u)): not reproduced
    assert not torch.allclose(scores, _ref(heat_golden["heat_reference"]["ViM_D8_score"], dtype), atol=1e-2)


def test_dice_and_react_match_golden(heat_golden, dtype):
    train, test, w, b, _ = _golden(heat_golden, dtype)
    h, oo, po = heat_golden["heat_reference"], heat_golden["openood_reference"], heat_golden["pytorch_ood_reference"]
    dice = ood.DICE(p=0.7, weight=w, bias=b).fit(**train).score(**test)
    torch.testing.assert_close(dice, _ref(h["DICE_p70_energy"], dtype), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dice, _ref(oo["DICE_p70_conf"], dtype, -1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dice, _ref(po["DICE_p0.7_score"], dtype), rtol=1e-4, atol=1e-5)
    react = ood.ReAct(percentile=90, weight=w, bias=b).fit(**train)
    assert float(react.threshold) == pytest.approx(h["ReAct_p90_threshold"], rel=1e-6)
    assert float(react.threshold) == pytest.approx(oo["ReAct_p90_threshold"], rel=1e-6)
    torch.testing.assert_close(react.score(**test), _ref(h["ReAct_p90_energy"], dtype), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(react.score(**test), _ref(po["ReAct_p0.9_score"], dtype), rtol=1e-4, atol=1e-5)


def test_odin_matches_golden(heat_golden, dtype):
    _, _, w, b, maps = _golden(heat_golden, dtype)

    def model(x):
        return x.mean((2, 3)) @ w.T + b

    scores = ood.ODIN(model, temperature=1000.0, eps=0.0014).score(inputs=maps)
    h, po = heat_golden["heat_reference"], heat_golden["pytorch_ood_reference"]
    torch.testing.assert_close(scores, _ref(h["ODIN_T1000_eps0.0014_score"], dtype), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(scores, _ref(po["ODIN_T1000_eps0.0014_score"], dtype), rtol=1e-4, atol=1e-5)


def test_hand_computed_logit_scores():
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(ood.MSP().score(logits=logits), -torch.tensor([1 / (1 + math.exp(-2)), 0.5]))
    torch.testing.assert_close(ood.MaxLogit().score(logits=logits), torch.tensor([-2.0, 0.0]))
    torch.testing.assert_close(ood.Energy().score(logits=logits), -torch.log(torch.tensor([math.exp(2) + 1, 2.0])))


def test_hand_computed_feature_scores():
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # KNN k=1 without normalisation: squared distance to the nearest training point
    knn = ood.KNN(k=1, normalize=False).fit(features=train)
    torch.testing.assert_close(knn.score(features=torch.tensor([[2.0, 0.0], [1.0, 1.0]])), torch.tensor([1.0, 0.0]))
    # ReAct: threshold = 50th percentile of {1, 0, 0, 1, 1, 1} = 1.0 -> clip at 1
    w, b = torch.eye(2), torch.zeros(2)
    react = ood.ReAct(percentile=50, weight=w, bias=b).fit(features=train)
    assert float(react.threshold) == 1.0
    torch.testing.assert_close(react.score(features=torch.tensor([[5.0, 0.0]])), -torch.log(torch.tensor([math.e + 1])))
    # DICE p=0.5: mean feature (2/3, 2/3); equal contributions are all at the threshold -> all dropped (strict >)
    dice = ood.DICE(p=0.5, weight=torch.ones(2, 2), bias=None).fit(features=train)
    assert dice.mask.tolist() == [[False, False], [False, False]]
    # contributions eye*2/3 -> threshold 1/3, keep the diagonal
    dice = ood.DICE(p=0.5, weight=w, bias=None).fit(features=train)
    assert dice.mask.tolist() == [[True, False], [False, True]]


def test_mahalanobis_score_ranks_far_points_higher():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(200, 5, generator=g)
    labels = torch.arange(200) % 2
    z = z + labels[:, None] * 4.0
    det = ood.Mahalanobis().fit(features=z, labels=labels)
    near, far = torch.zeros(1, 5), torch.full((1, 5), 20.0)
    assert float(det.score(features=far)) > float(det.score(features=near))


@pytest.mark.parametrize(
    "factory",
    [
        lambda w, b: ood.Mahalanobis(),
        lambda w, b: ood.Mahalanobis(normalize=True),
        lambda w, b: ood.KNN(k=3),
        lambda w, b: ood.ViM(dim=2, weight=w, bias=b),
        lambda w, b: ood.DICE(p=0.5, weight=w, bias=b),
        lambda w, b: ood.ReAct(percentile=90, weight=w, bias=b),
    ],
    ids=["maha", "ssd", "knn", "vim", "dice", "react"],
)
def test_fitted_detectors_validate_input(factory):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 4, generator=g), torch.randn(3, generator=g)
    z, labels = torch.rand(30, 4, generator=g), torch.arange(30) % 3
    det = factory(w, b)
    with pytest.raises(ood.NotFittedError, match="fit"):
        det.score(features=z)
    det.fit(features=z, labels=labels)
    with pytest.raises(ValueError, match="4 columns"):
        det.score(features=torch.rand(5, 5))
    bad = z.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        det.score(features=bad)
    with pytest.raises(ValueError, match="features"):
        det.score(features=None)


def test_class_conditional_fit_needs_two_classes():
    z = torch.rand(10, 3)
    with pytest.raises(ValueError, match="at least 2 distinct classes"):
        ood.Mahalanobis().fit(features=z, labels=torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="labels are required"):
        ood.Mahalanobis().fit(features=z)


def test_constructor_validation():
    with pytest.raises(ValueError, match="k must"):
        ood.KNN(k=0)
    with pytest.raises(ValueError, match="p must"):
        ood.DICE(p=1.0, weight=torch.rand(2, 3))
    with pytest.raises(ValueError, match="percentile"):
        ood.ReAct(percentile=150, weight=torch.rand(2, 3))
    with pytest.raises(ValueError, match="dim must"):
        ood.ViM(dim=3, weight=torch.rand(2, 3))
    with pytest.raises(ValueError, match="bias must"):
        ood.DICE(weight=torch.rand(2, 3), bias=torch.rand(3))
    with pytest.raises(ValueError, match="classifier weight"):
        ood.ViM(dim=1).fit(features=torch.rand(5, 3))
    with pytest.raises(ValueError, match="logits are required"):
        ood.MSP().score(features=torch.rand(2, 3))
    with pytest.raises(ValueError, match="KNN needs at least"):
        ood.KNN(k=50).fit(features=torch.rand(10, 3))


def test_head_module_is_accepted():
    head = torch.nn.Linear(4, 3)
    det = ood.ReAct(head=head).fit(features=torch.rand(20, 4))
    torch.testing.assert_close(det.weight, head.weight.detach())


@pytest.mark.parametrize("name", ["Mahalanobis", "KNN", "ViM", "DICE", "ReAct", "Energy"])
def test_save_load_roundtrip(tmp_path, name):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 6, generator=g), torch.randn(3, generator=g)
    z, labels = torch.rand(40, 6, generator=g), torch.arange(40) % 3
    kwargs = {
        "ViM": {"dim": 2, "weight": w, "bias": b},
        "DICE": {"weight": w, "bias": b},
        "ReAct": {"weight": w, "bias": b},
        "KNN": {"k": 3},
    }
    det = getattr(ood, name)(**kwargs.get(name, {})).fit(features=z, labels=labels)
    det.save_pretrained(tmp_path)
    loaded = ood.Detector.from_pretrained(tmp_path)
    assert type(loaded) is type(det)
    test = {"features": torch.rand(7, 6, generator=g), "logits": torch.randn(7, 3, generator=g)}
    torch.testing.assert_close(loaded.score(**test), det.score(**test))


def test_from_pretrained_checks_class(tmp_path):
    ood.KNN(k=2).fit(features=torch.rand(5, 3)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="KNN"):
        ood.Mahalanobis.from_pretrained(tmp_path)
    with pytest.raises(ood.NotFittedError):
        ood.KNN().save_pretrained(tmp_path / "x")


@pytest.mark.hub
def test_push_to_hub_and_load_by_repo_id(tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from _hub_http import fake_hub_http

    remote = tmp_path / "remote" / "user" / "knn-detector"

    def fake_snapshot_download(repo_id, revision=None, **kwargs):
        assert repo_id == "user/knn-detector"
        return str(remote)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    det = ood.KNN(k=2).fit(features=torch.rand(6, 3, generator=torch.Generator().manual_seed(0)))
    with fake_hub_http(remote=tmp_path / "remote") as seen:  # huggingface_hub's upload, the HTTP answered locally
        det.push_to_hub("user/knn-detector")
    assert {"/api/repos/create", "/api/models/user/knn-detector/commit/main"} <= set(seen)
    assert sorted(p.name for p in remote.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    loaded = ood.Detector.from_pretrained("user/knn-detector")
    x = torch.rand(4, 3)
    torch.testing.assert_close(loaded.score(features=x), det.score(features=x))


def test_detectors_follow_input_device(device):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 5, generator=g), torch.randn(3, generator=g)
    z, labels = torch.rand(30, 5, generator=g), torch.arange(30) % 3
    for det in (ood.Mahalanobis(), ood.KNN(k=3), ood.ViM(dim=2, weight=w, bias=b), ood.DICE(weight=w, bias=b)):
        det.fit(features=z.to(device), labels=labels.to(device))
        scores = det.score(features=z.to(device))
        assert scores.device.type == device.type and scores.shape == (30,)
