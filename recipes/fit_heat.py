"""Fit HEAT and the OOD baselines on the features of a timm classifier, and report FPR95 / AUROC per OOD set.

With no arguments the recipe runs offline on the built-in SyntheticShapes: four shape families are
in-distribution (ID), a small timm ResNet is trained on the spot to classify them, and the OOD sets are the two
held-out families (near-OOD) plus uniform-noise and blob images (far-OOD). It then

1. extracts avg-pooled ``z``, std-pooled ``σ`` and logits of the last feature map (``pml_suprank.ood.features``),
2. fits HEAT (GMM + GMM_std + EL, composed with β) and MSP, MaxLogit, Energy, ODIN, Mahalanobis, SSD+, KNN, ViM,
   DICE, ReAct on the ID training features,
3. prints FPR95 / AUROC per OOD set and their average (like thesis Table 5.5), saves score histograms, a JSON of all
   metrics and the fitted HEAT detector (``save_pretrained`` folder, Hub-ready; ``--push-to-hub`` uploads it).

Any timm backbone and any dataset the package can load work through flags, e.g.::

    python recipes/fit_heat.py --backbone resnet18 --pretrained --id-dataset uoft-cs/cifar10 \
        --label-column label --ood-datasets uoft-cs/cifar100:test:fine_label tanganke/svhn:test:label \
        --image-size 32 --train-epochs 5

Hub ids and local folders go through ``pml_suprank.data.load_retrieval_dataset`` (``SOURCE[:SPLIT[:LABEL]]``, the
label column only satisfies the loader; OOD labels are not used); the special
names ``synthetic-heldout``, ``noise-uniform``, ``noise-gaussian`` and ``noise-blobs`` are built in. Nothing is
downloaded unless a Hub id or ``--pretrained`` is given. Hyper-parameters of the published settings are in
``hub_configs/heat_*.yaml`` (``--config``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pml_suprank import ood
from pml_suprank.ood import metrics as ood_metrics

ID_FAMILIES = ("circle", "triangle", "square", "star")
HELDOUT_FAMILIES = ("cross", "arrow")
BUILTIN_OOD = ("synthetic-heldout", "noise-uniform", "noise-gaussian", "noise-blobs")
METHODS = ("MSP", "MaxLogit", "Energy", "ODIN", "Mahalanobis", "SSD+", "KNN", "ViM", "DICE", "ReAct", "HEAT")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fit HEAT + OOD baselines on a timm classifier's features.")
    p.add_argument("--config", default=None, help="YAML file (e.g. hub_configs/heat_cifar10_resnet34.yaml); flags win")
    p.add_argument("--backbone", default="test_resnet", help="timm model name (default: a tiny timm ResNet)")
    p.add_argument("--pretrained", action="store_true", help="load timm's pretrained weights (downloads)")
    p.add_argument("--checkpoint", default=None, help="state dict (.pt / .safetensors) to load into the timm model")
    p.add_argument("--cifar-stem", action="store_true", help="ResNet with a 3x3 stride-1 stem and no max-pool")
    p.add_argument(
        "--output-stride", type=int, default=None, choices=(8, 16, 32), help="timm output_stride (synthetic: 8)"
    )
    p.add_argument("--id-dataset", default="synthetic", help="'synthetic', a Hub dataset id or a local folder")
    p.add_argument("--label-column", default=None, help="class label column (default: coarse_label for synthetic)")
    p.add_argument("--id-train-split", default="train", help="split of the ID dataset used to fit the detectors")
    p.add_argument("--id-test-split", default="test", help="split of the ID dataset used as ID test set")
    p.add_argument(
        "--ood-datasets",
        nargs="+",
        default=["synthetic-heldout", "noise-uniform", "noise-blobs"],
        help=f"OOD sets: built-in {BUILTIN_OOD} or SOURCE[:SPLIT[:LABEL_COLUMN]] (Hub id / local folder)",
    )
    p.add_argument(
        "--ood-label-column", default="label", help="default label column of Hub / folder OOD sets (labels unused)"
    )
    p.add_argument("--cache-dir", default=None, help="datasets cache folder for Hub / folder datasets")
    p.add_argument("--image-size", type=int, default=None, help="image side (synthetic: 32; else the model's)")
    p.add_argument("--num-per-class", type=int, default=40, help="synthetic: training images per fine class")
    p.add_argument("--num-test-per-class", type=int, default=12, help="synthetic: test images per fine class")
    p.add_argument("--num-noise", type=int, default=200, help="images per built-in noise OOD set")
    p.add_argument("--max-samples", type=int, default=None, help="cap every split at this many images")
    p.add_argument("--train-epochs", type=int, default=None, help="train the classifier first (synthetic: 10)")
    p.add_argument("--lr", type=float, default=5e-3, help="classifier learning rate (AdamW, one-cycle)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size for training and feature extraction")
    p.add_argument("--preset", default="fast", choices=sorted(ood.PRESETS), help="HEAT hyper-parameter preset")
    p.add_argument("--heat-epochs", type=int, default=None, help="override the preset's epochs (synthetic: 30)")
    p.add_argument("--heat-batch-size", type=int, default=None, help="override the preset's batch (synthetic: 128)")
    p.add_argument("--beta", type=float, default=0.0, help="HEAT composition β (0 = sum, -1, 1, inf, -inf)")
    p.add_argument("--priors", nargs="+", default=["gmm", "gmm_std", "el"], choices=["gmm", "gmm_std", "el"])
    p.add_argument("--tie-hidden-weights", action="store_true", help="share HEAT's hidden layer (reference code)")
    p.add_argument("--knn-k", type=int, default=50, help="KNN neighbour rank")
    p.add_argument("--vim-dim", type=int, default=None, help="ViM principal dim (default: min(256, D // 2))")
    p.add_argument("--dice-p", type=float, default=0.9, help="DICE sparsity (fraction of weights dropped)")
    p.add_argument("--react-percentile", type=float, default=95.0, help="ReAct clipping percentile")
    p.add_argument("--odin-temperature", type=float, default=1000.0, help="ODIN temperature")
    p.add_argument("--odin-eps", type=float, default=0.0014, help="ODIN input perturbation")
    p.add_argument("--no-odin", action="store_true", help="skip ODIN (needs a backward pass per batch)")
    p.add_argument(
        "--convention",
        default="id_positive",
        choices=["id_positive", "ood_positive", "id_positive_roc"],
        help="FPR95 convention: id_positive (thesis / HEAT) or ood_positive (OpenOOD v1.5)",
    )
    p.add_argument("--output-dir", default="outputs/fit_heat", help="where to write results, plots and the detector")
    p.add_argument("--push-to-hub", default=None, help="Hub repo id to upload the fitted HEAT detector to")
    p.add_argument("--device", default="cpu", help="'cpu', 'cuda', ...")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0, help="seed for data, training and HEAT")
    p.add_argument("--no-plots", action="store_true", help="do not write histograms")
    args = p.parse_args(argv)
    args.heat_settings = {}
    if args.config:
        import yaml

        cfg = yaml.safe_load(Path(args.config).read_text()) or {}
        defaults = {a.dest: a.default for a in p._actions}
        heat = dict(cfg.get("heat") or {})
        args.heat_settings = heat.pop("settings", None) or {}
        for key, value in [*(cfg.get("recipe") or {}).items(), *heat.items()]:
            key = key.replace("-", "_")
            if key not in defaults:
                p.error(f"unknown key {key!r} in {args.config} (recipe / heat sections)")
            if getattr(args, key) == defaults[key]:  # command-line flags win over the file
                setattr(args, key, value)
    return args


# ---------------------------------------------------------------------------------------------------------------------
# data


def _transform(image_size: int, mean, std):
    from torchvision import transforms as T

    return T.Compose([T.Resize((image_size, image_size)), T.ToTensor(), T.Normalize(list(mean), list(std))])


def _cap(ds, max_samples, seed):
    if max_samples is None or len(ds) <= max_samples:
        return ds
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:max_samples]
    return torch.utils.data.Subset(ds, idx.tolist())


def build_datasets(args, transform):
    from pml_suprank import data

    if args.id_dataset == "synthetic":
        label_col = args.label_column or "coarse_label"
        common = {"image_size": args.image_size, "open_set": False, "seed": args.seed, "transform": transform}
        train = data.SyntheticShapes("train", num_per_class=args.num_per_class, families=ID_FAMILIES, **common)
        test = data.SyntheticShapes("test", num_per_class=args.num_test_per_class, families=ID_FAMILIES, **common)
    else:
        label_col = args.label_column or "label"
        kw = {"transform": transform, "cache_dir": args.cache_dir}
        train = data.load_retrieval_dataset(args.id_dataset, [label_col], split=args.id_train_split, **kw)
        test = data.load_retrieval_dataset(args.id_dataset, [label_col], split=args.id_test_split, **kw)
    level = train.label_names.index(label_col) if label_col in train.label_names else 0
    oods = {}
    for spec in args.ood_datasets:
        if spec == "synthetic-heldout":
            oods[spec] = data.SyntheticShapes(
                "test",
                num_per_class=args.num_test_per_class,
                families=HELDOUT_FAMILIES,
                image_size=args.image_size,
                open_set=False,
                seed=args.seed,
                transform=transform,
            )
        elif spec.startswith("noise-"):
            kind = spec.split("-", 1)[1]
            oods[spec] = data.SyntheticNoise(
                args.num_noise, image_size=args.image_size, seed=args.seed, kind=kind, transform=transform
            )
        else:
            source, _, rest = spec.partition(":")
            split, _, label = rest.partition(":")
            oods[spec] = data.load_retrieval_dataset(
                source,
                [label or args.ood_label_column],
                split=split or "test",
                transform=transform,
                cache_dir=args.cache_dir,
            )
    caps = {k: _cap(v, args.max_samples, args.seed) for k, v in oods.items()}
    return _cap(train, args.max_samples, args.seed), _cap(test, args.max_samples, args.seed), caps, level


def loader(ds, batch_size, shuffle=False, seed=0):
    from pml_suprank.data import collate

    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, collate_fn=collate, generator=g)


def class_targets(labels: torch.Tensor, level: int, classes: torch.Tensor) -> torch.Tensor:
    """Map a label column to 0..C-1 using the sorted class ids of the training set."""
    return torch.searchsorted(classes, labels[:, level].contiguous())


# ---------------------------------------------------------------------------------------------------------------------
# model


def build_model(args, num_classes: int):
    import timm

    kwargs = {"num_classes": num_classes, "pretrained": args.pretrained}
    if args.output_stride not in (None, 32):
        kwargs["output_stride"] = args.output_stride
    try:
        model = timm.create_model(args.backbone, **kwargs)
    except TypeError:  # backbones without output_stride
        kwargs.pop("output_stride", None)
        model = timm.create_model(args.backbone, **kwargs)
    if args.cifar_stem:  # CIFAR ResNets (HEAT's setting): 3x3 stride-1 first conv, no max-pool -> 4x4 layer4 at 32 px
        if not (hasattr(model, "conv1") and hasattr(model, "maxpool")):
            raise ValueError(f"--cifar-stem needs a timm ResNet (conv1 + maxpool); got {args.backbone}")
        model.conv1 = torch.nn.Conv2d(3, model.conv1.out_channels, 3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    if args.checkpoint:
        path = Path(args.checkpoint)
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model


def train_classifier(model, ds, level, classes, args, device):
    if not args.train_epochs:
        return []
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    steps = args.train_epochs * math.ceil(len(ds) / args.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=steps, pct_start=0.15)
    model.train()
    history = []
    for epoch in range(args.train_epochs):
        correct = seen = 0
        total = 0.0
        for batch in loader(ds, args.batch_size, shuffle=True, seed=args.seed + epoch):
            x = batch["image"].to(device)
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
            y = class_targets(batch["labels"], level, classes).to(device)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(y)
            correct += int((logits.argmax(-1) == y).sum())
            seen += len(y)
        history.append({"epoch": epoch, "loss": total / seen, "accuracy": correct / seen})
        print(f"classifier epoch {epoch}: loss {total / seen:.4f} train acc {correct / seen:.3f}")
    model.eval()
    return history


# ---------------------------------------------------------------------------------------------------------------------
# detectors


def fit_detectors(model, train_feats, args):
    head = model.get_classifier()
    dim = train_feats.features.shape[1]
    heat_settings = dict(args.heat_settings)
    if args.heat_epochs is not None:
        heat_settings["epochs"] = args.heat_epochs
    if args.heat_batch_size is not None:
        heat_settings["batch_size"] = args.heat_batch_size
    detectors = {
        "MSP": ood.MSP(),
        "MaxLogit": ood.MaxLogit(),
        "Energy": ood.Energy(),
        "Mahalanobis": ood.Mahalanobis(),
        "SSD+": ood.Mahalanobis(normalize=True),
        "KNN": ood.KNN(k=min(args.knn_k, len(train_feats))),
        "ViM": ood.ViM(dim=args.vim_dim or min(256, dim // 2), head=head),
        "DICE": ood.DICE(p=args.dice_p, head=head),
        "ReAct": ood.ReAct(percentile=args.react_percentile, head=head),
        "HEAT": ood.HEAT(
            priors=tuple(args.priors),
            beta=args.beta,
            preset=args.preset,
            settings=heat_settings,
            head=head,
            tie_hidden_weights=args.tie_hidden_weights,
            seed=args.seed,
        ),
    }
    if not args.no_odin:
        detectors["ODIN"] = ood.ODIN(model, temperature=args.odin_temperature, eps=args.odin_eps)
    timings = {}
    for name, det in detectors.items():
        start = time.perf_counter()
        det.fit(**train_feats.as_kwargs())
        timings[name] = time.perf_counter() - start
    return {k: detectors[k] for k in METHODS if k in detectors}, timings


def score_all(detectors, feats, ds, model, args, device):
    scores = {}
    for name, det in detectors.items():
        if name == "ODIN":
            parts = [det.score(inputs=b["image"].to(device)).cpu() for b in loader(ds, args.batch_size)]
            scores[name] = torch.cat(parts)
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


def save_histograms(id_scores, ood_scores, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(id_scores)
    cols = 4
    rows = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, method in zip(axes.flat, methods):
        all_s = torch.cat([id_scores[method], *(v[method] for v in ood_scores.values())])
        lo, hi = torch.quantile(all_s, 0.005).item(), torch.quantile(all_s, 0.995).item()
        bins = torch.linspace(lo, hi if hi > lo else lo + 1e-6, 40).numpy()
        ax.hist(id_scores[method].numpy(), bins=bins, alpha=0.6, density=True, label="ID test")
        for name, per_method in ood_scores.items():
            ax.hist(per_method[method].numpy(), bins=bins, alpha=0.45, density=True, histtype="stepfilled", label=name)
        ax.set_title(f"{method} (higher = more OOD)", fontsize=9)
    for ax in list(axes.flat)[len(methods) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "score_histograms.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # recipe-level seeding (classifier init and flips); the package never does this
    device = torch.device(args.device)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    # data config: the backbone's own mean/std at our image size
    import timm

    synthetic = args.id_dataset == "synthetic"
    if args.output_stride is None:
        args.output_stride = 8 if synthetic else 32  # synthetic: 4x4 last feature map at 32 px, as CIFAR ResNets
    probe = timm.create_model(args.backbone, pretrained=False, num_classes=0)
    cfg = timm.data.resolve_model_data_config(probe)
    if args.image_size is None:
        args.image_size = 32 if synthetic else int(cfg["input_size"][-1])
    transform = _transform(args.image_size, cfg["mean"], cfg["std"])
    train_ds, test_ds, ood_sets, level = build_datasets(args, transform)
    train_labels = train_ds.labels if hasattr(train_ds, "labels") else None
    if train_labels is None:  # Subset
        train_labels = train_ds.dataset.labels[torch.tensor(train_ds.indices)]
    classes = torch.unique(train_labels[:, level])
    print(
        f"ID train {len(train_ds)} / test {len(test_ds)} images, {len(classes)} classes; "
        + ", ".join(f"OOD {k}: {len(v)}" for k, v in ood_sets.items())
    )

    if args.train_epochs is None:
        args.train_epochs = 10 if synthetic else 0
    if synthetic:
        args.heat_epochs = 30 if args.heat_epochs is None else args.heat_epochs
        args.heat_batch_size = 128 if args.heat_batch_size is None else args.heat_batch_size
    model = build_model(args, len(classes)).to(device)
    train_history = train_classifier(model, train_ds, level, classes, args, device)
    model.eval()

    train_feats = ood.extract_features(model, loader(train_ds, args.batch_size), device=device)
    train_feats.labels = class_targets(train_labels, level, classes)
    test_feats = ood.extract_features(model, loader(test_ds, args.batch_size), device=device)
    test_acc = None
    if test_feats.labels is not None:
        test_labels = test_ds.labels if hasattr(test_ds, "labels") else test_ds.dataset.labels[test_ds.indices]
        targets = class_targets(test_labels, level, classes)
        test_acc = float((test_feats.logits.argmax(-1) == targets).float().mean())
        print(f"classifier ID test accuracy {test_acc:.3f}")
    ood_feats = {k: ood.extract_features(model, loader(v, args.batch_size), device=device) for k, v in ood_sets.items()}

    detectors, fit_times = fit_detectors(model, train_feats, args)
    id_scores = score_all(detectors, test_feats, test_ds, model, args, device)
    ood_scores = {k: score_all(detectors, ood_feats[k], ood_sets[k], model, args, device) for k in ood_sets}
    table = results_table(id_scores, ood_scores, args.convention)
    print(f"\nFPR95 ({args.convention}) / AUROC, ID = {args.id_dataset}, backbone = {args.backbone}")
    print(format_table(table, list(ood_sets)))

    heat = detectors["HEAT"]
    heat_dir = heat.save_pretrained(out_dir / "heat_detector")
    plot = None if args.no_plots else save_histograms(id_scores, ood_scores, out_dir)
    results = {
        "args": vars(args),
        "classifier_history": train_history,
        "classifier_test_accuracy": test_acc,
        "table": table,
        "fit_seconds": fit_times,
        "heat_fit_seconds_per_prior": heat.fit_seconds,
        "heat_history": heat.history,
        "total_seconds": time.perf_counter() - t0,
        "heat_detector": str(heat_dir),
        "histograms": None if plot is None else str(plot),
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {out_dir / 'results.json'}, {plot or 'no plots'}, detector in {heat_dir}")
    if args.push_to_hub:
        print(f"pushed to {heat.push_to_hub(args.push_to_hub)}")
    print(f"total {results['total_seconds']:.1f} s")
    return results


if __name__ == "__main__":
    main()
