"""Benchmark HEAT fit time and scoring throughput on CIFAR-10-sized features (50,000 × 512, 10 classes).

Timings on a shared machine are noisy, so every figure is also printed as a ratio against baselines run in the same
process: the GMM prior fit alone (``ClassConditionalGaussian.fit``) for fit time, and the GMM prior energy / the
Energy (logsumexp) score for scoring throughput.

Presets (see ``pml_suprank.ood.heat.PRESETS``):

* ``fast`` (default, CPU): width-256 MLP, 5 / 1 / 5 SGLD steps (GMM / GMM_std / EL), one epoch, batch 1024.
* ``cifar10``: the paper's settings (width 1024, 40 / 1 / 50 SGLD steps, 20 epochs). Fitting it fully on a CPU takes
  hours, so ``--paper-steps N`` times only N optimisation steps per prior and extrapolates to the full schedule.

Usage::

    python benchmarks/bench_heat.py                      # fast preset on CPU (a few minutes on 2 cores)
    python benchmarks/bench_heat.py --device cuda        # GPU, when available
    python benchmarks/bench_heat.py --paper-steps 3      # also extrapolate the paper preset

Results are printed and written to ``benchmarks/results/bench_heat.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from pml_suprank import ood
from pml_suprank.ood.priors import ClassConditionalGaussian


def make_features(n: int, dim: int, num_classes: int, seed: int, device: torch.device):
    """ReLU features around class centres, std-pooled-like features, logits of a linear head (all seeded)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(num_classes, dim, generator=g) * 2.0
    labels = torch.randint(0, num_classes, (n,), generator=g)
    z = torch.relu(centres[labels] + 0.5 * torch.randn(n, dim, generator=g))
    sigma = torch.relu(0.5 + 0.2 * torch.randn(n, dim, generator=g)) + 0.01
    weight = torch.randn(num_classes, dim, generator=g) / math.sqrt(dim)
    bias = torch.zeros(num_classes)
    logits = z @ weight.T + bias
    put = {"device": device}
    return (
        {
            "features": z.to(**put),
            "std_features": sigma.to(**put),
            "logits": logits.to(**put),
            "labels": labels.to(**put),
        },
        weight.to(**put),
        bias.to(**put),
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int = 1) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best, out


class _Stop(Exception):
    pass


def extrapolate_paper_preset(train, weight, bias, steps: int, device) -> dict[str, dict[str, float]]:
    """Time ``steps`` optimisation steps per prior with the paper preset and extrapolate to its full schedule."""
    out = {}
    n = train["features"].shape[0]
    for prior in ("gmm", "gmm_std", "el"):
        times: list[float] = []

        def callback(name, epoch, step, loss, times=times):
            sync(device)
            times.append(time.perf_counter())
            if len(times) > steps:
                raise _Stop

        heat = ood.HEAT(priors=(prior,), preset="cifar10", weight=weight, bias=bias)
        try:
            heat.fit(**train, callback=callback)
        except _Stop:
            pass
        s = heat.component_settings[prior]
        per_step = (times[-1] - times[0]) / (len(times) - 1)
        total_steps = s["epochs"] * (n // s["batch_size"])
        out[prior] = {"seconds_per_step": per_step, "steps": total_steps, "extrapolated_fit_s": per_step * total_steps}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-train", type=int, default=50_000, help="training features (CIFAR-10: 50,000)")
    parser.add_argument("--n-test", type=int, default=10_000, help="test features to score")
    parser.add_argument("--dim", type=int, default=512, help="feature dimension (ResNet-34: 512)")
    parser.add_argument("--num-classes", type=int, default=10, help="number of classes")
    parser.add_argument("--preset", default="fast", choices=sorted(ood.PRESETS), help="HEAT hyper-parameter preset")
    parser.add_argument("--epochs", type=int, default=None, help="override the preset's epochs")
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda' or 'auto'")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--paper-steps", type=int, default=0, help="also extrapolate the cifar10 preset from N steps")
    parser.add_argument("--seed", type=int, default=0, help="data and HEAT seed")
    parser.add_argument("--output", default="benchmarks/results/bench_heat.json", help="where to write the JSON")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    train, weight, bias = make_features(args.n_train, args.dim, args.num_classes, args.seed, device)
    test, _, _ = make_features(args.n_test, args.dim, args.num_classes, args.seed + 1, device)
    test.pop("labels")
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # one-time lazy imports out of the timings

    results: dict[str, object] = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "n_train": args.n_train,
        "n_test": args.n_test,
        "dim": args.dim,
        "preset": args.preset,
        "torch": torch.__version__,
    }
    # baselines: GMM prior fit, Mahalanobis / KNN fit, prior energy and Energy scoring
    t_gmm_fit, gmm = timed(lambda: ClassConditionalGaussian().fit(train["features"], train["labels"]), device, 3)
    t_gmm_score, _ = timed(lambda: gmm.neg_log_likelihood(test["features"]), device, 3)
    t_energy, _ = timed(lambda: ood.Energy().score(logits=test["logits"]), device, 3)

    settings = {} if args.epochs is None else {"epochs": args.epochs}
    heat = ood.HEAT(preset=args.preset, settings=settings, weight=weight, bias=bias, seed=args.seed)
    t_heat_fit, _ = timed(lambda: heat.fit(**train), device)
    t_heat_score, _ = timed(lambda: heat.score(**test), device, 3)
    per_prior = dict(heat.fit_seconds)

    results.update(
        {
            "gmm_prior_fit_s": t_gmm_fit,
            "heat_fit_s": t_heat_fit,
            "heat_fit_per_prior_s": per_prior,
            "heat_fit_over_gmm_fit": t_heat_fit / t_gmm_fit,
            "gmm_prior_score_samples_per_s": args.n_test / t_gmm_score,
            "energy_score_samples_per_s": args.n_test / t_energy,
            "heat_score_samples_per_s": args.n_test / t_heat_score,
            "heat_score_time_over_gmm_score_time": t_heat_score / t_gmm_score,
            "heat_score_time_over_energy_score_time": t_heat_score / t_energy,
            "heat_settings": heat.component_settings,
        }
    )
    print(f"device={device} threads={torch.get_num_threads()} train={args.n_train}x{args.dim} test={args.n_test}")
    print(f"GMM prior fit                 {t_gmm_fit:9.3f} s")
    print(f"HEAT fit ({args.preset:8s})          {t_heat_fit:9.3f} s   = {t_heat_fit / t_gmm_fit:8.1f} x GMM prior fit")
    for name, t in per_prior.items():
        print(f"  one prior {name:8s}          {t:9.3f} s   = {t / t_gmm_fit:8.1f} x GMM prior fit")
    print(f"GMM prior energy scoring      {args.n_test / t_gmm_score:12,.0f} samples/s")
    print(f"Energy (logsumexp) scoring    {args.n_test / t_energy:12,.0f} samples/s")
    print(
        f"HEAT scoring (3 priors)       {args.n_test / t_heat_score:12,.0f} samples/s"
        f"   = {t_heat_score / t_gmm_score:.2f} x GMM-prior scoring time"
    )
    if args.paper_steps:
        paper = extrapolate_paper_preset(train, weight, bias, args.paper_steps, device)
        results["paper_preset_extrapolation"] = paper
        total = sum(p["extrapolated_fit_s"] for p in paper.values())
        results["paper_preset_extrapolated_fit_s"] = total
        for name, p in paper.items():
            print(
                f"paper preset {name:8s} {p['seconds_per_step']:.3f} s/step x {p['steps']} steps"
                f" = {p['extrapolated_fit_s'] / 60:.1f} min (extrapolated)"
            )
        print(f"paper preset total (extrapolated) {total / 60:.1f} min = {total / t_gmm_fit:,.0f} x GMM prior fit")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
