"""HEAT and its residual energy MLP bound every size when constructed, before anything is allocated: the schema a
loaded config.json is held to applies to ``HEAT(settings=...)`` too, the MLP's parameter count is capped, and the
seed fits the generators."""

from __future__ import annotations

import time

import pytest
import torch

from pml_suprank import ood
from pml_suprank.ood.ebm import MAX_MLP_PARAMETERS, ResidualEnergyMLP, mlp_parameter_count


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"hidden_dim": 10**12}, r"settings\['hidden_dim'\] must be an int in \[1, 65536\]; got 1000000000000"),
        ({"gmm": {"hidden_dim": 10**9}}, r"settings\['gmm'\]\['hidden_dim'\] must be an int in \[1, 65536\]"),
        ({"n_hidden_layers": 10**6}, r"settings\['n_hidden_layers'\] must be an int in \[0, 64\]"),
        ({"sgld_steps": 10**12}, r"settings\['sgld_steps'\] must be an int in \[0, 100000\]"),
        ({"epochs": 10**9}, r"settings\['epochs'\] must be an int in \[0, 100000\]"),
        ({"el": {"batch_size": 2**40}}, r"settings\['el'\]\['batch_size'\] must be an int in \[1, 16777216\]"),
        ({"batch_size": [1, 2]}, r"settings\['batch_size'\] must be an int in \[1, 16777216\]; got \[1, 2\]"),
        ({"accumulation_steps": 10**7}, r"settings\['accumulation_steps'\] must be an int in \[1, 100000\]"),
        ({"milestones": list(range(5000))}, r"settings\['milestones'\] must be a list of at most 1000 ints"),
        ({"reduce_width": "false"}, r"settings\['reduce_width'\] must be a bool; got 'false'"),
        ({"lr": float("inf")}, r"settings\['lr'\] must be a finite number > 0; got inf"),
        (
            {"hidden_dim": 65536, "n_hidden_layers": 64},
            r"settings\['gmm'\]: hidden_dim=65536 with n_hidden_layers=64 makes a residual MLP of [\d,]+ parameters",
        ),
    ],
)
def test_heat_settings_are_bounded_when_constructed(settings, match):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        ood.HEAT(priors=("gmm", "el"), settings=settings)
    assert time.perf_counter() - start < 5  # refused before anything is allocated (generous: a shared CPU)


def test_heat_seed_must_fit_the_generators():
    with pytest.raises(ValueError, match=r"seed must be an int in \[-2\*\*53, 2\*\*53\]; got 10{30}"):
        ood.HEAT(priors=("gmm",), seed=10**30)
    assert ood.HEAT(priors=("gmm",), seed=-(2**53)).seed == -(2**53)


def test_settings_within_the_bounds_still_fit():
    g = torch.Generator().manual_seed(0)
    features, labels = torch.randn(40, 6, generator=g), torch.arange(40) % 4
    heat = ood.HEAT(priors=("gmm",), preset="fast", settings={"epochs": 1, "batch_size": 16, "hidden_dim": 8,
                                                              "milestones": (1,), "sgld_steps": 2})  # fmt: skip
    scores = heat.fit(features=features, labels=labels).score(features=features)
    assert scores.shape == (40,) and bool(torch.isfinite(scores).all())
    assert heat.components["gmm"].mlp.input_layer.weight.shape == (8, 6)


def test_residual_mlp_counts_and_caps_its_parameters_before_allocating():
    mlp = ResidualEnergyMLP(5, hidden_dim=8, n_hidden_layers=2)
    assert sum(p.numel() for p in mlp.parameters()) == mlp_parameter_count(5, 8, 2)
    pyramid = ResidualEnergyMLP(5, hidden_dim=16, n_hidden_layers=2, reduce_width=True)
    assert sum(p.numel() for p in pyramid.parameters()) == mlp_parameter_count(5, 16, 2, reduce_width=True)
    tied = ResidualEnergyMLP(5, hidden_dim=8, n_hidden_layers=3, tie_hidden_weights=True)
    assert sum(p.numel() for p in tied.parameters()) == mlp_parameter_count(5, 8, 3, tie_hidden_weights=True)
    with pytest.raises(ValueError, match="hidden_dim must be <= 65536 and n_hidden_layers <= 64"):
        ResidualEnergyMLP(4, hidden_dim=10**12)
    with pytest.raises(ValueError, match=rf"more than {MAX_MLP_PARAMETERS:,}: lower hidden_dim"):
        ResidualEnergyMLP(10**6, hidden_dim=65536, n_hidden_layers=0)  # the input layer alone: 65 billion
