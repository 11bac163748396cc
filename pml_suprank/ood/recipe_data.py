"""Data, classifier and plotting helpers of the HEAT recipe ``recipes/fit_heat.py`` (datasets, timm model,
histograms); ``args`` is that recipe's parsed command line.

Kept apart from the command-line script so that ``recipes/`` holds only runnable scripts; nothing here is specific to
one detector.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

ID_FAMILIES = ("circle", "triangle", "square", "star")
HELDOUT_FAMILIES = ("cross", "arrow")
BUILTIN_OOD = ("synthetic-heldout", "noise-uniform", "noise-gaussian", "noise-blobs")


def progress(iterable, args, **kwargs):
    """``tqdm`` bar over ``iterable`` (stderr, refreshed at most every 2 s) unless ``--progress false``."""
    return tqdm(iterable, disable=not args.progress, mininterval=2.0, dynamic_ncols=True, **kwargs)


def image_transform(image_size: int, mean, std):
    from torchvision import transforms as T

    return T.Compose([T.Resize((image_size, image_size)), T.ToTensor(), T.Normalize(list(mean), list(std))])


def _cap(ds, max_samples, seed):
    if max_samples is None or len(ds) <= max_samples:
        return ds
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:max_samples]
    return torch.utils.data.Subset(ds, idx.tolist())


def build_datasets(args, transform):
    from .. import data

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
    from ..data import collate

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
            raise ValueError(f"--cifar_stem needs a timm ResNet (conv1 + maxpool); got {args.backbone}")
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
        batches = loader(ds, args.batch_size, shuffle=True, seed=args.seed + epoch)
        for batch in progress(batches, args, desc=f"classifier epoch {epoch}", unit="batch", leave=False):
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
        print(f"classifier epoch {epoch}: loss {total / seen:.4f} train acc {correct / seen:.3f}", flush=True)  # noqa: T201 - recipe progress
    model.eval()
    return history


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
