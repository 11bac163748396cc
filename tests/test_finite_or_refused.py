"""Finite, or refused: evaluators rank subnormal embeddings exactly; Mahalanobis / SSD+ / RMDS / HEAT's GMM prior
are exact at any feature scale where their scores fit the dtype and refuse (naming the cause and the way out) where
they do not."""

from __future__ import annotations

import pytest
import torch

from pml_suprank import ood
from pml_suprank._scaling import overflow_safe_scales, times_power_of_two
from pml_suprank.metrics import RetrievalEvaluator


def _unit(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)


@pytest.mark.parametrize("scale", [1e-40, 1e-42, 1e-44])
def test_evaluator_ranks_subnormal_embeddings_exactly(scale, device):
    # the reproduction: x 1e-40 (float32 subnormal) gave mAP@R 0.0 (the rescaling factor overflowed)
    emb, labels = _unit(120, 16, 0), torch.arange(120) % 6
    tiny = emb * scale
    assert bool(tiny.abs().amax() < torch.finfo(torch.float32).tiny)  # every entry subnormal
    evaluator = RetrievalEvaluator(device=device)
    got = evaluator.evaluate(tiny, labels)
    # the same values exactly scaled back up (a power of two, in float64): the ranking of the input as given
    exact = evaluator.evaluate((tiny.double() * 2.0**140).float(), labels)
    for key, value in exact.items():
        if isinstance(value, float):
            assert got[key] == value, key
    if scale == 1e-40:  # ~16 significant bits left: the unscaled embeddings' metrics to rounding
        assert got["map_at_r"] == pytest.approx(evaluator.evaluate(emb, labels)["map_at_r"], abs=1e-6)


def test_evaluator_with_separate_queries_and_subnormal_gallery():
    emb, labels = (_unit(100, 8, 1) * 4096).round() / 4096, torch.arange(100) % 5  # multiples of 2**-12
    evaluator = RetrievalEvaluator()
    expected = evaluator.evaluate(emb[:40], labels[:40], emb[40:], labels[40:])
    tiny = emb * 2.0**-136  # multiples of 2**-148: every value an exact float32 subnormal
    assert bool(tiny.abs().amax() < torch.finfo(torch.float32).tiny)
    got = evaluator.evaluate(emb[:40], labels[:40], tiny[40:], labels[40:])
    got_q = evaluator.evaluate(tiny[:40], labels[:40], emb[40:], labels[40:])
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == value and got_q[key] == value, key


def test_multilabel_evaluator_ranks_subnormal_embeddings_exactly():
    g = torch.Generator().manual_seed(6)
    emb = (_unit(80, 8, 6) * 4096).round() / 4096  # multiples of 2**-12: exact subnormals once times 2**-136
    labels = (torch.rand(80, 5, generator=g) > 0.6).long()
    evaluator = RetrievalEvaluator(multilabel=True)
    expected, got = evaluator.evaluate(emb, labels), evaluator.evaluate(emb * 2.0**-136, labels)
    assert expected["map_at_r"] > 0 and all(got[k] == v for k, v in expected.items() if isinstance(v, float))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaling_keeps_products_normal_and_finite_at_both_ends(dtype):
    info = torch.finfo(dtype)
    base = _unit(10, 4, 2).to(dtype)
    for q_scale, g_scale in [(info.tiny / 2**10, info.tiny / 2**10), (info.tiny / 2**10, 1.0), (info.max / 4, 1.0),
                             (info.max / 4, info.max / 4)]:  # fmt: skip
        query, gallery = base * q_scale, base * g_scale
        factor, scaled = overflow_safe_scales(query, gallery)
        assert bool(torch.isfinite(scaled).all()) and factor < float("inf")
        scores = (query * factor) @ scaled.T
        assert bool(torch.isfinite(scores).all()) and float(scores.abs().max()) > info.tiny / info.eps
    k = 148 if dtype == torch.float32 else 1073  # 2**k itself is not representable in the dtype
    x = torch.tensor([3.0, -1.0], dtype=torch.float64).mul(2.0**-k).to(dtype)  # subnormal, exact
    assert torch.equal(times_power_of_two(x, k), torch.tensor([3.0, -1.0], dtype=dtype))


@pytest.mark.parametrize("make", [lambda: ood.Mahalanobis(), lambda: ood.RMDS()], ids=["mahalanobis", "rmds"])
def test_distance_scores_that_overflow_the_dtype_saturate_as_most_ood_with_warnings(make):
    # fitted on features of scale 1e-30, normal features scored: beyond float32, answered (saturated), never raised
    z, labels = torch.randn(200, 8, generator=torch.Generator().manual_seed(3)), torch.arange(200) % 4
    with pytest.warns(RuntimeWarning, match="degenerate at the scale of float32.*score saturates"):
        det = make().fit(features=z * 1e-30, labels=labels)
    with pytest.warns(RuntimeWarning, match=r"scores of 5 of 5 inputs exceed float32 .*saturated.*most OOD"):
        scores = det.score(features=z[:5])
    assert scores.dtype == torch.float32 and bool((scores == torch.finfo(torch.float32).max).all())
    inside = det.score(features=z[:5] * 1e-30)  # inputs at the fitted scale: finite, ranked below the saturated
    assert bool(torch.isfinite(inside).all()) and bool((inside < scores).all())
    wide = det.score(features=z[:5].double())  # the way out: finite float64 scores
    assert wide.dtype == torch.float64 and bool(torch.isfinite(wide).all()) and float(wide.min()) > 1e50
    reference = make().fit(features=z, labels=labels).score(features=z[:5])  # same scale: scale-free
    torch.testing.assert_close(det.score(features=z[:5] * 1e-30), reference, rtol=1e-4, atol=1e-4)


def test_ssd_plus_is_exact_at_any_feature_scale():
    # F.normalize(eps=1e-12) left features of scale 1e-30 at norm 1e-18: every normal feature scored ~1e36
    z, labels = torch.randn(200, 8, generator=torch.Generator().manual_seed(4)), torch.arange(200) % 4
    reference = ood.Mahalanobis(normalize=True).fit(features=z, labels=labels).score(features=z[:20])
    for scale in (1e-30, 1e-20, 1e20):
        det = ood.Mahalanobis(normalize=True).fit(features=z * scale, labels=labels)
        torch.testing.assert_close(det.score(features=z[:20]), reference, rtol=1e-5, atol=1e-5)


def test_heat_gmm_prior_is_exact_at_any_feature_scale():
    z, labels = torch.randn(120, 6, generator=torch.Generator().manual_seed(5)).abs(), torch.arange(120) % 3

    def scores(scale):
        heat = ood.HEAT(priors=("gmm",), preset="fast", settings={"epochs": 0})
        return heat.fit(features=z * scale, labels=labels).score(features=z[:10] * scale)

    reference = scores(1.0)
    torch.testing.assert_close(scores(1e-30), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scale", [1e-160, 1e-300, 1e300])
@pytest.mark.parametrize(
    "make", [lambda: ood.Mahalanobis(), lambda: ood.RMDS(), lambda: ood.Mahalanobis(normalize=True)],
    ids=["mahalanobis", "rmds", "ssd+"],
)  # fmt: skip
def test_gaussian_fits_are_exact_at_any_float64_scale(make, scale):
    # a covariance of features of scale 1e-160 is ~1e-320, a float64 subnormal: scores were off by 12, and at 1e-200
    # the fit was refused as "zero variance"; fitted at scale ~1 and scaled back by a power of two, they are exact
    g = torch.Generator().manual_seed(7)
    z, labels = torch.randn(200, 8, generator=g, dtype=torch.float64), torch.arange(200) % 4
    reference = make().fit(features=z, labels=labels).score(features=z[:10])
    got = make().fit(features=z * scale, labels=labels).score(features=z[:10] * scale)
    torch.testing.assert_close(got, reference, rtol=1e-12, atol=1e-12)
