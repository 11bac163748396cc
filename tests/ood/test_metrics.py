"""Tests for pml_suprank.ood.metrics: golden values of HEAT / OpenOOD / pytorch-ood, hand-computed cases, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pml_suprank.ood import metrics as M

CASES = ["HEAT_zero_residual_beta0", "GMM_energy_TG1e3", "EL_energy", "ties_example"]


def _split(golden, case):
    v = golden["metrics_inputs"][case]
    if isinstance(v, dict):
        return torch.tensor(v["id"]), torch.tensor(v["ood"])
    v = torch.tensor(v)
    return v[:20], v[20:]


@pytest.mark.parametrize("case", CASES)
def test_heat_reference_metrics(heat_golden, case):
    id_s, ood_s = _split(heat_golden, case)
    ref = heat_golden["metrics_heat_reference"][case]
    assert M.fpr_at_tpr(id_s, ood_s) == pytest.approx(ref["FPR95"], abs=1e-12)
    assert M.auroc(id_s, ood_s) == pytest.approx(ref["AUROC"], abs=1e-12)
    assert M.aupr_in(id_s, ood_s) == pytest.approx(ref["AUPR_IN"], abs=1e-12)
    assert M.aupr_out(id_s, ood_s) == pytest.approx(ref["AUPR_OUT"], abs=1e-12)
    assert M.detection_accuracy(id_s, ood_s) == pytest.approx(ref["DetAcc"], abs=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_openood_and_pytorch_ood_metrics(heat_golden, case):
    id_s, ood_s = _split(heat_golden, case)
    oo = heat_golden["metrics_openood_reference"][case]
    po = heat_golden["metrics_pytorch_ood_reference"][case]
    assert M.fpr_at_tpr(id_s, ood_s, convention="ood_positive") == pytest.approx(oo["FPR95_oodpositive"], abs=1e-12)
    assert M.fpr_at_tpr(id_s, ood_s, convention="ood_positive") == pytest.approx(po["FPR95_oodpositive"], abs=1e-12)
    legacy = M.fpr_at_tpr(id_s, ood_s, convention="id_positive_roc")
    assert legacy == pytest.approx(oo["FPR95_idpositive_legacy_fpr_recall"], abs=1e-12)
    assert M.auroc(id_s, ood_s) == pytest.approx(oo["AUROC"], abs=1e-12)
    assert M.aupr_in(id_s, ood_s, method="trapezoid") == pytest.approx(oo["AUPR_IN"], abs=1e-12)
    assert M.aupr_out(id_s, ood_s, method="trapezoid") == pytest.approx(oo["AUPR_OUT"], abs=1e-12)
    assert M.aupr_in(id_s, ood_s, method="trapezoid") == pytest.approx(po["AUPR_IN"], abs=1e-12)


def test_ties_example_conventions_differ(heat_golden):
    id_s, ood_s = _split(heat_golden, "ties_example")
    # 0.5 (interpolated percentile, ID positive), 0.9 (OOD positive), 0.7 (legacy discrete ROC)
    assert M.fpr_at_tpr(id_s, ood_s) == 0.5
    assert M.fpr_at_tpr(id_s, ood_s, convention="ood_positive") == 0.9
    assert M.fpr_at_tpr(id_s, ood_s, convention="id_positive_roc") == 0.7


def test_hand_computed_small_case():
    id_s, ood_s = [0.0, 1.0, 2.0], [1.0, 3.0]
    # pairs (id, ood): (0,1)>,(0,3)>,(1,1)=,(1,3)>,(2,1)<,(2,3)> -> (4 + 0.5) / 6
    assert M.auroc(id_s, ood_s) == pytest.approx(4.5 / 6)
    # ID-positive, tpr 0.5: threshold = median of ID = 1.0; OOD strictly below 1.0: none
    assert M.fpr_at_tpr(id_s, ood_s, tpr=0.5) == 0.0
    # tpr 1.0: threshold = 2.0; OOD below: {1.0} -> 1/2
    assert M.fpr_at_tpr(id_s, ood_s, tpr=1.0) == 0.5
    # OOD-positive, catch all OOD: threshold 1.0 flags ID {1, 2} -> 2/3
    assert M.fpr_at_tpr(id_s, ood_s, tpr=1.0, convention="ood_positive") == pytest.approx(2 / 3)
    # AP with OOD positive, thresholds 3 (tp1 fp0), 2 (tp1 fp1), 1 (tp2 fp2), 0 (tp2 fp3): 0.5*1 + 0.5*0.5
    assert M.aupr_out(id_s, ood_s) == pytest.approx(0.75)
    # trapezoid: (0,1)->(0.5,1)->(0.5,0.5)->(1,0.5)->(1,0.4): 0.5 + 0.5*(0.5+0.5)/2
    assert M.aupr_out(id_s, ood_s, method="trapezoid") == pytest.approx(0.75)
    assert M.detection_accuracy(id_s, ood_s) == pytest.approx(0.5 * (0.5 + 1.0))


def test_perfect_and_reversed_separation():
    id_s, ood_s = torch.arange(10.0), torch.arange(10.0) + 100
    assert M.auroc(id_s, ood_s) == 1.0 and M.auroc(ood_s, id_s) == 0.0
    assert M.fpr_at_tpr(id_s, ood_s) == 0.0
    assert M.fpr_at_tpr(id_s, ood_s, convention="ood_positive") == 0.0
    assert M.aupr_in(id_s, ood_s) == 1.0 and M.aupr_out(id_s, ood_s) == 1.0


def test_auroc_invariant_to_order_and_monotone_maps():
    g = torch.Generator().manual_seed(0)
    id_s, ood_s = torch.randn(50, generator=g), torch.randn(40, generator=g) + 1
    perm = torch.randperm(50, generator=g)
    assert M.auroc(id_s[perm], ood_s) == M.auroc(id_s, ood_s)
    assert M.auroc(torch.exp(id_s), torch.exp(ood_s)) == pytest.approx(M.auroc(id_s, ood_s))
    # brute force Mann-Whitney
    diff = ood_s[None, :] - id_s[:, None]
    brute = float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())
    assert M.auroc(id_s, ood_s) == pytest.approx(brute)


def test_quantile_linear_matches_numpy():
    x = torch.randn(1001, generator=torch.Generator().manual_seed(1))
    for q in (0.0, 0.1, 0.5, 0.95, 1.0):
        assert float(M.quantile_linear(x, q)) == pytest.approx(float(np.percentile(x.numpy(), 100 * q)), abs=1e-6)


def test_evaluate_keys():
    out = M.evaluate([0.0, 1.0], [2.0, 3.0])
    assert set(out) == {"fpr", "auroc", "aupr_in", "aupr_out", "detection_accuracy"}


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"id_scores": [], "ood_scores": [1.0]}, ValueError, "id_scores"),
        ({"id_scores": [[1.0]], "ood_scores": [1.0]}, ValueError, "1-D"),
        ({"id_scores": [float("nan")], "ood_scores": [1.0]}, ValueError, "NaN"),
        ({"id_scores": [1.0], "ood_scores": [1.0], "tpr": 1.5}, ValueError, "tpr"),
        ({"id_scores": [1.0], "ood_scores": [1.0], "tpr": 0.0}, ValueError, "tpr"),
        ({"id_scores": [1.0], "ood_scores": [1.0], "convention": "openood"}, ValueError, "convention"),
        ({"id_scores": "abc", "ood_scores": [1.0]}, TypeError, "id_scores"),
    ],
)
def test_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        M.fpr_at_tpr(**kwargs)


def test_bad_ap_method():
    with pytest.raises(ValueError, match="method"):
        M.aupr_in([0.0], [1.0], method="interp")
