"""Tests for the residual EBM: MLP facts, SGLD schedule and invariants, contrastive-divergence loss (golden + hand)."""

from __future__ import annotations

import pytest
import torch

from pml_suprank.ood import ResidualEnergyMLP, contrastive_divergence_loss, polynomial_schedule, sgld_sample
from pml_suprank.ood.ebm import project, train_residual


@pytest.mark.parametrize("name", ["cifar10_gmm", "cifar100_gmm", "thesis_text"])
def test_schedule_matches_golden(heat_golden, name):
    ref = heat_golden["heat_reference"]["sgld_schedules_polynomial_power2"][name]
    steps = ref["steps"]
    step0, noise0 = ref["step_size"][0], ref["noise_std"][0]
    ours_step = [polynomial_schedule(t, steps, step0, 0.1 * step0) for t in range(steps)]
    ours_noise = [polynomial_schedule(t, steps, noise0, 0.1 * noise0) for t in range(steps)]
    assert ours_step == pytest.approx(ref["step_size"], rel=1e-12)
    assert ours_noise == pytest.approx(ref["noise_std"], rel=1e-12)
    # the released schedule: starts at start, strictly decreasing, never reaches end
    assert ours_step[0] == step0
    assert all(a > b for a, b in zip(ours_step, ours_step[1:]))
    assert min(ours_step) > 0.1 * step0


def test_mlp_facts_match_reference(heat_golden):
    facts = heat_golden["heat_reference"]["mlp_facts_cifar"]
    tied = ResidualEnergyMLP(512, 1024, 4, tie_hidden_weights=True)
    assert sum(p.numel() for p in tied.parameters()) == facts["n_parameters"] == 1_575_937
    assert len(tied.linear_layers()) == facts["n_distinct_linear_modules"]
    untied = ResidualEnergyMLP(512, 1024, 4)
    assert sum(p.numel() for p in untied.parameters()) == 4_724_737
    assert 2 + untied.n_hidden_layers == facts["n_linear_applications"]
    assert abs(untied.act.negative_slope - 0.2) < 1e-12


def test_mlp_init_is_seeded_and_does_not_touch_global_rng():
    state = torch.random.get_rng_state()
    a = ResidualEnergyMLP(5, 8, 2, generator=torch.Generator().manual_seed(3))
    b = ResidualEnergyMLP(5, 8, 2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.random.get_rng_state(), state)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
        assert pa.abs().max() <= 1 / pa.shape[-1] ** 0.5 if pa.dim() == 2 else True


def test_zero_output_gives_zero_residual():
    mlp = ResidualEnergyMLP(4, 8, 2).zero_output_()
    assert torch.equal(mlp(torch.rand(6, 4)), torch.zeros(6))


@pytest.mark.parametrize("l2_coef", [10, 0.1])
def test_cd_loss_matches_golden(heat_golden, l2_coef):
    ref = heat_golden["heat_reference"][f"cd_loss_example_l2coef={l2_coef}"]
    e_real = torch.tensor(ref["real_z"]).sum(-1)  # E_nn(z) = Σz
    e_neg = torch.tensor(ref["gen_z_used"]).sum(-1)
    loss, cd, control = contrastive_divergence_loss(e_real, e_neg, float(l2_coef))
    assert float(loss) == pytest.approx(ref["loss"], rel=1e-6)
    assert float(cd) == pytest.approx(ref["cd_term"], rel=1e-6)
    assert float(control) == pytest.approx(ref["l2_term_times_coef"], rel=1e-6)


def test_cd_loss_hand_and_properties():
    # E ≡ c: L = 2λc², CD term zero
    c, lam = 0.7, 3.0
    loss, cd, _ = contrastive_divergence_loss(torch.full((4,), c), torch.full((8,), c), lam)
    assert float(cd) == pytest.approx(0.0, abs=1e-7) and float(loss) == pytest.approx(2 * lam * c * c)
    # per sample the optimum is E(real) = −1/(2λ), E(neg) = +1/(2λ)
    e_r = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    e_n = torch.tensor([-0.2], dtype=torch.float64, requires_grad=True)
    for _ in range(500):
        g_r, g_n = torch.autograd.grad(contrastive_divergence_loss(e_r, e_n, lam)[0], (e_r, e_n))
        e_r, e_n = (e_r - 0.05 * g_r).detach().requires_grad_(True), (e_n - 0.05 * g_n).detach().requires_grad_(True)
    assert e_r.item() == pytest.approx(-1 / (2 * lam), abs=1e-6)
    assert e_n.item() == pytest.approx(1 / (2 * lam), abs=1e-6)


def test_cd_loss_gradcheck():
    g = torch.Generator().manual_seed(0)
    e_r = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    e_n = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: contrastive_divergence_loss(a, b, 0.5)[0], (e_r, e_n))


def test_sgld_invariants():
    g = torch.Generator().manual_seed(0)
    z0 = torch.randn(16, 6, generator=g)
    mlp = ResidualEnergyMLP(6, 16, 2, generator=torch.Generator().manual_seed(1))
    out = sgld_sample(mlp, z0, steps=5, step_size=0.1, noise_std=0.05, normalize=True, generator=g)
    assert out.shape == (32, 6) and not out.requires_grad
    assert bool((out >= 0).all())
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(32))
    # the second half are the projected starting points
    torch.testing.assert_close(out[16:], project(z0, relu=True, normalize=True))
    # parameters' gradients untouched
    assert all(p.grad is None for p in mlp.parameters())
    # deterministic under a seeded generator
    again = sgld_sample(mlp, z0, 5, 0.1, 0.05, normalize=True, generator=torch.Generator().manual_seed(0))
    first = sgld_sample(mlp, z0, 5, 0.1, 0.05, normalize=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, first)


def test_sgld_without_noise_decreases_energy():
    # zero residual, quadratic prior energy, zero noise, small step: the mean energy does not increase
    def energy(z):
        return ((z - 2.0) ** 2).sum(-1)

    z0 = torch.rand(10, 3, generator=torch.Generator().manual_seed(0))
    out = sgld_sample(energy, z0, steps=10, step_size=0.05, noise_std=0.0, normalize=False)
    assert float(energy(out[:10]).mean()) < float(energy(out[10:]).mean())


def test_train_residual_pushes_real_down_and_negatives_up():
    torch.set_num_threads(1)  # tiny matrices: one thread avoids oversubscription on a shared CPU
    g = torch.Generator().manual_seed(0)
    real = torch.rand(256, 4, generator=g) * 0.2 + 1.0  # a small blob
    mlp = ResidualEnergyMLP(4, 32, 1, generator=torch.Generator().manual_seed(0))

    def proposal(n):
        return torch.rand(n, 4, generator=g) * 3.0

    history = train_residual(
        mlp,
        lambda z: torch.zeros(z.shape[0]),
        proposal,
        real,
        epochs=10,
        batch_size=64,
        lr=1e-3,
        l2_coef=0.5,
        sgld_steps=0,
        step_size=0.0,
        noise_std=0.0,
        milestones=(100,),
        generator=g,
    )
    assert len(history) == 10 and history[-1] < history[0]
    with torch.no_grad():
        assert float(mlp(real).mean()) < float(mlp(proposal(256)).mean())


def test_reduce_width_pyramid_matches_reference_layout():
    mlp = ResidualEnergyMLP(2048, 1024, 6, reduce_width=True)
    layers = mlp.linear_layers()
    assert len(layers) == 20  # released ImageNet MLP: Linear(d, h) + 6 blocks of 3 + Linear(h/64, 1)
    assert (layers[0].in_features, layers[0].out_features) == (2048, 1024)
    assert [(m.in_features, m.out_features) for m in layers[1:4]] == [(1024, 1024), (1024, 1024), (1024, 512)]
    assert [(m.in_features, m.out_features) for m in layers[-4:]] == [(32, 32), (32, 32), (32, 16), (16, 1)]
    assert mlp(torch.rand(3, 2048)).shape == (3,)
    with pytest.raises(ValueError, match="cannot be combined"):
        ResidualEnergyMLP(8, 64, 2, reduce_width=True, tie_hidden_weights=True)
    with pytest.raises(ValueError, match="divisible"):
        ResidualEnergyMLP(8, 100, 3, reduce_width=True)


def test_gradient_accumulation_takes_one_adam_step_on_the_mean_loss():
    g = torch.Generator().manual_seed(0)
    real = torch.rand(64, 3, generator=g)
    fixed_negatives = torch.rand(16, 3, generator=g) + 1.0

    def proposal(n):
        return fixed_negatives[:n]

    def run(accumulation_steps):
        mlp = ResidualEnergyMLP(3, 8, 1, generator=torch.Generator().manual_seed(1))
        before = [p.detach().clone() for p in mlp.parameters()]
        train_residual(
            mlp, lambda z: torch.zeros(z.shape[0]), proposal, real, epochs=1, batch_size=16, lr=1e-3, l2_coef=0.5,
            sgld_steps=0, step_size=0.0, noise_std=0.0, eps_data=0.0, accumulation_steps=accumulation_steps,
            generator=torch.Generator().manual_seed(2),
        )  # fmt: skip
        return mlp, before

    mlp, before = run(4)  # 4 batches, one optimiser step
    # the expected step: Adam's first step with β1 = 0 is −lr·g/(|g| + eps) on the gradient of the mean loss
    ref = ResidualEnergyMLP(3, 8, 1, generator=torch.Generator().manual_seed(1))
    negatives = torch.cat([fixed_negatives, fixed_negatives])  # [z_T; z_0] with 0 SGLD steps
    loss, _, _ = contrastive_divergence_loss(ref(real), ref(negatives), 0.5)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    for p, p0, grad in zip(mlp.parameters(), before, grads):
        torch.testing.assert_close(p.detach() - p0, -1e-3 * grad / (grad.abs() + 1e-8), atol=1e-6, rtol=1e-4)
    mlp, before = run(1)  # four steps: some parameter moves by more than one learning rate
    assert max(float((p.detach() - p0).abs().max()) for p, p0 in zip(mlp.parameters(), before)) > 1.5e-3
    with pytest.raises(ValueError, match="accumulation_steps"):
        run(0)
