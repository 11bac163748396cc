"""Batch sampler for multi-label data (E. Ramzi's thesis, Sec. 6.2.1): ``m`` items per sampled label, so every item
of a batch has positives."""

from __future__ import annotations

from typing import Any, get_args

import numpy as np
import torch

from .._validation import check_choice
from ..relevance import check_multilabel
from .base import ShardedBatchSampler, SmallClassPolicy, as_int_array, check_group_size, deal, draw, groups_per_class

__all__ = ["MultiLabelSampler"]


def _label_members(arr: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distinct labels and, for each, the sorted distinct indices of the items carrying it."""
    rows, cols = np.nonzero(arr >= 0)
    values = arr[rows, cols]
    pairs = np.unique(np.stack([values, rows], axis=1), axis=0)  # (label, item), one per membership
    labels, starts = np.unique(pairs[:, 0], return_index=True)
    return labels, np.split(pairs[:, 1], starts[1:])


class MultiLabelSampler(ShardedBatchSampler):
    """Batches of ``batch_size / m`` distinct labels with ``m`` items carrying each label: the epoch plan of
    :class:`~pml_suprank.samplers.MPerClassBatchSampler` with labels for classes (an item of ``(N, M)`` labels,
    ``-1`` = padding, belongs to the group of every label it carries); a group prefers items not yet in the batch.

    Args:
        labels: ``(N, M)`` integer labels per item with ``-1`` padding (tensor, array or nested list), or ``(N,)``
            one label per item; every item needs at least one label.
        m, batch_size: Items per label in a batch (``>= 2``); indices per batch *per process* (a multiple of ``m``).
        seed, num_replicas, rank: As :class:`~pml_suprank.samplers.MPerClassBatchSampler`.
        small_classes: Labels carried by fewer than ``m`` items: ``"replace"`` (duplicates) or ``"skip"``.

    Raises:
        TypeError: non-integer labels or non-int sizes.
        ValueError: bad label shapes or values, an item without labels, ``m < 2``, ``m`` not dividing ``batch_size``,
            fewer usable labels than ``num_replicas * batch_size / m``.
    """

    def __init__(
        self,
        labels: Any,
        m: int,
        batch_size: int,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        small_classes: SmallClassPolicy = "replace",
    ) -> None:
        super().__init__(batch_size, seed, num_replicas, rank)
        self.m = check_group_size(m, self.batch_size, 2)
        self.small_classes = check_choice("small_classes", small_classes, get_args(SmallClassPolicy))
        arr = check_multilabel("labels", torch.from_numpy(as_int_array(labels))).numpy()
        self.num_samples = arr.shape[0]
        all_labels, members = _label_members(arr)
        sizes = np.array([len(x) for x in members])
        keep = sizes >= self.m if self.small_classes == "skip" else np.ones(len(all_labels), bool)
        self.classes = all_labels[keep]
        self._members = [members[i] for i in np.flatnonzero(keep)]
        self.groups_per_batch = self.num_replicas * self.batch_size // self.m
        need = max(self.groups_per_batch, 2)
        if len(self.classes) < need:
            raise ValueError(
                f"labels must contain at least {need} distinct labels"
                + (f" carried by >= m={self.m} items (small_classes='skip')" if self.small_classes == "skip" else "")
                + f" to fill a batch of num_replicas * batch_size / m = {self.groups_per_batch} distinct labels; "
                f"got {len(self.classes)} usable labels (of {len(all_labels)})"
            )
        self._groups = groups_per_class(sizes[keep], self.m, self.groups_per_batch)

    def _num_global_batches(self) -> int:
        return -(-int(self._groups.sum()) // self.groups_per_batch)

    def _fingerprint(self) -> dict[str, Any]:
        return {**super()._fingerprint(), "m": self.m}

    def _batch_groups(self, rng: np.random.Generator, batch_labels: np.ndarray) -> np.ndarray:
        """``(G, m)`` item groups, one per label; the labels with the fewest items draw first."""
        groups = np.empty((len(batch_labels), self.m), dtype=np.int64)
        order = np.argsort([len(self._members[c]) for c in batch_labels], kind="stable")
        for j, i in enumerate(order):  # a group avoids the items of the groups drawn before it
            groups[i] = draw(rng, self._members[int(batch_labels[i])], self.m, exclude=groups[order[:j]].reshape(-1))
        return groups

    def _global_plan(self, rng: np.random.Generator) -> list[list[np.ndarray]]:
        G, nb = self.groups_per_batch, len(self)
        order = rng.permutation(len(self.classes))
        owner = np.repeat(order, self._groups[order])  # a label's groups are contiguous and at most nb
        plan = []
        for sel, extra in deal(rng, owner, nb, G, len(self.classes)):
            plan.append([self._batch_groups(rng, np.concatenate([owner[sel], extra])[rng.permutation(G)])])
        return [plan[i] for i in rng.permutation(nb)]
