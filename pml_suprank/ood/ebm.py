"""HEAT's residual energy-based model (thesis ch. 5, Sec. 5.2.1, Eqs. 5.1-5.6, Algorithm 2): the MLP ``E_θ``, SGLD
sampling from the hybrid model ``E_h(z) = E_θ(z)/T_nn + E_prior(z)/T_k`` (Eq. 5.2) and contrastive divergence (Eq. 5.3)
against its samples plus the control term ``λ·(E[E_θ(real)²] + E[E_θ(neg)²])`` (Eq. 5.5).

Where the thesis text and the released code differ, the code is followed:

* SGLD: ``z ← z − η_t ∇E_h(z) − σ_t ξ`` with **decoupled** step size and noise (not Eq. 5.4's ``η/2`` / ``√η``), both
  on the quadratic schedule ``(a − b)(1 − t/T)² + b``, ``b = 0.1·a``, each step followed by ReLU, then L2
  normalisation for priors on normalised features.
* Negatives are ``[z_T; z_0]``: the chain ends **and** their (projected) starting points.
* The control term is evaluated on real and negative sets separately and summed; input noise ``eps_data`` is added
  to both inside the loss only.
* Hidden layers are **untied** by default (``tie_hidden_weights=True``: the reference's one shared ``nn.Linear``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.utils import skip_init

from .._validation import check_positive, check_positive_int

__all__ = ["ResidualEnergyMLP", "contrastive_divergence_loss", "polynomial_schedule", "sgld_sample", "train_residual"]

#: bounds of the residual MLP checked before any weight is allocated: width, hidden layers, parameters (2**30 = 4 GiB)
MAX_HIDDEN_DIM = 65_536
MAX_HIDDEN_LAYERS = 64
MAX_MLP_PARAMETERS = 2**30


def _hidden_shapes(hidden_dim: int, n_hidden_layers: int, tie: bool, reduce_width: bool):
    """``([(in, out) of each hidden nn.Linear], width of the last hidden activation)``."""
    if reduce_width:
        shapes = []
        for i in range(n_hidden_layers):
            w = hidden_dim // 2**i
            shapes += [(w, w), (w, w), (w, w // 2)]
        return shapes, hidden_dim // 2**n_hidden_layers
    n_modules = min(n_hidden_layers, 1) if tie else n_hidden_layers
    return [(hidden_dim, hidden_dim)] * n_modules, hidden_dim


def mlp_parameter_count(
    input_dim: int, hidden_dim: int, n_hidden_layers: int, tie_hidden_weights: bool = False, reduce_width: bool = False
) -> int:
    """Parameters (weights and biases) of :class:`ResidualEnergyMLP` with these sizes, without building it."""
    shapes, last = _hidden_shapes(hidden_dim, n_hidden_layers, tie_hidden_weights, reduce_width)
    return (input_dim + 1) * hidden_dim + sum((a + 1) * b for a, b in shapes) + last + 1


class ResidualEnergyMLP(nn.Module):
    """Residual energy ``E_θ``: ``Linear(d,h) → LReLU → [Linear(h,h) → LReLU] × n → Linear(h,1)``, divided by ``T_nn``.

    Args:
        input_dim: Feature dimension ``d``.
        hidden_dim: Width ``h`` (1024 in the paper), at most :data:`MAX_HIDDEN_DIM`.
        n_hidden_layers: Number ``n`` of hidden ``h × h`` layers (4), at most :data:`MAX_HIDDEN_LAYERS`; at most
            :data:`MAX_MLP_PARAMETERS` parameters in all.
        negative_slope: LeakyReLU slope (0.2).
        tie_hidden_weights: Reuse one ``h × h`` layer ``n`` times, as the reference code does.
        reduce_width: The reference's ImageNet pyramid instead: ``Linear(d, h)``, ``n`` blocks ``[Linear(h/2^i,
            h/2^i), Linear(h/2^i, h/2^i), Linear(h/2^i, h/2^(i+1))]``, ``Linear(h/2^n, 1)``.
        temperature: ``T_nn`` (1 in every reference config).
        generator: Generator of the initialisation (default: a fresh one seeded with 0); ``device="meta"`` builds
            the shapes only.
    """

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int = 1024,
        n_hidden_layers: int = 4,
        negative_slope: float = 0.2,
        tie_hidden_weights: bool = False,
        reduce_width: bool = False,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("input_dim", input_dim)
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("n_hidden_layers", n_hidden_layers, minimum=0)
        if hidden_dim > MAX_HIDDEN_DIM or n_hidden_layers > MAX_HIDDEN_LAYERS:
            raise ValueError(
                f"hidden_dim must be <= {MAX_HIDDEN_DIM} and n_hidden_layers <= {MAX_HIDDEN_LAYERS}; got "
                f"hidden_dim={hidden_dim}, n_hidden_layers={n_hidden_layers}"
            )
        self.temperature = check_positive("temperature", temperature)
        self.tie_hidden_weights = bool(tie_hidden_weights)
        self.reduce_width = bool(reduce_width)
        if self.reduce_width and self.tie_hidden_weights:
            raise ValueError("reduce_width and tie_hidden_weights cannot be combined (the pyramid has no shared layer)")
        if self.reduce_width and hidden_dim % (2**n_hidden_layers) != 0:
            raise ValueError(f"reduce_width needs hidden_dim divisible by 2**n_hidden_layers; got {hidden_dim}")
        count = mlp_parameter_count(input_dim, hidden_dim, n_hidden_layers, tie_hidden_weights, reduce_width)
        if count > MAX_MLP_PARAMETERS:
            raise ValueError(
                f"the residual MLP would hold {count:,} parameters (input_dim={input_dim}, hidden_dim={hidden_dim}, "
                f"n_hidden_layers={n_hidden_layers}), more than {MAX_MLP_PARAMETERS:,}: lower hidden_dim or "
                "n_hidden_layers"
            )
        # skip_init: nn.Linear's own init would draw from the global RNG; reset_parameters uses `generator`
        dd = {"device": "cpu" if device is None else device, "dtype": dtype}
        self.input_layer = skip_init(nn.Linear, input_dim, hidden_dim, **dd)
        shapes, last = _hidden_shapes(hidden_dim, n_hidden_layers, self.tie_hidden_weights, self.reduce_width)
        self.hidden = nn.ModuleList(skip_init(nn.Linear, a, b, **dd) for a, b in shapes)
        self.n_hidden_layers = n_hidden_layers
        self.output_layer = skip_init(nn.Linear, last, 1, **dd)
        self.act = nn.LeakyReLU(negative_slope)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """``nn.Linear``'s default init (weights and biases ~ U(±1/√fan_in)) drawn from ``generator``."""
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        for layer in self.linear_layers():
            if layer.weight.is_meta:  # shapes only (e.g. checking a saved HEAT before allocating it)
                continue
            bound = 1.0 / math.sqrt(layer.in_features)
            for p in (layer.weight, layer.bias):
                values = torch.rand(p.shape, generator=generator, device=generator.device, dtype=torch.float32)
                p.copy_((values * 2.0 - 1.0) * bound)

    def linear_layers(self) -> list[nn.Linear]:
        return [self.input_layer, *self.hidden, self.output_layer]

    @torch.no_grad()
    def zero_output_(self) -> ResidualEnergyMLP:
        """Set the last layer to zero, so ``E_θ ≡ 0`` and the hybrid energy equals the prior."""
        self.output_layer.weight.zero_()
        self.output_layer.bias.zero_()
        return self

    def forward(self, z: Tensor) -> Tensor:
        """``(N, d) -> (N,)`` residual energies."""
        h = self.act(self.input_layer(z))
        for layer in list(self.hidden) * self.n_hidden_layers if self.tie_hidden_weights else self.hidden:
            h = self.act(layer(h))
        return self.output_layer(h).reshape(-1) / self.temperature


def polynomial_schedule(t: int, total: int, start: float, end: float) -> float:
    """Reference SGLD schedule ``(start − end)·(1 − t/total)² + end`` for ``t = 0..total−1``."""
    return (start - end) * (1.0 - t / total) ** 2 + end


def project(z: Tensor, relu: bool = True, normalize: bool = False) -> Tensor:
    """SGLD states projected: ReLU (features of a ReLU network are ≥ 0), then L2 normalisation (``normalize``)."""
    if relu:
        z = torch.relu(z)
    if normalize:
        z = nn.functional.normalize(z, dim=-1, eps=1e-12)
    return z


def sgld_sample(
    energy_fn: Callable[[Tensor], Tensor],
    z0: Tensor,
    steps: int,
    step_size: float,
    noise_std: float,
    step_size_end: float | None = None,
    noise_std_end: float | None = None,
    relu: bool = True,
    normalize: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Short-run SGLD (Eq. 5.4, decoupled as the reference) from ``z0`` ``(B, D)`` along the input gradient of
    ``energy_fn`` ``(B, D) -> (B,)``, the schedules going from ``step_size`` / ``noise_std`` to ``*_end`` (default
    ``0.1 ×`` start). Returns ``(2B, D)`` detached ``[z_T; z_0]`` (``steps = 0``: the projected start twice)."""
    step_size_end = 0.1 * step_size if step_size_end is None else step_size_end
    noise_std_end = 0.1 * noise_std if noise_std_end is None else noise_std_end
    start = project(z0.detach(), relu, normalize)
    z = start
    for t in range(steps):
        eta = polynomial_schedule(t, steps, step_size, step_size_end)
        sigma = polynomial_schedule(t, steps, noise_std, noise_std_end)
        with torch.enable_grad():
            z_req = z.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(energy_fn(z_req).sum(), z_req)
        noise = torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
        z = project(z - eta * grad - sigma * noise, relu, normalize)
    return torch.cat([z.detach(), start])


def contrastive_divergence_loss(
    energy_real: Tensor, energy_negative: Tensor, l2_coef: float
) -> tuple[Tensor, Tensor, Tensor]:
    """HEAT loss (Eqs. 5.3, 5.5, 5.6): ``mean E_θ(real) − mean E_θ(neg) + λ(mean E_θ(real)² + mean E_θ(neg)²)``
    of ``energy_real`` ``(B,)`` and ``energy_negative`` ``(M,)``; returns 0-dim ``(loss, cd_term, λ·control_term)``.
    """
    cd = energy_real.mean() - energy_negative.mean()
    control = l2_coef * (energy_real.pow(2).mean() + energy_negative.pow(2).mean())
    return cd + control, cd, control


def train_residual(
    mlp: ResidualEnergyMLP,
    prior_energy: Callable[[Tensor], Tensor],
    proposal: Callable[[int], Tensor],
    features: Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    l2_coef: float,
    sgld_steps: int,
    step_size: float,
    noise_std: float,
    end_factor: float = 0.1,
    eps_data: float = 1e-4,
    betas: tuple[float, float] = (0.0, 0.999),
    milestones: tuple[int, ...] = (10,),
    gamma: float = 0.1,
    normalize: bool = False,
    accumulation_steps: int = 1,
    generator: torch.Generator | None = None,
    callback: Callable[[int, int, float], None] | None = None,
) -> list[float]:
    """Train ``mlp`` in place by contrastive divergence with SGLD negatives (Algorithm 2, Eqs. 5.3-5.5): Adam
    (``betas=(0, 0.999)``), one step per shuffled batch (``drop_last`` unless the set is smaller than a batch) or per
    ``accumulation_steps`` batches (the reference's ``accum_iter``), ``MultiStepLR(milestones, gamma)`` per epoch.

    ``prior_energy`` ``(B, D) -> (B,)`` is ``E_prior/T_k``; ``proposal`` ``n -> (n, D)`` gives SGLD starting points;
    ``features`` ``(N, D)`` are L2-normalised when ``normalize``; the hyper-parameters are those of ``ood.PRESETS``;
    ``generator`` drives shuffling, SGLD and input noise; ``callback(epoch, batch, loss)`` runs after every batch.
    Returns the mean training loss per epoch.
    """
    if epochs == 0:
        mlp.eval()
        return []
    check_positive_int("accumulation_steps", accumulation_steps)
    n = features.shape[0]
    batch_size = min(batch_size, n)
    optimizer = torch.optim.Adam(mlp.parameters(), lr=lr, betas=betas)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(milestones), gamma=gamma)
    gen_device = generator.device if generator is not None else torch.device("cpu")

    def hybrid(z: Tensor) -> Tensor:
        return mlp(z) + prior_energy(z)

    history = []
    for epoch in range(epochs):
        order = torch.randperm(n, generator=generator, device=gen_device).to(features.device)
        losses = []
        starts = range(0, n - batch_size + 1, batch_size)
        optimizer.zero_grad(set_to_none=True)
        for step, start in enumerate(starts):
            real = features[order[start : start + batch_size]]
            mlp.eval()
            negatives = sgld_sample(
                hybrid,
                proposal(real.shape[0]),
                sgld_steps,
                step_size,
                noise_std,
                end_factor * step_size,
                end_factor * noise_std,
                relu=True,
                normalize=normalize,
                generator=generator,
            )
            mlp.train()
            noise_r = torch.randn(real.shape, generator=generator, device=gen_device, dtype=real.dtype)
            noise_g = torch.randn(negatives.shape, generator=generator, device=gen_device, dtype=real.dtype)
            e_real = mlp(real + eps_data * noise_r.to(real.device))
            e_neg = mlp(negatives + eps_data * noise_g.to(real.device))
            loss, _, _ = contrastive_divergence_loss(e_real, e_neg, l2_coef)
            group = min(accumulation_steps, len(starts) - (step // accumulation_steps) * accumulation_steps)
            (loss / group).backward()
            if (step + 1) % accumulation_steps == 0 or step + 1 == len(starts):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if callback is not None:
                callback(epoch, step, losses[-1])
        scheduler.step()
        history.append(sum(losses) / max(len(losses), 1))
    mlp.eval()
    return history
