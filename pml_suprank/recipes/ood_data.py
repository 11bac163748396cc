"""Data, classifier and plotting helpers of ``recipes/fit_heat.py``, driven by its
:class:`~pml_suprank.recipes.ood_spec.FitHeatSpec` (``spec``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import data
from ..data import collate
from ..data.folders import image_folder_layout
from ..data.source import dataset_source
from ..models import RetrievalModel
from ..ood.model_api import read_state_dict
from ..ood.score_plots import plot_score_histograms
from ..search.image_files import ImageFiles, is_flat_image_folder
from .ood_spec import FitHeatSpec

ID_FAMILIES = ("circle", "triangle", "square", "star")
HELDOUT_FAMILIES = ("cross", "arrow")


def progress(iterable, spec: Any, **kwargs):
    """``tqdm`` bar over ``iterable`` (stderr, refreshed at most every 2 s) unless ``spec.progress`` is false."""
    return tqdm(iterable, disable=not spec.progress, mininterval=2.0, dynamic_ncols=True, **kwargs)


def image_transform(image_size: int, mean, std):
    from torchvision import transforms as T

    return T.Compose([T.Resize((image_size, image_size)), T.ToTensor(), T.Normalize(list(mean), list(std))])


def _cap(ds, max_samples, seed):
    if max_samples is None or len(ds) <= max_samples:
        return ds
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:max_samples]
    return torch.utils.data.Subset(ds, idx.tolist())


def ood_source(entry: str, spec: FitHeatSpec) -> tuple[str, str, str]:
    """``SOURCE[:SPLIT[:LABEL]]`` → ``(source, split, label column)``; without a split, ``"test"``, or the only split
    of a local image folder that has no test split (a folder of OOD images is used whole)."""
    source, _, rest = entry.partition(":")
    split, _, label = rest.partition(":")
    layout = image_folder_layout(source) if not split else None
    if layout is not None:
        split = "test" if "test" in layout.splits else layout.splits[0]
        label = label or layout.label_columns[0]
    return source, split or "test", label or spec.ood_label_column


def build_datasets(spec: FitHeatSpec, transform, id_data: dict[str, Any] | None = None):
    """ID train / test sets, the OOD sets ``{name: dataset}`` and the label level of the classes.

    ``id_data``: the data spec recorded in a retrieval model folder (``data_spec.json``): the ID sets are then the
    training run's own training / test sets (same source, label columns and class split)."""
    if id_data is not None:
        section, seed = id_data["data"], int(id_data.get("seed", 0))
        kw = {"cache_dir": spec.cache_dir} if dataset_source(section, "train").kind == "retrieval" else {}
        kw["recorded_split"] = id_data.get("class_split")
        train = dataset_source(section, "train").load(transform, seed=seed, **kw)
        test = dataset_source(section, "test").load(transform, seed=seed, **kw)
        label_col = spec.label_column or train.label_names[0]
    elif spec.synthetic:
        label_col = spec.label_column or "coarse_label"
        common = {"image_size": spec.image_size, "open_set": False, "seed": spec.seed, "transform": transform}
        train = data.SyntheticShapes("train", num_per_class=spec.num_per_class, families=ID_FAMILIES, **common)
        test = data.SyntheticShapes("test", num_per_class=spec.num_test_per_class, families=ID_FAMILIES, **common)
    else:
        label_col = spec.label_column or "label"
        kw = {"transform": transform, "cache_dir": spec.cache_dir}
        train = data.load_retrieval_dataset(spec.id_dataset, [label_col], split=spec.id_train_split, **kw)
        test = data.load_retrieval_dataset(spec.id_dataset, [label_col], split=spec.id_test_split, **kw)
    level = train.label_names.index(label_col) if label_col in train.label_names else 0
    oods = {}
    common = {"image_size": spec.image_size, "seed": spec.seed, "transform": transform}
    for entry in spec.ood_datasets:
        if entry == "synthetic-heldout":
            oods[entry] = data.SyntheticShapes("test", num_per_class=spec.num_test_per_class,
                                               families=HELDOUT_FAMILIES, open_set=False, **common)  # fmt: skip
        elif entry.startswith("noise-"):
            oods[entry] = data.SyntheticNoise(spec.num_noise, kind=entry.split("-", 1)[1], **common)
        elif is_flat_image_folder(entry):  # "things that are not my classes": a folder of images, no class folders
            oods[entry] = ImageFiles(entry, transform, what=f"--ood_datasets {entry}")
        else:
            source, split, label = ood_source(entry, spec)
            oods[entry] = data.load_retrieval_dataset(source, [label], split=split, transform=transform,
                                                      cache_dir=spec.cache_dir)  # fmt: skip
    caps = {k: _cap(v, spec.max_samples, spec.seed) for k, v in oods.items()}
    return _cap(train, spec.max_samples, spec.seed), _cap(test, spec.max_samples, spec.seed), caps, level


def loader(ds, batch_size, shuffle=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, collate_fn=collate, generator=g)


def class_targets(labels: torch.Tensor, level: int, classes: torch.Tensor) -> torch.Tensor:
    """Map a label column to 0..C-1 using the sorted class ids of the training set."""
    return torch.searchsorted(classes, labels[:, level].contiguous())


def build_model(spec: FitHeatSpec, num_classes: int):
    """The classifier whose features are scored: a timm model (``--backbone``, ``--checkpoint``) or, with ``--model``,
    the package's retrieval model with a new classification head (:class:`RetrievalClassifier`)."""
    import timm

    if spec.model is not None:
        return RetrievalClassifier(RetrievalModel.from_pretrained(spec.model), num_classes)
    kwargs = {"num_classes": num_classes, "pretrained": spec.pretrained}
    if spec.output_stride not in (None, 32):
        kwargs["output_stride"] = spec.output_stride
    try:
        model = timm.create_model(spec.backbone, **kwargs)
    except TypeError:  # backbones without output_stride
        kwargs.pop("output_stride", None)
        model = timm.create_model(spec.backbone, **kwargs)
    if spec.cifar_stem:  # CIFAR ResNets (HEAT's setting): 3x3 stride-1 first conv, no max-pool -> 4x4 layer4 at 32 px
        if not (hasattr(model, "conv1") and hasattr(model, "maxpool")):
            raise ValueError(f"--cifar_stem needs a timm ResNet (conv1 + maxpool); got {spec.backbone}")
        model.conv1 = torch.nn.Conv2d(3, model.conv1.out_channels, 3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    if spec.checkpoint:
        load_checkpoint(model, Path(spec.checkpoint), spec.backbone)
    return model


def load_checkpoint(model: torch.nn.Module, path: Path, backbone: str) -> None:
    """Load the state dict file ``path`` (.safetensors or a ``torch.save`` file) into the timm classifier ``model``;
    ``ValueError``: an unreadable file, a retrieval model of this package (use ``--model``), or keys / shapes that do
    not match ``backbone``."""
    state = read_state_dict(path)
    if any(k.startswith("backbone.") for k in state) and (path.parent / "config.json").is_file():
        raise ValueError(
            f"--checkpoint {path} holds a retrieval model of this package (backbone + embedding head), not a timm "
            f"classifier's state dict: use --model {path.parent} (its backbone, with a classification head trained "
            "on the ID set)"
        )
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        parts = [f"{what} {names[:5]}{' ...' if len(names) > 5 else ''} ({len(names)})"
                 for what, names in (("missing keys", missing), ("unexpected keys", unexpected),
                                     ("keys of another shape", wrong)) if names]  # fmt: skip
        raise ValueError(f"--checkpoint {path} does not fit --backbone {backbone}: {'; '.join(parts)}")
    model.load_state_dict(state)


class RetrievalClassifier(torch.nn.Module):
    """A :class:`~pml_suprank.models.RetrievalModel` seen as a timm classifier (``forward_features`` /
    ``forward_head`` / ``get_classifier``): ``z`` is its pooled backbone feature ``(B, F)``, the logits those of a
    new linear head ``(B, C)`` — the only part :func:`train_classifier` trains (the backbone is frozen)."""

    def __init__(self, retrieval_model: torch.nn.Module, num_classes: int) -> None:
        super().__init__()
        self.retrieval_model = retrieval_model.requires_grad_(False)
        self.head = torch.nn.Linear(retrieval_model.num_features, num_classes)

    @property
    def data_config(self) -> dict[str, Any]:
        return self.retrieval_model.data_config

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.retrieval_model.forward_features(x)

    def forward_head(self, fmap: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        pooled = self.retrieval_model.pool(fmap)
        return pooled if pre_logits else self.head(pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> torch.nn.Module:
        return self.head

    def train(self, mode: bool = True) -> RetrievalClassifier:
        super().train(mode)
        self.retrieval_model.eval()  # frozen: BatchNorm statistics and dropout of the trained model stay as they are
        return self


def train_classifier(model, ds, level, classes, spec: FitHeatSpec, device):
    if not spec.train_epochs:
        return []
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr, weight_decay=0.05)
    steps = spec.train_epochs * math.ceil(len(ds) / spec.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=spec.lr, total_steps=steps, pct_start=0.15)
    model.train()
    history = []
    for epoch in range(spec.train_epochs):
        correct = seen = 0
        total = 0.0
        batches = loader(ds, spec.batch_size, shuffle=True, seed=spec.seed + epoch)
        for batch in progress(batches, spec, desc=f"classifier epoch {epoch}", unit="batch", leave=False):
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


def save_histograms(id_scores, ood_scores, out_dir: Path, convention: str = "id_positive") -> Path:
    """``out_dir/score_histograms.png``: the ``{detector: (N,)}`` ID scores against each OOD set's (``(M,)``)."""
    return plot_score_histograms(id_scores, ood_scores, Path(out_dir) / "score_histograms.png", convention=convention)
