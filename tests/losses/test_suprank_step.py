"""The τ of SupRank's H⁻ (Eq. 4) is ``tau=`` or its alias ``temperature=`` — except in Sup-R@k / ROD-R@k, where
``temperature`` is the outer τ* (Eq. 16)."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_helpers import TABLE, batch

from pml_suprank import losses
from pml_suprank.losses._suprank_step import DEFAULT_TAU, resolve_tau

STEP_LOSSES = {
    "SupAP": lambda **kw: losses.SupAPLoss(**kw),
    "ROADMAP": lambda **kw: losses.ROADMAPLoss(**kw),
    "SupHAP": lambda **kw: losses.SupHAPLoss(hierarchy=TABLE, **kw),
    "HAPPIER": lambda **kw: losses.HAPPIERLoss(6, 8, hierarchy=TABLE, **kw),
    "SupNDCG": lambda **kw: losses.SupNDCGLoss(hierarchy=TABLE, **kw),
    "RODNDCG": lambda **kw: losses.RODNDCGLoss(6, 8, hierarchy=TABLE, **kw),
}


@pytest.mark.parametrize("name", sorted(STEP_LOSSES))
def test_temperature_is_an_alias_of_tau(name):
    make = STEP_LOSSES[name]
    emb, fine = batch(0, n=24)
    torch.manual_seed(0)
    by_tau = make(tau=0.05).double()
    torch.manual_seed(0)
    by_temperature = make(temperature=0.05).double()
    torch.manual_seed(0)
    both = make(tau=0.05, temperature=0.05).double()
    assert by_tau.tau == by_temperature.tau == both.tau == 0.05
    assert by_temperature.step == by_tau.step
    assert by_tau(emb, fine).item() == by_temperature(emb, fine).item()
    assert make().tau == DEFAULT_TAU


@pytest.mark.parametrize("name", sorted(STEP_LOSSES))
def test_conflicting_tau_and_temperature_raise(name):
    with pytest.raises(ValueError, match="tau=0.05 and temperature=0.1"):
        STEP_LOSSES[name](tau=0.05, temperature=0.1)


def test_bad_temperature_is_named():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        losses.SupAPLoss(temperature=-1.0)
    with pytest.raises(TypeError, match="temperature must be a real number"):
        losses.SupAPLoss(temperature="0.01")
    with pytest.raises(ValueError, match="tau must be > 0"):
        losses.SupAPLoss(tau=0.0)


def test_recall_losses_keep_temperature_for_the_outer_sigmoid():
    recall = losses.SupRecallLoss(temperature=2.0, tau=0.05)
    assert recall.temperature == 2.0 and recall.tau == 0.05 and recall.step.tau == 0.05
    assert losses.SupRecallLoss(temperature=2.0).tau == DEFAULT_TAU
    rod = losses.RODRecallLoss(temperature=2.0, tau=0.05)
    assert rod.rank_loss.temperature == 2.0 and rod.temperature == 2.0 and rod.tau == 0.05


def test_resolve_tau():
    assert resolve_tau(None, None, "X") == DEFAULT_TAU
    assert resolve_tau(0.2, None, "X") == 0.2
    assert resolve_tau(None, 0.3, "X") == 0.3
    assert resolve_tau(0.3, 0.3, "X") == 0.3
    with pytest.raises(ValueError, match="X takes the τ of H⁻"):
        resolve_tau(0.3, 0.2, "X")
