"""Data side of the training loop: seeded per-item augmentation, the loaders, samplers, memory and the embedding
loop :func:`embed_loader`."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from .._eval_mode import eval_mode
from ..data import collate
from ..data.embedding_cache import cached_embeddings

__all__ = ["SeededAugmentation", "build_memory", "build_sampler", "embed_loader", "make_loader"]


class SeededAugmentation(Dataset):
    """Draws the augmentation of item ``i`` in epoch ``e`` from the seed ``(seed, e, i)``, whatever process or
    worker loads it (the global generators are restored afterwards): a resumed run sees the same images."""

    def __init__(self, dataset: Dataset, seed: int = 0) -> None:
        self.dataset = dataset
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        item_seed = int(np.random.SeedSequence([self.seed, self.epoch, int(index)]).generate_state(1, np.uint64)[0])
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(item_seed)
            random.seed(item_seed)
            np.random.seed(item_seed % (2**32))
            try:
                return self.dataset[index]
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)


def make_loader(dataset: Dataset, batch_size: int, num_workers: int = 0, **kwargs: Any) -> DataLoader:
    """A loader of ``dataset`` in dataset order (evaluation), or with ``batch_sampler=`` (training)."""
    if "batch_sampler" in kwargs:
        return DataLoader(dataset, num_workers=num_workers, collate_fn=collate, **kwargs)
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, collate_fn=collate)


def dataset_labels(dataset: Any) -> Tensor:
    labels = getattr(dataset, "labels", None)
    if labels is None:
        raise TypeError(
            f"dataset must expose `labels`, a LongTensor (N, L) (the pml_suprank.data contract); "
            f"got {type(dataset).__name__} without it"
        )
    labels = torch.as_tensor(labels).long()
    return labels[:, None] if labels.dim() == 1 else labels


def embed_loader(
    model: nn.Module,
    dataloader: DataLoader,
    accelerator: Any = None,
    *,
    progress: bool = False,
    description: str = "embedding",
    embedding_cache: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(embeddings (N, D) float32 on CPU, labels (N, L), indices (N,))`` of ``dataloader`` in dataset order
    (:func:`pml_suprank.data.cached_embeddings`); a prepared dataloader is sharded, every process gets all."""
    return cached_embeddings(model, dataloader, embedding_cache, accelerator=accelerator, progress=progress,
                             description=description)  # fmt: skip


def build_sampler(config: Any, labels: np.ndarray, num_replicas: int, rank: int) -> Any:
    """The batch sampler of ``config`` over ``labels (N, L)``, sharded over ``num_replicas`` processes."""
    from .. import samplers

    c, shard = config, {"seed": config.seed, "num_replicas": num_replicas, "rank": rank}
    if c.sampler == "hierarchical":
        return samplers.HierarchicalSampler(
            labels,
            batch_size=c.batch_size,
            samples_per_class=c.samples_per_class,
            batches_per_super_tuple=c.batches_per_super_tuple,
            super_classes_per_batch=c.super_classes_per_batch,
            **shard,
        )
    return samplers.MPerClassBatchSampler(labels[:, 0], m=c.samples_per_class, batch_size=c.batch_size, **shard)


def build_memory(config: Any, model: nn.Module, loss: nn.Module, dataset: Any, label_levels: int) -> nn.Module | None:
    """The ``RankingMemory`` of ``config`` wrapping ``loss`` (``None`` when ``memory_size == 0``)."""
    c = config
    if c.memory_size <= 0:
        return None
    from ..memory import RankingMemory

    return RankingMemory(
        loss,
        embedding_size=int(getattr(model, "embedding_size", 0) or _infer_dim(model, dataset)),
        memory_size=c.memory_size,
        warmup_steps=c.memory_warmup_steps,
        label_levels=label_levels if c.hierarchical_labels else None,
    )


def _infer_dim(model: nn.Module, dataset: Any) -> int:
    item = dataset[0]
    with eval_mode(model), torch.no_grad():
        return int(model(item["image"][None]).shape[-1])
