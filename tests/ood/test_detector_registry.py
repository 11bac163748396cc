"""Tests for the detector / prior registries: filled by subclassing, lookups, overwrite warning."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pml_suprank import ood
from pml_suprank._registry import Registry
from pml_suprank.ood.base import DETECTOR_REGISTRY, _detector_class
from pml_suprank.ood.priors import PRIOR_REGISTRY

BUILT_IN = (
    "HEAT", "MSP", "MaxLogit", "Energy", "GEN", "ODIN", "Mahalanobis", "RMDS", "KNN", "NNGuide", "ViM",
    "ReAct", "DICE", "ASH", "SCALE",
)  # fmt: skip


@pytest.fixture
def clean_registries():
    """Restore both registries after a test that defines classes."""
    saved = dict(DETECTOR_REGISTRY._entries), dict(PRIOR_REGISTRY._entries)
    yield
    for registry, entries in zip((DETECTOR_REGISTRY, PRIOR_REGISTRY), saved):
        registry._entries.clear()
        registry._entries.update(entries)


def test_built_in_detectors_are_registered_in_order():
    assert ood.list_detectors() == BUILT_IN
    for name in BUILT_IN:
        cls = ood.get_detector(name)
        assert cls is getattr(ood, name) and cls.detector_name == name
        assert _detector_class(name) is cls
    # bases and helpers are not entries
    assert "Detector" not in ood.list_detectors() and "HeadDetector" not in ood.list_detectors()
    assert ood.Detector.detector_name is None


def test_every_baseline_is_defined_where_the_layout_says():
    """One module per detector family (the re-export-only ``ood.baselines`` and the one-detector modules merged into
    their family were removed)."""
    modules = {"HEAT": "heat", "ViM": "vim"}
    modules |= dict.fromkeys(("MSP", "MaxLogit", "Energy", "GEN", "ODIN"), "logit_scores")
    modules |= dict.fromkeys(("Mahalanobis", "RMDS"), "mahalanobis") | dict.fromkeys(("KNN", "NNGuide"), "knn")
    modules |= dict.fromkeys(("ReAct", "DICE", "ASH", "SCALE"), "shaping")
    for name in BUILT_IN:
        cls = getattr(ood, name)
        assert cls.__module__ == f"pml_suprank.ood.{modules[name]}" and issubclass(cls, ood.Detector)
    assert not hasattr(ood, "baselines")
    for gone in ("gen", "odin", "rmds", "nnguide", "react", "dice"):
        assert importlib.util.find_spec(f"pml_suprank.ood.{gone}") is None


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown detector 'Nope'; expected one of \['HEAT', 'MSP'"):
        ood.get_detector("Nope")
    with pytest.raises(ValueError, match=r"config.json names an unknown detector 'Nope'.*'ReAct'"):
        _detector_class("Nope")
    with pytest.raises(ValueError, match="unknown HEAT prior 'flow'.*'gmm', 'gmm_std', 'el'"):
        ood.get_prior("flow")
    with pytest.raises(ValueError, match="unknown detector 3"):
        ood.get_detector(3)


def test_subclass_registers_and_round_trips(clean_registries, tmp_path):
    class NormScore(ood.Detector):
        """Outlier score ``‖z‖`` ``(N,)`` (a toy detector)."""

        requires_fit = False

        def _score(self, features=None, logits=None, **kwargs):
            return features.norm(dim=-1)

    assert ood.list_detectors() == (*BUILT_IN, "NormScore") and ood.get_detector("NormScore") is NormScore
    assert "NormScore" in ood.list_detectors()  # registered when defined
    NormScore().save_pretrained(tmp_path)
    loaded = ood.Detector.from_pretrained(tmp_path)
    assert type(loaded) is NormScore
    torch.testing.assert_close(loaded.score(features=torch.ones(2, 4)), torch.full((2,), 2.0))


def test_name_keyword_private_and_unregistered_classes(clean_registries):
    class SSDPlus(ood.Mahalanobis, name="SSD+"):
        pass

    class _Private(ood.Detector):
        pass

    class Intermediate(ood.Detector, register=False):
        pass

    assert ood.get_detector("SSD+") is SSDPlus and SSDPlus.detector_name == "SSD+"
    assert "_Private" not in ood.list_detectors() and "Intermediate" not in ood.list_detectors()
    assert _Private.detector_name is None and Intermediate.detector_name is None


def test_overwrite_warns_and_replaces(clean_registries):
    class Twice(ood.Detector):
        pass

    first = Twice
    with pytest.warns(UserWarning, match="detector 'Twice' is already registered"):

        class Twice(ood.Detector):  # noqa: F811 - redefinition is the point
            pass

    assert ood.get_detector("Twice") is Twice and Twice is not first
    assert DETECTOR_REGISTRY.unregister("Twice") is Twice and "Twice" not in ood.list_detectors()
    with pytest.raises(ValueError, match="unknown detector 'Twice'"):
        DETECTOR_REGISTRY.unregister("Twice")


def test_registry_is_a_read_only_mapping():
    reg = Registry("thing")
    assert len(reg) == 0 and list(reg) == [] and reg.names() == ()
    reg.register("a", int)
    assert dict(reg) == {"a": int} and reg["a"] is int and "a" in reg
    with pytest.raises(TypeError, match="non-empty string"):
        reg.register("", float)
    with pytest.raises(TypeError):
        reg["b"] = float  # Mapping, not MutableMapping
