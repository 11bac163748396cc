"""GEN, RMDS, ASH, SCALE and NNGuide: the published formulas on random data, golden values computed from them with
OpenOOD v1.5's conventions (``tests/data/ood_posthoc_golden.json``), hand-computed cases, input checks, save / load."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import load_golden

from pml_suprank import ood
from pml_suprank.ood.logit_scores import generalized_entropy
from pml_suprank.ood.shaping import ash_binarize, ash_prune, ash_scale, kept_count, scale_activations


@pytest.fixture(scope="module")
def golden():
    g = load_golden("ood_posthoc_golden")
    inp = g["inputs"]
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in inp.items() if k != "labels_train"}
    t["labels_train"] = torch.tensor(inp["labels_train"])
    return t, {k: torch.tensor(v, dtype=torch.float64) for k, v in g["openood_conf"].items()}


def _cast(inputs, dtype):
    w, b = inputs["fc_weight"].to(dtype), inputs["fc_bias"].to(dtype)
    z_tr, z_te = inputs["features_train"].to(dtype), inputs["features_test"].to(dtype)
    train = {"features": z_tr, "logits": z_tr @ w.T + b, "labels": inputs["labels_train"]}
    test = {"features": z_te, "logits": z_te @ w.T + b}
    return train, test, {"weight": w, "bias": b}


def test_detectors_match_openood_golden(golden, dtype):
    inputs, conf = golden
    train, test, head = _cast(inputs, dtype)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-9}
    cases = {
        "GEN_gamma0.1_M100": ood.GEN(),
        "GEN_gamma0.5_M2": ood.GEN(gamma=0.5, M=2),
        "RMDS": ood.RMDS(reg=0.0),
        "ASH_p_65": ood.ASH("p", 65, **head),
        "ASH_b_65": ood.ASH("b", 65, **head),
        "ASH_s_90": ood.ASH(**head),
        "SCALE_85": ood.SCALE(**head),
        "NNGuide_k5_alpha1": ood.NNGuide(k=5, alpha=1.0),
    }
    for key, det in cases.items():
        scores = det.fit(**train).score(**test)
        assert scores.dtype == dtype and scores.shape == (12,)
        torch.testing.assert_close(scores, -conf[key].to(dtype), **tol, msg=key)


def test_gen_equals_its_formula_on_random_logits():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 150, generator=g, dtype=torch.float64) * 3
    p = torch.softmax(logits, dim=-1)
    top = p.sort(dim=-1, descending=True).values[:, :100]
    expected = (top**0.1 * (1 - top) ** 0.1).sum(-1)
    torch.testing.assert_close(ood.GEN().score(logits=logits), expected)
    # M capped at the number of classes: all probabilities count
    small = logits[:, :7]
    q = torch.softmax(small, dim=-1)
    torch.testing.assert_close(ood.GEN(gamma=0.3).score(logits=small), (q**0.3 * (1 - q) ** 0.3).sum(-1))


def test_gen_hand_computed():
    # logits log(0.5), log(0.25), log(0.25): p = (1/2, 1/4, 1/4); M = 2 keeps 1/2 and 1/4
    logits = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)]], dtype=torch.float64)
    expected = (0.5 * 0.5) ** 0.5 + (0.25 * 0.75) ** 0.5
    assert float(ood.GEN(gamma=0.5, M=2).score(logits=logits)) == pytest.approx(expected, rel=1e-12)
    # a one-hot softmax is maximally certain: score -> 0
    assert float(ood.GEN().score(logits=torch.tensor([[0.0, -200.0, -200.0]]))) < 1e-7


def test_rmds_equals_its_formula_on_random_features():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(90, 6, generator=g, dtype=torch.float64) + torch.arange(90).remainder(3).unsqueeze(1)
    y = torch.arange(90) % 3
    test = torch.randn(20, 6, generator=g, dtype=torch.float64) * 2
    means = torch.stack([z[y == c].mean(0) for c in range(3)])
    centred = z - means[y]
    prec = torch.linalg.inv(centred.T @ centred / 90)
    mu0 = z.mean(0)
    prec0 = torch.linalg.inv((z - mu0).T @ (z - mu0) / 90)
    md0 = torch.einsum("nd,de,ne->n", test - mu0, prec0, test - mu0)
    mdk = torch.stack([torch.einsum("nd,de,ne->n", test - m, prec, test - m) for m in means], 1)
    expected = (mdk - md0[:, None]).min(1).values
    det = ood.RMDS(reg=0.0).fit(features=z, labels=y)
    torch.testing.assert_close(det.score(features=test), expected, rtol=1e-9, atol=1e-9)
    # RMDS = Mahalanobis - background distance, per class before the min
    maha = ood.Mahalanobis(reg=0.0).fit(features=z, labels=y).gaussian.mahalanobis(test)
    torch.testing.assert_close(det.score(features=test), (maha - det.background_distance(test)[:, None]).min(1).values)


def test_shaping_hand_computed():
    z = torch.tensor([[4.0, 1.0, 3.0, 2.0]])  # s1 = 10
    assert kept_count(4, 50) == 2 and kept_count(10, 65) == 4 and kept_count(10, 85) == 2  # round half to even
    torch.testing.assert_close(ash_prune(z, 50), torch.tensor([[4.0, 0.0, 3.0, 0.0]]))
    torch.testing.assert_close(ash_binarize(z, 50), torch.tensor([[5.0, 0.0, 5.0, 0.0]]))
    torch.testing.assert_close(ash_scale(z, 50), torch.tensor([[4.0, 0.0, 3.0, 0.0]]) * math.exp(10 / 7))
    torch.testing.assert_close(scale_activations(z, 50), z * math.exp(10 / 7))
    torch.testing.assert_close(scale_activations(z, 0), z * math.e)  # nothing pruned: s1 = s2
    assert not bool(torch.isnan(ash_scale(torch.zeros(1, 4), 50)).any())
    with pytest.raises(ValueError, match="prunes all"):
        kept_count(4, 90)


def test_ash_and_scale_energy_hand_computed():
    w = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([0.0, 1.0], dtype=torch.float64)
    z = torch.tensor([[4.0, 1.0, 3.0, 2.0]], dtype=torch.float64)
    lse = lambda a, c: math.log(math.exp(a) + math.exp(c))  # noqa: E731
    s = math.exp(10 / 7)
    assert float(ood.ASH("p", 50, weight=w, bias=b).score(features=z)) == pytest.approx(-lse(4, 4))
    assert float(ood.ASH("b", 50, weight=w, bias=b).score(features=z)) == pytest.approx(-lse(5, 6))
    assert float(ood.ASH("s", 50, weight=w, bias=b).score(features=z)) == pytest.approx(-lse(4 * s, 3 * s + 1))
    assert float(ood.SCALE(50, weight=w, bias=b).score(features=z)) == pytest.approx(-lse(4 * s, 3 * s + 1))


def test_nnguide_hand_computed():
    # bank: unit features e1 (energy conf log 2 = lse(0, 0)) and e2 (conf lse(log 3, 0) = log 4)
    feats = torch.tensor([[2.0, 0.0], [0.0, 5.0]], dtype=torch.float64)
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=torch.float64)
    det = ood.NNGuide(k=1, alpha=1.0).fit(features=feats, logits=logits)
    torch.testing.assert_close(det.bank, torch.tensor([[math.log(2), 0.0], [0.0, math.log(4)]], dtype=torch.float64))
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)  # unit (0.6, 0.8): inner products 0.6 log 2, 0.8 log 4
    x_logits = torch.tensor([[1.0, 1.0]], dtype=torch.float64)  # energy conf 1 + log 2
    expected = -(1 + math.log(2)) * 0.8 * math.log(4)
    assert float(det.score(features=x, logits=x_logits)) == pytest.approx(expected, rel=1e-12)
    det2 = ood.NNGuide(k=2, alpha=1.0).fit(features=feats, logits=logits)
    expected2 = -(1 + math.log(2)) * (0.6 * math.log(2) + 0.8 * math.log(4)) / 2
    assert float(det2.score(features=x, logits=x_logits)) == pytest.approx(expected2, rel=1e-12)


def test_nnguide_bank_is_a_seeded_subset():
    g = torch.Generator().manual_seed(3)
    z, logits = torch.rand(400, 5, generator=g), torch.randn(400, 3, generator=g)
    det = ood.NNGuide(k=10, alpha=0.1).fit(features=z, logits=logits)
    assert det.bank.shape == (40, 5)
    again = ood.NNGuide(k=10, alpha=0.1).fit(features=z, logits=logits)
    torch.testing.assert_close(det.bank, again.bank)
    assert ood.NNGuide(k=50, alpha=0.01).fit(features=z, logits=logits).bank.shape == (50, 5)  # at least k rows
    with pytest.raises(ValueError, match="at least k=100"):
        ood.NNGuide().fit(features=z[:50], logits=logits[:50])
    with pytest.raises(ValueError, match="logits are required"):
        ood.NNGuide(k=2).fit(features=z)
    with pytest.raises(ValueError, match="rows"):
        det.score(features=z[:5], logits=logits[:4])


def test_constructor_and_input_validation():
    w = torch.rand(3, 8)
    with pytest.raises(ValueError, match="gamma must lie in"):
        ood.GEN(gamma=1.5)
    with pytest.raises(TypeError, match="M must be"):
        ood.GEN(M=2.5)
    with pytest.raises(ValueError, match="variant must be one of"):
        ood.ASH("x", weight=w)
    with pytest.raises(ValueError, match=r"percentile must lie in \[0, 100\)"):
        ood.SCALE(100, weight=w)
    with pytest.raises(ValueError, match="prunes all"):
        ood.ASH(percentile=95, weight=torch.rand(3, 4))
    with pytest.raises(ValueError, match="alpha must lie"):
        ood.NNGuide(alpha=0.0)
    with pytest.raises(ValueError, match="logits are required"):
        ood.GEN().score(features=torch.rand(2, 3))
    with pytest.raises(ValueError, match="8 columns"):
        ood.ASH(weight=w).score(features=torch.rand(2, 7))
    with pytest.raises(ValueError, match="classifier weight"):
        ood.SCALE().score(features=torch.rand(2, 8))
    with pytest.raises(ood.NotFittedError):
        ood.RMDS().score(features=torch.rand(2, 8))
    with pytest.raises(ValueError, match="at least 2 distinct classes"):
        ood.RMDS().fit(features=torch.rand(10, 3), labels=torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="gamma must lie in"):
        generalized_entropy(torch.rand(2, 3), gamma=0.0 + 1.0)
    with pytest.raises(ValueError, match="z must"):
        ash_prune(torch.rand(8), 50)
    with pytest.raises(TypeError, match="percentile must be a real number"):
        scale_activations(torch.rand(2, 8), "90")
    bad = torch.rand(4, 8)
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        ood.SCALE(weight=w).score(features=bad)


@pytest.mark.parametrize("name", ["GEN", "RMDS", "ASH", "SCALE", "NNGuide"])
def test_save_load_roundtrip(tmp_path, name):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 6, generator=g), torch.randn(3, generator=g)
    z, labels = torch.rand(40, 6, generator=g), torch.arange(40) % 3
    kwargs = {
        "GEN": {"gamma": 0.2, "M": 2},
        "ASH": {"variant": "b", "percentile": 50.0, "weight": w, "bias": b},
        "SCALE": {"percentile": 60.0, "weight": w, "bias": b},
        "NNGuide": {"k": 3, "alpha": 0.5, "seed": 4},
    }
    det = getattr(ood, name)(**kwargs.get(name, {})).fit(features=z, labels=labels, logits=z @ w.T + b)
    det.save_pretrained(tmp_path)
    loaded = ood.Detector.from_pretrained(tmp_path)
    assert type(loaded) is type(det) and loaded.config() == det.config()
    x = torch.rand(7, 6, generator=g)
    test = {"features": x, "logits": x @ w.T + b}
    torch.testing.assert_close(loaded.score(**test), det.score(**test))


def test_detectors_follow_input_device_and_dtype(device):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 5, generator=g), torch.randn(3, generator=g)
    z, labels = torch.rand(30, 5, generator=g), torch.arange(30) % 3
    for det in (ood.GEN(), ood.RMDS(), ood.ASH(percentile=60, weight=w, bias=b), ood.SCALE(weight=w, bias=b),
                ood.NNGuide(k=3, alpha=1.0)):  # fmt: skip
        det.fit(features=z.to(device), labels=labels.to(device), logits=(z @ w.T + b).to(device))
        for dtype in (torch.float32, torch.float64):
            x = z.to(device=device, dtype=dtype)
            scores = det.score(features=x, logits=x @ w.T.to(device, dtype) + b.to(device, dtype))
            assert scores.device.type == device.type and scores.shape == (30,) and scores.dtype == dtype
            assert bool(torch.isfinite(scores).all())
