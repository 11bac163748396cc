import math

import pytest
import torch

from pml_suprank import ranking as R


def test_step_values_by_hand():
    t = torch.tensor([-1.0, -0.01, 0.0, 0.01, 0.05, 0.06], dtype=torch.float64)
    h = R.steps.heaviside(t)
    assert h.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    sig = R.steps.tau_sigmoid(t, 0.01)
    assert sig[2].item() == 0.5 and sig[1].item() == pytest.approx(1 / (1 + math.e), abs=1e-15)
    assert sig[0].item() == pytest.approx(1 / (1 + math.exp(50)), rel=1e-12)  # clamped at -50 like the reference
    hm = R.SupRankStep().value(t)
    off = R.steps.default_offset(0.01, 0.05, 0.5)
    assert hm[2].item() == 0.5  # H⁻(0) = σ(0)
    assert hm[3].item() == pytest.approx(0.5 + 1 / (1 + math.exp(-1)), abs=1e-15)
    assert hm[4].item() == pytest.approx(0.5 + 1 / (1 + math.exp(-5)), abs=1e-15)
    assert hm[5].item() == pytest.approx(100 * 0.01 + off, abs=1e-12)
    assert off == pytest.approx(1.4933071, abs=1e-7)
    # continuous at δ with the default offset, upper bound of H on t > 0
    eps = torch.tensor([0.05 - 1e-9, 0.05 + 1e-9], dtype=torch.float64)
    v = R.SupRankStep().value(eps)
    assert abs(v[1] - v[0]).item() < 1e-6
    grid = torch.linspace(-0.5, 0.5, 1001, dtype=torch.float64)
    assert (R.SupRankStep().value(grid)[grid > 0] >= 1).all()


def test_heaviside_has_no_gradient():
    t = torch.randn(5, requires_grad=True)
    assert not R.steps.heaviside(t).requires_grad


@pytest.mark.parametrize("step", [R.SigmoidStep(0.05), R.SupRankStep(tau=0.05), R.SupRankStep(offset=1.44)])
def test_step_derivatives_match_autograd(step):
    t = torch.linspace(-0.6, 0.6, 241, dtype=torch.float64).requires_grad_(True)
    (grad,) = torch.autograd.grad(step.value(t).sum(), t)
    torch.testing.assert_close(step.derivative(t.detach()), grad, atol=1e-10, rtol=0)


def test_step_validation():
    with pytest.raises(ValueError, match="tau"):
        R.SupRankStep(tau=0)
    with pytest.raises(ValueError, match="rho"):
        R.SupRankStep(rho=-1)
    with pytest.raises(TypeError, match="start"):
        R.SupRankStep(start=None)
    with pytest.raises(TypeError, match="offset"):
        R.SupRankStep(offset="1.44")


def _problem(seed=0, b=6, n=40, ties=False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=torch.float64) * 0.1
    if ties:
        scores[0, 3] = scores[0, 5]
        scores[1, 2] = scores[1, 7]
    labels, ref_labels = torch.randint(0, 3, (b,), generator=g), torch.randint(0, 3, (n,), generator=g)
    valid = torch.rand(b, n, generator=g) > 0.2
    pos = valid & (labels[:, None] == ref_labels[None, :])
    q, i = torch.nonzero(pos, as_tuple=True)
    return scores, valid, pos, valid & ~pos, q, i


def _dense_sum(scores, q, i, mask, step, exclude_item=True):
    """``Σ_j m[q_k, j] · step(s_{q_k j} − s_{q_k i_k})`` by plain autograd on the ``(K, N)`` differences."""
    t = scores[q] - scores[q, i].unsqueeze(1)
    m = mask[q].to(scores.dtype)
    if exclude_item:
        m[torch.arange(len(q)), i] = 0
    return (step.value(t) * m).sum(1)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize(
    "step", [R.SupRankStep(), R.SupRankStep(offset=1.44), R.SupRankStep(start=0.0, offset=1.0), R.SupRankStep(tau=0.05)]
)
def test_fast_suprank_kernel_matches_general_kernel(step, ties):
    scores, _, _, neg, q, i = _problem(ties=ties)
    scores.requires_grad_(True)
    w = torch.rand(len(q), dtype=torch.float64)
    a = _dense_sum(scores, q, i, neg, step, exclude_item=False)
    b = R.flat.suprank_negative_sum(scores, q, i, neg, step, chunk_elements=50)
    torch.testing.assert_close(b, a, atol=1e-12, rtol=0)
    (ga,) = torch.autograd.grad((a * w).sum(), scores)
    (gb,) = torch.autograd.grad((b * w).sum(), scores)
    torch.testing.assert_close(gb, ga, atol=1e-10, rtol=0)


@pytest.mark.parametrize("ties", [False, True])
def test_fast_heaviside_and_sigmoid_kernels(ties):
    scores, valid, pos, _, q, i = _problem(ties=ties)
    got = R.flat.heaviside_positive_count(scores, q, i)
    torch.testing.assert_close(got, _dense_sum(scores, q, i, pos, R.HeavisideStep()), atol=0, rtol=0)
    scores.requires_grad_(True)
    step = R.SigmoidStep(0.05)
    a1, a2 = _dense_sum(scores, q, i, pos, step), _dense_sum(scores, q, i, valid, step)
    b1, b2 = R.flat.sigmoid_rank_sums(scores, q, i, valid, 0.05, chunk_elements=30)
    torch.testing.assert_close(b1, a1, atol=1e-12, rtol=0)
    torch.testing.assert_close(b2, a2, atol=1e-12, rtol=0)
    (ga,) = torch.autograd.grad((2 * a1 + 3 * a2).sum(), scores)
    (gb,) = torch.autograd.grad((2 * b1 + 3 * b2).sum(), scores)
    torch.testing.assert_close(gb, ga, atol=1e-10, rtol=0)


def test_fast_kernels_gradcheck():
    scores, valid, pos, neg, q, i = _problem(b=3, n=10)
    scores.requires_grad_(True)
    f = lambda s: R.flat.suprank_negative_sum(s, q, i, neg, R.SupRankStep(tau=0.05), chunk_elements=7)  # noqa: E731
    assert torch.autograd.gradcheck(f, (scores,))
    g = lambda s: R.flat.sigmoid_rank_sums(s, q, i, valid, 0.05, chunk_elements=7)  # noqa: E731
    assert torch.autograd.gradcheck(g, (scores,))


def test_count_above_matches_brute_force():
    scores, _, _, neg, q, i = _problem()
    masked = scores.masked_fill(~neg, float("-inf")).requires_grad_(True)
    thr = scores[q, i] + 0.05
    count, total = R.flat.count_above(masked, q, thr, with_sum=True)
    for k in range(len(q)):
        sel = neg[q[k]] & (scores[q[k]] > thr[k])
        assert count[k].item() == sel.sum().item()
        assert total[k].item() == pytest.approx(scores[q[k]][sel].sum().item(), abs=1e-12)
    total.sum().backward()
    assert torch.isfinite(masked.grad).all() and (masked.grad[~neg] == 0).all()


def test_fast_kernels_require_pairs_grouped_by_query():
    scores, _, _, neg, q, i = _problem()
    with pytest.raises(ValueError, match="grouped"):
        R.flat.suprank_negative_sum(scores, q.flip(0), i.flip(0), neg, R.SupRankStep())


def test_package_layout_and_one_chunk_constant():
    """The package lists the kernel choice and the steps; the kernels are the expert API of their modules; one chunk
    size serves the flat and hierarchical kernels."""
    from pml_suprank.ranking import dense, flat, steps, window

    for name in ("HeavisideStep", "SigmoidStep", "SupRankStep", "choose_kernel", "CHUNK_SIZE"):
        assert name in R.__all__ and getattr(R, name) is not None
    for name in ("dense_query_ranks", "suprank_negative_sum", "count_above", "default_offset"):
        assert name not in R.__all__ and not hasattr(R, name), name
    assert R.SupRankStep is steps.SupRankStep and callable(flat.suprank_negative_sum)
    assert callable(dense.dense_query_ranks) and callable(steps.default_offset)
    assert R.CHUNK_SIZE == window.CHUNK_SIZE and not hasattr(R, "DEFAULT_CHUNK_ELEMENTS")


@pytest.mark.parametrize("ties", [False, True])
def test_flat_kernels_bit_identical_across_chunk_sizes(ties):
    """Chunking only bounds memory: values and gradients are bit-identical for any chunk size."""
    scores, valid, pos, neg, q, i = _problem(ties=ties)
    w = torch.rand(len(q), dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    results = []
    for chunk in (7, 100, R.CHUNK_SIZE):
        s = scores.clone().requires_grad_(True)
        a = R.flat.suprank_negative_sum(s, q, i, neg, R.SupRankStep(), chunk_elements=chunk)
        b1, b2 = R.flat.sigmoid_rank_sums(s, q, i, valid, 0.05, chunk_elements=chunk)
        out = torch.stack([a, b1, b2])
        (grad,) = torch.autograd.grad((out * w).sum(), s)
        results.append((out, grad))
    for out, grad in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(grad, results[0][1])


def test_hrank_params_value():
    from _hierarchical_dense import h_s_greater

    t = torch.linspace(-0.3, 0.3, 121, dtype=torch.float64)
    hp = R.steps.HRankParams(nu=20.0, mu=0.4, gamma=5.0)
    torch.testing.assert_close(hp.value(t), h_s_greater(t, 20.0, 0.4, 5.0), rtol=0, atol=0)
    assert hp.saturation == pytest.approx(0.03)
    assert float(hp.value(torch.tensor(hp.saturation, dtype=torch.float64))) == pytest.approx(1.0)
