"""Tests for pml_suprank.ood.priors: golden GMM / EL energies, a hand-computed Gaussian, gradcheck, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from pml_suprank.ood import ClassConditionalGaussian, ELPrior, energy_logits, pool_feature_map


def _golden_features(g, dtype=torch.float32):
    inp = g["inputs"]
    train = torch.tensor(inp["feature_maps_train"], dtype=dtype)
    test = torch.cat([torch.tensor(inp["feature_maps_test_id"]), torch.tensor(inp["feature_maps_test_ood"])]).to(dtype)
    return pool_feature_map(train), pool_feature_map(test), torch.tensor(inp["labels_train"])


@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "unnormalized"])
@pytest.mark.parametrize("pooling", ["avg", "std"])
def test_gmm_matches_golden(heat_golden, dtype, normalize, pooling):
    (tr_avg, tr_std), (te_avg, te_std), labels = _golden_features(heat_golden, dtype)
    train, test = (tr_avg, te_avg) if pooling == "avg" else (tr_std, te_std)
    gmm = ClassConditionalGaussian(normalize=normalize).fit(train, labels)
    key = "GMM" + ("_std" if pooling == "std" else "") + ("" if normalize else "_unnormalized")
    ref = heat_golden["heat_reference"]
    nll = gmm.neg_log_likelihood(test)
    assert nll.dtype == dtype
    torch.testing.assert_close(nll, torch.tensor(ref[f"{key}_neg_log_q"], dtype=dtype), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(nll / 1e3, torch.tensor(ref[f"{key}_energy_TG1e3"], dtype=dtype), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        gmm.min_mahalanobis(test), torch.tensor(ref[f"{key}_min_sq_mahalanobis"], dtype=dtype), rtol=1e-4, atol=1e-5
    )


def test_gmm_parameters_match_golden(heat_golden):
    (tr_avg, _), _, labels = _golden_features(heat_golden)
    gmm = ClassConditionalGaussian().fit(tr_avg, labels)
    ref = heat_golden["heat_reference_gmm_params_normalized_avg"]
    torch.testing.assert_close(gmm.class_weights, torch.tensor(ref["class_weights"], dtype=torch.float64))
    torch.testing.assert_close(gmm.means, torch.tensor(ref["means"], dtype=torch.float64), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gmm.cholesky, torch.tensor(ref["cholesky_L"], dtype=torch.float64), rtol=1e-4, atol=1e-6)


def test_el_matches_golden(heat_golden, dtype):
    _, (te_avg, _), _ = _golden_features(heat_golden, dtype)
    inp = heat_golden["inputs"]
    prior = ELPrior(torch.tensor(inp["fc_weight"], dtype=dtype), torch.tensor(inp["fc_bias"], dtype=dtype))
    ref = torch.tensor(heat_golden["heat_reference"]["EL_energy"], dtype=dtype)
    torch.testing.assert_close(prior.energy(te_avg), ref, rtol=1e-4, atol=1e-5)


def test_std_pooling_is_unbiased(heat_golden):
    (tr_avg, tr_std), _, _ = _golden_features(heat_golden, torch.float64)
    derived = heat_golden["derived_features"]
    torch.testing.assert_close(tr_avg, torch.tensor(derived["train_avg"], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(tr_std, torch.tensor(derived["train_std"], dtype=torch.float64), atol=1e-6, rtol=0)


def test_hand_computed_two_class_gaussian():
    # centred rows all lie on the diagonal -> singular covariance: without ridge this is a clear error
    z = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [9.0, -1.0], [11.0, 1.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="positive definite"):
        ClassConditionalGaussian(normalize=False, reg=0.0).fit(z, torch.tensor([0, 0, 1, 1]))
    z = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [0.0, -2.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1])
    gmm = ClassConditionalGaussian(normalize=False, reg=0.0).fit(z, labels)
    # means (0, 0), (0, 0); centred rows -> Σ = diag(2/4, 8/4) = diag(0.5, 2)
    torch.testing.assert_close(gmm.cholesky @ gmm.cholesky.T, torch.diag(torch.tensor([0.5, 2.0], dtype=torch.float64)))
    x = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    maha = 1.0 / 0.5 + 4.0 / 2.0
    assert float(gmm.min_mahalanobis(x)) == pytest.approx(maha)
    log_q = -0.5 * maha - math.log(2 * math.pi) - 0.5 * math.log(0.5 * 2.0)
    assert float(gmm.neg_log_likelihood(x)) == pytest.approx(-log_q)


def test_energy_logits_hand_computed():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    torch.testing.assert_close(energy_logits(logits), -torch.log(torch.tensor([2.0, 4.0])))
    torch.testing.assert_close(
        energy_logits(logits, temperature=2.0), -2.0 * torch.log(torch.tensor([2.0, 3**0.5 + 1]))
    )


def test_prior_energies_gradcheck():
    g = torch.Generator().manual_seed(0)
    z = torch.rand(30, 4, generator=g, dtype=torch.float64) + 0.1
    labels = torch.arange(30) % 3
    gmm = ClassConditionalGaussian().fit(z, labels)
    x = (torch.rand(5, 4, generator=g, dtype=torch.float64) + 0.1).requires_grad_(True)
    assert torch.autograd.gradcheck(gmm.neg_log_likelihood, (x,))
    el = ELPrior(torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
    assert torch.autograd.gradcheck(el.energy, (x,))


def test_gmm_sample_statistics():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    labels = torch.zeros(400, dtype=torch.long)
    labels[200:] = 1
    z[200:] += 5.0
    gmm = ClassConditionalGaussian(normalize=False).fit(z, labels)
    samples = gmm.sample(20000, torch.Generator().manual_seed(1), dtype=torch.float64)
    assert samples.shape == (20000, 3)
    torch.testing.assert_close(samples.mean(0), z.mean(0), atol=0.08, rtol=0)


def test_rank_deficient_features_still_fit():
    # more dimensions than samples and a dead channel: the relative ridge keeps the Cholesky defined
    z = torch.rand(6, 10, generator=torch.Generator().manual_seed(0))
    z[:, 3] = 0.0
    gmm = ClassConditionalGaussian().fit(z, torch.tensor([0, 0, 0, 1, 1, 1]))
    assert torch.isfinite(gmm.neg_log_likelihood(z)).all()


def test_bad_input():
    gmm = ClassConditionalGaussian()
    z = torch.rand(10, 4)
    with pytest.raises(ValueError, match="at least 2 distinct classes"):
        gmm.fit(z, torch.zeros(10, dtype=torch.long))
    bad = z.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        gmm.fit(bad, torch.arange(10) % 2)
    with pytest.raises(ValueError, match="labels"):
        gmm.fit(z, torch.arange(9) % 2)
    with pytest.raises(TypeError, match="integer"):
        gmm.fit(z, torch.rand(10))
    with pytest.raises(ValueError, match="zero variance"):
        gmm.fit(torch.ones(10, 4), torch.arange(10) % 2)
