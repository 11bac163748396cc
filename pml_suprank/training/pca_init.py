"""PCA initialisation of a model's projection before the first step of a fresh run (``projection_init="pca"``, as
for the SupRank landmark models, TPAMI Sec. VII-C3): the PCA of the projection inputs of up to ``pca_samples``
training images (test transform), computed on every process, the main process's weights broadcast.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, Subset

from .loaders import SeededAugmentation, embed_loader, make_loader

__all__ = ["init_projection_if_requested", "pca_dataset"]


class _ProjectionInput(nn.Module):
    """Wraps a ``RetrievalModel`` so that the embedding loop returns its projection inputs ``(B, C)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.forward_projection_input(x)


def pca_dataset(train_dataset: Dataset, eval_dataset: Dataset | None, samples: int, seed: int) -> Dataset:
    """``train_dataset`` (a shallow copy) with the transform of ``eval_dataset``, at most ``samples`` items drawn
    with ``seed`` (in dataset order), each item's randomness seeded by ``(seed, index)``."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2:
        raise ValueError(f"pca_samples must be an int >= 2; got {samples!r}")
    data = train_dataset
    transform = getattr(eval_dataset, "transform", None)
    if transform is not None and hasattr(train_dataset, "transform"):
        data = copy.copy(train_dataset)
        data.transform = transform
    data = SeededAugmentation(data, seed=seed)
    n = len(data)
    if samples < n:
        generator = torch.Generator().manual_seed(int(seed))
        data = Subset(data, torch.randperm(n, generator=generator)[:samples].sort().values.tolist())
    return data


def init_projection_if_requested(trainer: Any, *, fresh: bool) -> bool:
    """Set ``trainer.model``'s projection by PCA if ``fresh`` (a run from scratch) and its ``projection_init`` is
    ``"pca"``; return whether it did."""
    model = trainer.model
    if not fresh or getattr(model, "projection_init", "random") != "pca":
        return False
    config, acc = trainer.config, trainer.accelerator
    with torch.random.fork_rng(devices=[]):  # building the loader draws from the global RNG: keep it untouched
        dataset = pca_dataset(trainer.train_dataset.dataset, trainer.test_dataset, config.pca_samples, config.seed)
        loader = acc.prepare(make_loader(dataset, config.eval_batch_size, config.num_workers))
        features, _, _ = embed_loader(_ProjectionInput(model), loader, acc, progress=True, description="PCA")
    model.init_projection_from_pca(features)
    if acc.num_processes > 1:  # identical already (same gathered features); made bit-identical across hosts anyway
        import torch.distributed as dist

        for tensor in (model.projection.weight, model.projection.bias):
            dist.broadcast(tensor.data, src=0)
    acc.print(f"projection initialised by PCA of {features.shape[0]} training features ({features.shape[1]}-d)")
    return True
