"""Fit HEAT and the OOD baselines on the features of a timm classifier, and report FPR95 / AUROC per OOD set.

With no arguments the recipe runs offline on the built-in SyntheticShapes: four shape families are
in-distribution (ID), a small timm ResNet is trained on the spot to classify them, and the OOD sets are the two
held-out families (near-OOD) plus uniform-noise and blob images (far-OOD). It then

1. extracts avg-pooled ``z``, std-pooled ``σ`` and logits of the last feature map (``pml_suprank.ood.features``),
2. fits HEAT (GMM + GMM_std + EL, composed with β; Lafon et al., ICML 2023) and every registered baseline
   (``ood.list_detectors()``: MSP, MaxLogit, Energy, ODIN, Mahalanobis, KNN, ViM, DICE, ReAct) plus SSD+ on the ID
   training features,
3. prints FPR95 / AUROC per OOD set and their average (like thesis Table 5.5), saves score histograms, a JSON of all
   metrics and the fitted HEAT detector (``save_pretrained`` folder; ``--push_to_hub true --hub_model_id ID``
   uploads it), and the extracted features (``features.safetensors``, read by ``pml_suprank.recipes.ood_benchmark``).

The no-argument run takes about a minute on an idle 2-core CPU and a few minutes on a busy one; progress bars show
the classifier training, the feature extraction and every HEAT prior's residual training. Any timm backbone and any
dataset the package can load work through flags, e.g.::

    python -m pml_suprank.recipes.fit_heat --backbone resnet18 --pretrained true --id_dataset uoft-cs/cifar10 \
        --label_column label --ood_datasets uoft-cs/cifar100:test:fine_label tanganke/svhn:test:label \
        --image_size 32 --train_epochs 5

Hub ids and local folders go through ``pml_suprank.data.load_retrieval_dataset`` (``SOURCE[:SPLIT[:LABEL]]``, the
label column only satisfies the loader; OOD labels are not used); the special names ``synthetic-heldout``,
``noise-uniform``, ``noise-gaussian`` and ``noise-blobs`` are built in. Nothing is downloaded unless a Hub id or
``--pretrained true`` is given.

Paper-scale settings: ``--config heat_cifar10_resnet34`` (CIFAR-10, ResNet-34, preset ``cifar10``:
width-1024 MLPs, 40 / 1 / 50 SGLD steps, 20 epochs) or ``heat_imagenet_resnet50.yaml``; they are GPU settings (the
CIFAR-10 preset, extrapolated from timed steps, takes hours on a CPU). The no-argument default is the ``fast``
preset (width 256, at most 5 SGLD steps) for 30 epochs of batch 128 on about 500 synthetic features.

Detector options are generated from the detector registry: every registered detector's constructor argument with a
plain default becomes ``--<detector>_<argument>`` (``--knn_k``, ``--vim_dim``, ``--dice_p``, ``--react_percentile``,
``--odin_temperature``, ...), so a new detector module needs no edit here.
"""

from __future__ import annotations

import os

# OpenMP threads that spin while waiting make a busy or shared CPU dramatically slower; sleeping waits cost nothing
# when the CPU is idle. Must be set before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from pml_suprank import ood  # noqa: E402
from pml_suprank.ood import metrics as ood_metrics  # noqa: E402
from pml_suprank.ood.recipe_data import (  # noqa: E402
    BUILTIN_OOD,
    build_datasets,
    build_model,
    class_targets,
    image_transform,
    loader,
    progress,
    save_histograms,
    train_classifier,
)
from pml_suprank.training.cli import str2bool  # noqa: E402  (the training recipes' boolean flags)

#: Table rows that are a registered detector with other constructor arguments: name -> (detector, kwargs).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {"SSD+": ("Mahalanobis", {"normalize": True})}
#: Constructor arguments the recipe fills itself (the classifier head, the network).
CONTEXT_ARGUMENTS = ("weight", "bias", "head", "model")
#: Recipe defaults that differ from the class defaults: HEAT's evaluation code clips ReAct at the 95th percentile;
#: ViM's principal dimension None means min(256, D // 2, (N - 1) // 2), known only after extraction.
RECIPE_DEFAULTS: dict[str, Any] = {"react_percentile": 95.0, "vim_dim": None}


def methods() -> tuple[str, ...]:
    """Table rows: every registered detector but HEAT (registration order), each followed by its variants; HEAT."""
    names: list[str] = []
    for name in ood.list_detectors():
        if name != "HEAT":
            names += [name, *(v for v, (base, _) in VARIANTS.items() if base == name)]
    return (*names, "HEAT")


METHODS = methods()


def _flag_prefix(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def detector_options(name: str) -> dict[str, inspect.Parameter]:
    """Constructor arguments of a registered detector that get a flag: plain (bool / int / float / str) defaults."""
    params = inspect.signature(ood.get_detector(name)).parameters.values()
    return {
        p.name: p
        for p in params
        if p.name not in CONTEXT_ARGUMENTS
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and isinstance(p.default, (bool, int, float, str))
    }


def _argument_help(cls: type, argument: str) -> str:
    match = re.search(rf"^\s+{re.escape(argument)}: (.+)$", inspect.getdoc(cls) or "", flags=re.MULTILINE)
    text = match.group(1) if match else f"constructor argument {argument}"
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"\1", text).replace("``", "").replace("**", "")
    return f"{cls.__name__}: {text}"


def add_detector_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--<detector>_<argument>`` flag per plain constructor argument of every registered baseline."""
    g = parser.add_argument_group("baselines (generated from ood.list_detectors())")
    g.add_argument(
        "--detectors", nargs="+", default=None, help=f"table rows to compute (default: all of {list(METHODS)})"
    )
    g.add_argument("--no_odin", action="store_true", help="skip ODIN (needs a backward pass per batch)")
    for name in ood.list_detectors():
        if name == "HEAT":
            continue
        cls = ood.get_detector(name)
        for argument, param in detector_options(name).items():
            dest = f"{_flag_prefix(name)}_{argument}"
            kind = str2bool if isinstance(param.default, bool) else type(param.default)
            extra = {"nargs": "?", "const": True} if kind is str2bool else {}
            default = RECIPE_DEFAULTS.get(dest, param.default)
            g.add_argument(f"--{dest}", type=kind, default=default, help=_argument_help(cls, argument), **extra)


def _bool_flag(group, flag: str, help: str, default: bool = False) -> None:
    group.add_argument(flag, type=str2bool, nargs="?", const=True, default=default, help=help + " (true/false)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Fit HEAT + OOD baselines on a timm classifier's features (see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("run")
    g.add_argument(
        "--config", default=None, help="a bundled config name (e.g. heat_cifar10_resnet34) or a YAML file; flags win"
    )
    g.add_argument("--output_dir", default="outputs/fit_heat", help="where to write results, plots and the detector")
    _bool_flag(g, "--push_to_hub", "upload the fitted HEAT detector to the Hub (needs --hub_model_id)")
    g.add_argument("--hub_model_id", default=None, help="Hub repo id for --push_to_hub, e.g. user/heat-cifar10")
    _bool_flag(g, "--hub_private", "create the Hub repo as private")
    g.add_argument("--device", default="cpu", help="'cpu', 'cuda', ...")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (None: torch's choice)")
    g.add_argument("--seed", type=int, default=0, help="seed for data, training and HEAT")
    g.add_argument("--no_plots", action="store_true", help="do not write histograms")
    _bool_flag(g, "--progress", "show progress bars (stderr)", default=True)

    g = p.add_argument_group("model")
    g.add_argument("--backbone", default="test_resnet", help="timm model name (test_resnet: a tiny timm ResNet)")
    _bool_flag(g, "--pretrained", "load timm's pretrained weights (downloads)")
    g.add_argument("--checkpoint", default=None, help="state dict (.pt / .safetensors) to load into the timm model")
    _bool_flag(g, "--cifar_stem", "ResNet with a 3x3 stride-1 stem and no max-pool")
    g.add_argument(
        "--output_stride",
        type=int,
        default=None,
        choices=(8, 16, 32),
        help="timm output_stride (None: 8 on synthetic, else 32)",
    )
    g.add_argument(
        "--train_epochs", type=int, default=None, help="train the classifier first (None: 10 on synthetic, else 0)"
    )
    g.add_argument("--lr", type=float, default=5e-3, help="classifier learning rate (AdamW, one-cycle)")
    g.add_argument("--batch_size", type=int, default=64, help="batch size for training and feature extraction")

    g = p.add_argument_group("data")
    g.add_argument("--id_dataset", default="synthetic", help="'synthetic', a Hub dataset id or a local folder")
    g.add_argument(
        "--label_column", default=None, help="class label column (None: coarse_label on synthetic, else label)"
    )
    g.add_argument("--id_train_split", default="train", help="split of the ID dataset used to fit the detectors")
    g.add_argument("--id_test_split", default="test", help="split of the ID dataset used as ID test set")
    g.add_argument(
        "--ood_datasets",
        nargs="+",
        default=["synthetic-heldout", "noise-uniform", "noise-blobs"],
        help=f"OOD sets: built-in {BUILTIN_OOD} or SOURCE[:SPLIT[:LABEL_COLUMN]] (Hub id / local folder)",
    )
    g.add_argument("--ood_label_column", default="label", help="default label column of Hub / folder OOD sets (unused)")
    g.add_argument("--cache_dir", default=None, help="datasets cache folder for Hub / folder datasets")
    g.add_argument("--image_size", type=int, default=None, help="image side (None: 32 on synthetic, else the model's)")
    g.add_argument("--num_per_class", type=int, default=40, help="synthetic: training images per fine class")
    g.add_argument("--num_test_per_class", type=int, default=12, help="synthetic: test images per fine class")
    g.add_argument("--num_noise", type=int, default=200, help="images per built-in noise OOD set")
    g.add_argument("--max_samples", type=int, default=None, help="cap every split at this many images")

    g = p.add_argument_group("HEAT (Lafon et al., ICML 2023)")
    g.add_argument("--preset", default="fast", choices=sorted(ood.PRESETS), help="HEAT hyper-parameter preset")
    g.add_argument("--heat_epochs", type=int, default=None, help="override the preset's epochs (None: 30 on synthetic)")
    g.add_argument(
        "--heat_batch_size", type=int, default=None, help="override the preset's batch (None: 128 on synthetic)"
    )
    g.add_argument("--beta", type=float, default=0.0, help="HEAT composition β (0 = sum, -1, 1, inf, -inf)")
    g.add_argument(
        "--priors", nargs="+", default=["gmm", "gmm_std", "el"], choices=ood.list_priors(), help="HEAT priors"
    )
    _bool_flag(g, "--tie_hidden_weights", "share HEAT's hidden layer (the authors' released MLP)")
    g.add_argument(
        "--convention",
        default="id_positive",
        choices=["id_positive", "ood_positive", "id_positive_roc"],
        help="FPR95 convention: id_positive (thesis / HEAT) or ood_positive (OpenOOD v1.5)",
    )
    add_detector_arguments(p)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse flags; a ``--config`` YAML's ``recipe`` / ``heat`` sections become defaults that flags override."""
    p = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    heat_settings: dict[str, Any] = {}
    if known.config:
        from pml_suprank._safe_yaml import load_yaml
        from pml_suprank.hub_config import hub_config_path

        try:
            cfg = load_yaml(hub_config_path(known.config)) or {}  # aliases / deep nesting / huge files refused
        except (FileNotFoundError, ValueError) as e:
            p.error(f"--config: {e}")
        if not isinstance(cfg, dict):
            p.error(f"--config: {known.config} must hold a mapping of sections; got {type(cfg).__name__}")
        heat = dict(cfg.get("heat") or {})
        heat_settings = heat.pop("settings", None) or {}
        valid = {a.dest for a in p._actions}
        options = {key.replace("-", "_"): value for key, value in [*(cfg.get("recipe") or {}).items(), *heat.items()]}
        unknown = sorted(set(options) - valid)
        if unknown:
            p.error(f"unknown key(s) {unknown} in {known.config} (recipe / heat sections)")
        p.set_defaults(**options)
    args = p.parse_args(argv)
    args.heat_settings = heat_settings
    if args.push_to_hub and not args.hub_model_id:
        p.error("--push_to_hub true needs --hub_model_id (the Hub repo id)")
    unknown = sorted(set(args.detectors or ()) - set(methods()))
    if unknown:
        p.error(f"--detectors: unknown {unknown}; choose among {list(methods())}")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# detectors


def selected_methods(args) -> tuple[str, ...]:
    chosen = set(args.detectors or methods())
    if args.no_odin:
        chosen.discard("ODIN")
    return tuple(m for m in methods() if m in chosen)


def build_detector(method: str, args, model, n_train: int, dim: int):
    """A baseline (or a variant row such as SSD+) from the registry, with its flags and the recipe's context."""
    name, variant = VARIANTS.get(method, (method, {}))
    cls = ood.get_detector(name)
    kwargs = {a: getattr(args, f"{_flag_prefix(name)}_{a}") for a in detector_options(name)}
    kwargs.update(variant)
    params = inspect.signature(cls).parameters
    if "head" in params:
        kwargs["head"] = model.get_classifier()
    if "model" in params:
        kwargs["model"] = model
    if name in ("KNN", "NNGuide"):
        kwargs["k"] = min(kwargs["k"], n_train)  # a small ID set: the k-th neighbour must exist
    if name == "ViM" and kwargs.get("dim") is None:
        # the principal subspace must leave residual variance: below the rank (n_train - 1) of a small ID set
        kwargs["dim"] = max(1, min(256, dim // 2, (n_train - 1) // 2))
    return cls(**kwargs)


def build_heat(args, model):
    heat_settings = dict(args.heat_settings)
    if args.heat_epochs is not None:
        heat_settings["epochs"] = args.heat_epochs
    if args.heat_batch_size is not None:
        heat_settings["batch_size"] = args.heat_batch_size
    return ood.HEAT(
        priors=tuple(args.priors),
        beta=args.beta,
        preset=args.preset,
        settings=heat_settings,
        head=model.get_classifier(),
        tie_hidden_weights=args.tie_hidden_weights,
        seed=args.seed,
    )


class HeatProgress:
    """``HEAT.fit`` callback: one progress bar per prior over its optimiser steps (epochs × batches)."""

    def __init__(self, heat, n_train: int, args) -> None:
        self.heat, self.n_train, self.args = heat, n_train, args
        self.bars: dict[str, Any] = {}

    def __call__(self, prior: str, epoch: int, step: int, loss: float) -> None:
        if prior not in self.bars:
            for bar in self.bars.values():
                bar.close()
            s = self.heat.component_settings[prior]
            total = s["epochs"] * (self.n_train // min(s["batch_size"], self.n_train))
            self.bars[prior] = progress(None, self.args, total=total, desc=f"HEAT prior {prior}", unit="step")
        bar = self.bars[prior]
        bar.set_postfix(epoch=epoch, loss=f"{loss:.3g}", refresh=False)
        bar.update(1)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def fit_detectors(model, train_feats, args):
    n_train, dim = len(train_feats), train_feats.features.shape[1]
    detectors = {}
    for method in selected_methods(args):
        if method == "HEAT":
            detectors[method] = build_heat(args, model)
        else:
            detectors[method] = build_detector(method, args, model, n_train, dim)
    timings = {}
    for name, det in detectors.items():
        print(f"fitting {name} ...", flush=True)
        start = time.perf_counter()
        if name == "HEAT":
            bars = HeatProgress(det, n_train, args)
            try:
                det.fit(**train_feats.as_kwargs(), callback=bars)
            finally:
                bars.close()
        else:
            det.fit(**train_feats.as_kwargs())
        timings[name] = time.perf_counter() - start
    return detectors, timings


def _scores_inputs(det) -> bool:
    """Detectors built around the network (ODIN) score the images, the others the extracted features."""
    return "model" in inspect.signature(type(det)).parameters


def score_all(detectors, feats, ds, args, device):
    scores = {}
    for name, det in detectors.items():
        if _scores_inputs(det):
            batches = progress(loader(ds, args.batch_size), args, desc=f"{name} scoring", leave=False)
            scores[name] = torch.cat([det.score(inputs=b["image"].to(device)).cpu() for b in batches])
        else:
            scores[name] = det.score(**{k: v for k, v in feats.as_kwargs().items() if k != "labels"}).cpu()
    return scores


def results_table(id_scores, ood_scores, convention):
    table = {}
    for method, id_s in id_scores.items():
        row = {}
        for ood_name, per_method in ood_scores.items():
            row[ood_name] = {
                "fpr95": ood_metrics.fpr_at_tpr(id_s, per_method[method], convention=convention),
                "auroc": ood_metrics.auroc(id_s, per_method[method]),
            }
        row["average"] = {k: sum(v[k] for v in row.values()) / len(row) for k in ("fpr95", "auroc")}
        table[method] = row
    return table


def format_table(table, ood_names) -> str:
    cols = [*ood_names, "average"]
    width = max(14, *(len(c) + 2 for c in cols))
    lines = ["method".ljust(12) + "".join(c.rjust(width) for c in cols), "-" * (12 + width * len(cols))]
    for method, row in table.items():
        cells = "".join(f"{100 * row[c]['fpr95']:.1f}/{100 * row[c]['auroc']:.1f}".rjust(width) for c in cols)
        lines.append(method.ljust(12) + cells)
    lines.append("(FPR95 / AUROC in %, " + "FPR95 lower is better, AUROC higher is better)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------


def prepare_data(args):
    """Resolve the synthetic defaults, build the transform and the datasets; returns them with the class ids."""
    import timm

    synthetic = args.id_dataset == "synthetic"
    if args.output_stride is None:
        args.output_stride = 8 if synthetic else 32  # synthetic: 4x4 last feature map at 32 px, as CIFAR ResNets
    probe = timm.create_model(args.backbone, pretrained=False, num_classes=0)
    cfg = timm.data.resolve_model_data_config(probe)
    if args.image_size is None:
        args.image_size = 32 if synthetic else int(cfg["input_size"][-1])
    transform = image_transform(args.image_size, cfg["mean"], cfg["std"])
    train_ds, test_ds, ood_sets, level = build_datasets(args, transform)
    train_labels = train_ds.labels if hasattr(train_ds, "labels") else None
    if train_labels is None:  # Subset
        train_labels = train_ds.dataset.labels[torch.tensor(train_ds.indices)]
    classes = torch.unique(train_labels[:, level])
    print(
        f"ID train {len(train_ds)} / test {len(test_ds)} images, {len(classes)} classes; "
        + ", ".join(f"OOD {k}: {len(v)}" for k, v in ood_sets.items()),
        flush=True,
    )
    if args.train_epochs is None:
        args.train_epochs = 10 if synthetic else 0
    if synthetic:
        args.heat_epochs = 30 if args.heat_epochs is None else args.heat_epochs
        args.heat_batch_size = 128 if args.heat_batch_size is None else args.heat_batch_size
    return train_ds, test_ds, ood_sets, level, classes, train_labels


def extract_all(model, train_ds, test_ds, ood_sets, level, classes, train_labels, args, device):
    """Features of the ID train / test sets and of every OOD set (with progress bars), and the ID test accuracy."""

    def extract(ds, name):
        batches = progress(loader(ds, args.batch_size), args, desc=f"features {name}", unit="batch")
        return ood.extract_features(model, batches, device=device)

    train_feats = extract(train_ds, "ID train")
    train_feats.labels = class_targets(train_labels, level, classes)
    test_feats = extract(test_ds, "ID test")
    test_acc = None
    if test_feats.labels is not None:
        test_labels = test_ds.labels if hasattr(test_ds, "labels") else test_ds.dataset.labels[test_ds.indices]
        targets = class_targets(test_labels, level, classes)
        test_acc = float((test_feats.logits.argmax(-1) == targets).float().mean())
        print(f"classifier ID test accuracy {test_acc:.3f}", flush=True)
    ood_feats = {k: extract(v, f"OOD {k}") for k, v in ood_sets.items()}
    return train_feats, test_feats, ood_feats, test_acc


def save_features(out_dir: Path, model, train_feats, test_feats, ood_feats, args) -> Path:
    """``features.safetensors``: every extracted set and the head, read by ``ood_benchmark --features``."""
    return ood.save_features(
        out_dir / "features.safetensors",
        {"id_train": train_feats, "id_test": test_feats, **ood_feats},
        head=model.get_classifier(),
        metadata={"id_dataset": args.id_dataset, "backbone": args.backbone, "ood_datasets": list(ood_feats)},
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # recipe-level seeding (classifier init and flips); the package never does this
    device = torch.device(args.device)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    train_ds, test_ds, ood_sets, level, classes, train_labels = prepare_data(args)
    model = build_model(args, len(classes)).to(device)
    train_history = train_classifier(model, train_ds, level, classes, args, device)
    model.eval()
    train_feats, test_feats, ood_feats, test_acc = extract_all(
        model, train_ds, test_ds, ood_sets, level, classes, train_labels, args, device
    )
    features_file = save_features(out_dir, model, train_feats, test_feats, ood_feats, args)

    detectors, fit_times = fit_detectors(model, train_feats, args)
    print("scoring ...", flush=True)
    id_scores = score_all(detectors, test_feats, test_ds, args, device)
    ood_scores = {k: score_all(detectors, ood_feats[k], ood_sets[k], args, device) for k in ood_sets}
    table = results_table(id_scores, ood_scores, args.convention)
    print(f"\nFPR95 ({args.convention}) / AUROC, ID = {args.id_dataset}, backbone = {args.backbone}")
    print(format_table(table, list(ood_sets)))

    heat = detectors.get("HEAT")
    heat_dir = None if heat is None else heat.save_pretrained(out_dir / "heat_detector")
    plot = None if args.no_plots else save_histograms(id_scores, ood_scores, out_dir)
    results = {
        "args": vars(args),
        "classifier_history": train_history,
        "classifier_test_accuracy": test_acc,
        "table": table,
        "fit_seconds": fit_times,
        "heat_fit_seconds_per_prior": None if heat is None else heat.fit_seconds,
        "heat_history": None if heat is None else heat.history,
        "total_seconds": time.perf_counter() - t0,
        "heat_detector": None if heat_dir is None else str(heat_dir),
        "histograms": None if plot is None else str(plot),
        "features": str(features_file),
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {out_dir / 'results.json'}, {plot or 'no plots'}, detector in {heat_dir}")
    if args.push_to_hub and heat is not None:
        print(f"pushed to {heat.push_to_hub(args.hub_model_id, private=args.hub_private or None)}")
    print(f"total {results['total_seconds']:.1f} s")
    return results


def run() -> None:
    """The console script ``pml-suprank-fit-heat``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()
