"""Tests for HEAT's ``Prior`` contract: the built-in priors' declarations, and a user-defined prior plugged into HEAT
(fit, score, composition with the built-ins, save / load, settings)."""

from __future__ import annotations

import pytest
import torch

from pml_suprank import ood
from pml_suprank.ood.priors import PRIOR_REGISTRY

FAST = {"hidden_dim": 16, "n_hidden_layers": 1, "epochs": 2, "batch_size": 32, "sgld_steps": 2}


@pytest.fixture
def mean_distance_prior():
    """A user-defined prior: squared distance to the training mean, sampled around it."""

    class MeanDistancePrior(ood.Prior, name="mean_distance"):
        def fit(self, features, labels=None):
            self.mean = features.mean(0)
            return self

        def energy(self, z):
            return (z - self.mean.to(z)).pow(2).sum(-1)

        def sample(self, n, generator, device=None, dtype=torch.float32):
            eps = torch.randn(n, self.dim, generator=generator, device=generator.device)
            return (self.mean.to(eps) + eps).to(device=device, dtype=dtype)

        @property
        def dim(self):
            return self.mean.shape[0]

        def state_dict(self):
            return {"mean": self.mean}

        def load_state_dict(self, state):
            self.mean = state["mean"]
            return self

    yield MeanDistancePrior
    PRIOR_REGISTRY.unregister("mean_distance")


def _task(n=90, d=5):
    """Three classes of ReLU features around 1, 2 and 3 (column-shifted), std-like features, a random head."""
    g = torch.Generator().manual_seed(11)
    labels = torch.arange(n) % 3
    centres = 1.0 + labels[:, None].float() + 0.1 * torch.arange(d)
    z = torch.relu(centres + 0.25 * torch.randn(n, d, generator=g))
    train = {"features": z, "std_features": 0.2 + torch.rand(n, d, generator=g), "labels": labels}
    return train, torch.randn(3, d, generator=g), torch.zeros(3)


def test_built_in_priors_declare_their_inputs():
    assert ood.list_priors()[:3] == ("gmm", "gmm_std", "el")
    gmm, gmm_std, el = (ood.get_prior(n) for n in ("gmm", "gmm_std", "el"))
    assert (gmm, gmm_std, el) == (ood.GMMPrior, ood.GMMStdPrior, ood.ELPrior)
    assert (gmm.source, gmm_std.source, el.source) == ("features", "std_features", "features")
    assert gmm.needs_labels and gmm_std.needs_labels and not el.needs_labels
    assert el.needs_head and not gmm.needs_head
    assert gmm.create().normalize and not el.create(weight=torch.rand(2, 3)).normalize
    # the densities are the shared ones (Mahalanobis uses the same Gaussian)
    assert isinstance(gmm.create(), ood.ClassConditionalGaussian)
    assert isinstance(el.create(weight=torch.rand(2, 3)), ood.ELPrior)
    assert dict(gmm_std.default_settings("cifar10")) == ood.PRESETS["cifar10"]["gmm_std"]
    with pytest.raises(ValueError, match="classifier head"):
        el.create()


def test_user_prior_plugs_into_heat(mean_distance_prior, tmp_path):
    torch.set_num_threads(1)
    train, w, b = _task()
    assert "mean_distance" in ood.list_priors()
    heat = ood.HEAT(priors=("gmm", "mean_distance", "el"), weight=w, bias=b, settings=FAST, seed=2)
    # no PRESETS entry: it takes the GMM settings of the preset (settings_like), overrides apply to it too
    assert heat.component_settings["mean_distance"] == heat.component_settings["gmm"]
    heat.fit(**train)
    assert set(heat.history) == {"gmm", "mean_distance", "el"} and len(heat.history["mean_distance"]) == 2
    assert isinstance(heat.components["mean_distance"].prior, mean_distance_prior)
    test = {"features": train["features"][:9] + 0.05}
    comps = heat.score_components(**test)["mean_distance"]
    expected_prior = (test["features"] - train["features"].mean(0)).pow(2).sum(-1) / 1e3  # T_k of the gmm preset
    torch.testing.assert_close(comps["prior"], expected_prior)
    assert bool(comps["residual"].abs().sum() > 0)
    scores = heat.score(**test)
    assert scores.shape == (9,) and bool(torch.isfinite(scores).all())

    heat.save_pretrained(tmp_path)
    assert "mean_distance.prior.mean" in heat.state_dict()
    loaded = ood.Detector.from_pretrained(tmp_path)
    assert loaded.priors == ("gmm", "mean_distance", "el")
    torch.testing.assert_close(loaded.score(**test), scores)


def test_user_prior_alone_by_class_and_bad_priors(mean_distance_prior):
    torch.set_num_threads(1)
    train, _, _ = _task()
    heat = ood.HEAT(priors=(mean_distance_prior,), settings={**FAST, "epochs": 0}, zero_init_residual=True)
    assert heat.priors == ("mean_distance",)
    heat.fit(features=train["features"])  # needs neither labels, std_features nor a head
    z = train["features"][:5]
    energy = (z - train["features"].mean(0)).pow(2).sum(-1)
    torch.testing.assert_close(
        heat.score(features=z), (energy / 1e3 - heat.standardization_mean) / heat.standardization_std
    )
    with pytest.raises(ValueError, match="priors must be registered HEAT prior names"):
        ood.HEAT(priors=("gmm", "flow"))
    with pytest.raises(ValueError, match="distinct"):
        ood.HEAT(priors=("mean_distance", mean_distance_prior))
    with pytest.raises(ValueError, match=r"unknown HEAT settings \['nope'\] for prior 'mean_distance'"):
        ood.HEAT(priors=("mean_distance",), settings={"mean_distance": {"nope": 1}})
