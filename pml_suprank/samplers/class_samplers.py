"""``MPerClassSampler``, ``MPerClassBatchSampler`` and ``HierarchicalSampler`` on the epoch plan of
:class:`~pml_suprank.samplers.base.ShardedBatchSampler`. References: SupRank's ``m_per_class_sampler.py``; PML's
``HierarchicalSampler`` (SOP)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any, get_args

import numpy as np
import torch
from torch.utils.data import Sampler

from .._validation import check_choice, check_positive_int
from ..relevance import check_tree
from .base import ShardedBatchSampler, SmallClassPolicy, as_int_array, check_group_size, deal, draw, groups_per_class

__all__ = ["HierarchicalSampler", "MPerClassBatchSampler", "MPerClassSampler"]


def _flat_labels(labels: Any) -> np.ndarray:
    """``(N,)`` int labels from ``(N,)`` or ``(N, L)`` (column 0) labels."""
    arr = as_int_array(labels)
    if arr.ndim == 2:
        arr = arr[:, 0]
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"labels must have shape (N,) or (N, L) with N >= 1; got shape {np.shape(labels)}")
    return arr


class MPerClassBatchSampler(ShardedBatchSampler):
    """Batches of ``batch_size / m`` distinct classes with ``m`` images each (``DataLoader(batch_sampler=...)``).

    One pass cuts every class into ``ceil(n_c / m)`` groups of ``m`` images (at most one per batch) so that no class
    appears twice in a global batch; a batch that is not full is completed with groups of other classes (with
    ``drop_last``, leftover groups are left out). With ``length_before_new_iter`` the epoch is
    ``length_before_new_iter // batch_size`` batches of consecutive passes.

    Args:
        labels: Class labels ``(N,)`` (tensor, array or list of ints); ``(N, L)`` labels use column 0.
        m, batch_size: Images per class in a batch; indices per batch *per process* (a multiple of ``m``).
        length_before_new_iter: Indices per epoch (per process); ``None``: one pass over the dataset.
        seed: Seed of the per-epoch ``np.random.default_rng((seed, epoch))``.
        num_replicas, rank: Processes sharing one global batch and this one's slice (default: the world, else 1, 0).
        small_classes: Classes with fewer than ``m`` images: ``"replace"`` (duplicates in their group) or ``"skip"``.
        drop_last: Leave out the leftover groups instead of completing the last batches.

    Raises:
        ValueError: ``m`` not dividing ``batch_size``, ``length_before_new_iter < batch_size``, fewer usable classes
            than ``num_replicas * batch_size / m``.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> labels = [0, 0, 1, 1, 2, 2, 3, 3]
        >>> sampler = MPerClassBatchSampler(labels, 2, 4, 12)  # 12 // 4 = 3 batches per epoch
        >>> loader = DataLoader(list(range(8)), batch_sampler=sampler)  # batch_sampler=, not sampler=
        >>> len(loader), sum(len(batch) for batch in loader)
        (3, 12)
    """

    def __init__(
        self,
        labels: Any,
        m: int,
        batch_size: int,
        length_before_new_iter: int | None = None,
        *,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        small_classes: SmallClassPolicy = "replace",
        drop_last: bool = False,
    ) -> None:
        arr = _flat_labels(labels)
        super().__init__(batch_size, seed, num_replicas, rank)
        if length_before_new_iter is not None:
            length_before_new_iter = check_positive_int("length_before_new_iter", length_before_new_iter)
            if length_before_new_iter < self.batch_size:
                raise ValueError(
                    f"length_before_new_iter (indices per epoch, as PML) must be >= batch_size = {self.batch_size}; "
                    f"got {length_before_new_iter}"
                )
        self.length_before_new_iter = length_before_new_iter
        self.m = check_group_size(m, self.batch_size, 1)
        self.small_classes = check_choice("small_classes", small_classes, get_args(SmallClassPolicy))
        self.pad = not bool(drop_last)
        self.num_samples = arr.size
        classes, inverse, counts = np.unique(arr, return_inverse=True, return_counts=True)
        order = np.argsort(inverse, kind="stable")
        members = np.split(order, np.cumsum(counts)[:-1])
        keep = counts >= self.m if self.small_classes == "skip" else np.ones(len(classes), bool)
        self.classes = classes[keep]
        self._members = [members[i] for i in np.flatnonzero(keep)]
        self.groups_per_batch = self.num_replicas * self.batch_size // self.m
        if len(self.classes) < self.groups_per_batch:
            raise ValueError(
                f"labels must contain at least {self.groups_per_batch} classes"
                + (f" with >= m={self.m} images (small_classes='skip')" if self.small_classes == "skip" else "")
                + f" to fill a batch of num_replicas * batch_size / m = {self.groups_per_batch} distinct classes "
                f"(PML: m * number of classes must be >= batch_size); got {len(self.classes)} usable classes "
                f"(of {len(classes)})"
            )
        sizes = np.array([len(x) for x in self._members])
        self._chunks = groups_per_class(sizes, self.m, self.groups_per_batch, pad=self.pad)

    def _pass_batches(self) -> int:
        """Batches of one pass over the dataset (the epoch without ``length_before_new_iter``)."""
        total = int(self._chunks.sum())
        G = self.groups_per_batch
        return -(-total // G) if self.pad else total // G

    def _num_global_batches(self) -> int:
        if self.length_before_new_iter is not None:
            return self.length_before_new_iter // self.batch_size
        return self._pass_batches()

    def _fingerprint(self) -> dict[str, Any]:
        return {**super()._fingerprint(), "m": self.m, "length_before_new_iter": self.length_before_new_iter}

    def _class_groups(self, rng: np.random.Generator, c: int, k: int) -> np.ndarray:
        """``k`` groups of ``m`` images of class ``c``; no image repeated inside a group when ``n_c >= m``."""
        m, pool = self.m, self._members[c]
        perm = rng.permutation(pool)
        if perm.size < m:  # small class, replacement policy
            return draw(rng, pool, m)[None]
        full = perm[: min(k * m, (perm.size // m) * m)].reshape(-1, m)
        if full.shape[0] == k:
            return full
        rest = perm[full.size :]
        last = np.concatenate([rest, rng.choice(perm[: full.size], m - rest.size, replace=False)])
        return np.concatenate([full, last[None]])

    def _global_plan(self, rng: np.random.Generator) -> list[list[np.ndarray]]:
        plan = self._one_pass(rng)
        while len(plan) < self._num_global_batches():  # length_before_new_iter: consecutive passes, the last one cut
            plan.extend(self._one_pass(rng))
        return plan[: self._num_global_batches()]

    def _one_pass(self, rng: np.random.Generator) -> list[list[np.ndarray]]:
        G, nb, m = self.groups_per_batch, self._pass_batches(), self.m
        class_order = rng.permutation(len(self.classes))
        groups = [self._class_groups(rng, int(c), int(self._chunks[c])) for c in class_order]
        owner = np.repeat(class_order, [g.shape[0] for g in groups])
        groups = np.concatenate(groups)
        if not self.pad and groups.shape[0] > nb * G:  # leave out random groups
            keep = np.sort(rng.choice(groups.shape[0], nb * G, replace=False))
            groups, owner = groups[keep], owner[keep]
        plan = []
        for sel, extra in deal(rng, owner, nb, G, len(self.classes)):
            bg = np.concatenate([groups[sel]] + [draw(rng, self._members[int(c)], m)[None] for c in extra])
            plan.append([bg[rng.permutation(G)]])
        return [plan[i] for i in rng.permutation(nb)]


class MPerClassSampler(Sampler[int]):
    """PML's ``MPerClassSampler``: a flat index stream of batches of ``batch_size / m`` distinct classes with ``m``
    images each (``DataLoader(dataset, sampler=sampler, batch_size=batch_size)``).

    PML's arguments, order, defaults and meaning: ``len(sampler)`` is ``length_before_new_iter`` rounded down to a
    multiple of ``batch_size`` (``batch_size=None``: to whole passes of ``m * C`` indices). The stream is the
    flattened plan of :class:`MPerClassBatchSampler` (:attr:`batch_sampler`), with its keyword-only additions
    (``docs/coming-from-pml.md``).

    Args:
        labels: Class labels ``(N,)``; ``(N, L)`` labels use column 0.
        m, batch_size: Images per class (``m`` consecutive indices) and the ``DataLoader``'s ``batch_size`` (a
            multiple of ``m``; ``None``: a pass over the classes).
        length_before_new_iter: Indices per epoch (PML's default 100000).
        seed, num_replicas, rank, small_classes, drop_last: As :class:`MPerClassBatchSampler` (``num_replicas`` must
            be 1 with ``batch_size=None``).

    Raises:
        ValueError: where PML asserts (``length_before_new_iter < batch_size``, ``m * C < batch_size``,
            ``batch_size % m != 0``) and for a bad type or size (naming the argument).
    """

    def __init__(
        self,
        labels: Any,
        m: int,
        batch_size: int | None = None,
        length_before_new_iter: int = 100000,
        *,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        small_classes: SmallClassPolicy = "replace",
        drop_last: bool = False,
    ) -> None:
        arr = _flat_labels(labels)
        m = check_positive_int("m", m)
        length = check_positive_int("length_before_new_iter", length_before_new_iter)
        if batch_size is None:
            if num_replicas not in (None, 1) or rank not in (None, 0):
                raise ValueError(
                    "num_replicas must be 1 with batch_size=None (one pass over the classes is the unit; give "
                    f"batch_size to shard); got num_replicas={num_replicas}, rank={rank}"
                )
            num_replicas, rank = 1, 0
            check_choice("small_classes", small_classes, get_args(SmallClassPolicy))
            classes, counts = np.unique(arr, return_counts=True)
            usable = int((counts >= m).sum()) if small_classes == "skip" else len(classes)
            if usable < 1:
                raise ValueError(f"labels must contain a class with >= m={m} images (small_classes='skip'); got none")
            per_pass = m * usable
            # PML: whole passes when the length holds one, else a part of one pass
            self._length = length - length % per_pass if length >= per_pass else length
            inner_batch, inner_length = per_pass, max(self._length, per_pass)
        else:
            batch_size = check_positive_int("batch_size", batch_size)
            if length < batch_size:
                raise ValueError(
                    f"length_before_new_iter (indices per epoch) must be >= batch_size = {batch_size}; got {length}"
                )
            self._length = length - length % batch_size
            inner_batch, inner_length = batch_size, self._length
        self.batch_size = batch_size
        self.m = m
        self.length_before_new_iter = length
        self._batches = MPerClassBatchSampler(
            arr, m, inner_batch, inner_length, seed=seed, num_replicas=num_replicas, rank=rank,
            small_classes=small_classes, drop_last=drop_last,
        )  # fmt: skip

    @property
    def batch_sampler(self) -> MPerClassBatchSampler:
        """The same plan as whole batches, for ``DataLoader(batch_sampler=...)`` (sharing epoch and position)."""
        return self._batches

    @property
    def epoch(self) -> int:
        return self._batches.epoch

    def __len__(self) -> int:
        """Indices per epoch (per process), as PML's."""
        return self._length

    def __iter__(self) -> Iterator[int]:
        """``len(self)`` indices: batch after batch of the plan, ``m`` consecutive indices per class."""
        left = self._length
        for batch in self._batches:
            if left <= 0:
                break
            yield from batch[:left]
            left -= len(batch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose stream the next iteration yields (as ``DistributedSampler``)."""
        self._batches.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position", ...}`` of :attr:`batch_sampler` (``position`` counts whole batches)."""
        return self._batches.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume where a saved stream stopped (at a batch boundary)."""
        self._batches.load_state_dict(state_dict)


class HierarchicalSampler(ShardedBatchSampler):
    """The Stanford Online Products sampler: every batch is drawn from ``super_classes_per_batch`` super-classes.

    For each of the ``C(S, k)`` combinations of ``k`` super-classes the epoch has ``batches_per_super_tuple`` batches;
    in each, every super-class fills ``batch_size / k`` slots with ``samples_per_class`` images of distinct classes
    (PML's semantics; additions are keyword-only). Differences from PML (``docs/samplers-memory.md``): seeded and
    shardable, tree labels on ``(inner_label, outer_label)``, always ``batch_size`` indices, super-classes alternating
    group by group. ``samples_per_class="all"``: whole classes while they fit in ``batch_size / k`` slots (batch
    sizes vary; not shardable).

    Args:
        labels: ``(N, L)`` integer labels, column 0 = finest (the order of PML's HierarchicalSampler).
        batch_size: Indices per batch *per process*; a multiple of ``k * samples_per_class`` (of ``k`` for ``"all"``).
        samples_per_class, super_classes_per_batch: Images per class (or ``"all"``) and super-classes (``k``) per batch.
        batches_per_super_tuple: Batches per combination of super-classes and epoch.
        inner_label, outer_label: Columns of the class and of the super-class labels.
        seed, num_replicas, rank: As :class:`MPerClassBatchSampler`.
        small_classes: Classes with fewer than ``samples_per_class`` images: ``"replace"`` or ``"skip"``.

    Raises:
        ValueError: A bad size or column, labels that are not a tree on ``(inner_label, outer_label)``, fewer than
            ``k`` super-classes.
    """

    def __init__(
        self,
        labels: Any,
        batch_size: int,
        samples_per_class: int | str,
        batches_per_super_tuple: int = 4,
        super_classes_per_batch: int = 2,
        inner_label: int = 0,
        outer_label: int = 1,
        *,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        small_classes: SmallClassPolicy = "replace",
    ) -> None:
        super().__init__(batch_size, seed, num_replicas, rank)
        self.whole_classes = isinstance(samples_per_class, str)
        if self.whole_classes and samples_per_class != "all":
            raise ValueError(f"samples_per_class must be a positive int or 'all' (as PML); got {samples_per_class!r}")
        self.samples_per_class = (
            samples_per_class if self.whole_classes else check_positive_int("samples_per_class", samples_per_class)
        )
        self.batches_per_super_tuple = check_positive_int("batches_per_super_tuple", batches_per_super_tuple)
        self.super_classes_per_batch = k = check_positive_int("super_classes_per_batch", super_classes_per_batch)
        self.small_classes = check_choice("small_classes", small_classes, get_args(SmallClassPolicy))
        self._check_sizes()
        arr = as_int_array(labels)
        if arr.ndim != 2 or arr.shape[0] == 0:
            raise ValueError(f"labels must have shape (N, L) with N >= 1 and L >= 2; got shape {arr.shape}")
        width = arr.shape[1]
        for name, col in (("inner_label", inner_label), ("outer_label", outer_label)):
            if isinstance(col, bool) or not isinstance(col, (int, np.integer)) or not -width <= col < width:
                raise ValueError(f"{name} must be a column index of labels (L = {width}); got {col!r}")
        self.inner_label, self.outer_label = int(inner_label), int(outer_label)
        self.num_samples = arr.shape[0]
        inner, outer = arr[:, self.inner_label], arr[:, self.outer_label]
        check_tree(torch.from_numpy(np.stack([inner, outer], 1)), name=f"labels[:, [{inner_label}, {outer_label}]]")
        supers = self._super_classes(inner, outer)
        if len(supers) < k:
            skip = self.small_classes == "skip" and not self.whole_classes
            usable = f" with classes of >= {self.samples_per_class} images" if skip else ""
            raise ValueError(
                f"labels must contain at least super_classes_per_batch = {k} super-classes (column {outer_label})"
                f"{usable}; got {len(supers)}"
            )
        if sum(len(v) for v in supers.values()) < 2:
            raise ValueError("labels must contain at least 2 classes; got a single class")
        self.super_classes = sorted(supers)
        self._supers = supers
        self.super_tuples = list(itertools.combinations(self.super_classes, k))
        unit = k * (1 if self.whole_classes else self.samples_per_class)
        self.groups_per_part = self.num_replicas * self.batch_size // unit

    def _check_sizes(self) -> None:
        k = self.super_classes_per_batch
        if self.whole_classes:
            if self.batch_size % k:
                raise ValueError(
                    f"batch_size must be a multiple of super_classes_per_batch = {k}; got batch_size={self.batch_size}"
                )
            if self.num_replicas != 1:
                raise ValueError(
                    "samples_per_class='all' gives batches of varying size, which cannot be sharded: use "
                    f"num_replicas=1 (and let accelerate deal whole batches); got num_replicas={self.num_replicas}"
                )
            return
        unit = k * self.samples_per_class
        if self.samples_per_class > self.batch_size:
            raise ValueError(
                f"samples_per_class must be <= batch_size = {self.batch_size}; got {self.samples_per_class}"
            )
        if self.batch_size % unit:
            raise ValueError(
                "batch_size must be a multiple of super_classes_per_batch * samples_per_class = "
                f"{k} * {self.samples_per_class} = {unit}; got batch_size={self.batch_size}"
            )

    def _super_classes(self, inner: np.ndarray, outer: np.ndarray) -> dict[int, list[np.ndarray]]:
        """``{super-class: [indices of each of its usable classes]}``."""
        supers: dict[int, list[np.ndarray]] = {}
        order = np.lexsort((inner, outer))  # grouped by (super-class, class)
        pairs, starts = np.unique(np.stack([outer[order], inner[order]], 1), axis=0, return_index=True)
        sub_batch = self.batch_size // self.super_classes_per_batch
        for (s, _c), members in zip(pairs, np.split(order, starts[1:]), strict=True):
            if self.whole_classes:
                supers.setdefault(int(s), [])
                if members.size <= sub_batch:  # as PML: a class that never fits is never sampled
                    supers[int(s)].append(members)
            elif members.size >= self.samples_per_class or self.small_classes == "replace":
                supers.setdefault(int(s), []).append(members)
        if self.whole_classes:
            empty = [s for s, classes in supers.items() if not classes]
            if empty:
                raise ValueError(
                    f"samples_per_class='all': super-class {empty[0]} (column {self.outer_label}) has no class of at "
                    f"most batch_size / super_classes_per_batch = {sub_batch} images, so none of its classes fits in "
                    "a batch; raise batch_size or use an integer samples_per_class"
                )
        return supers

    def _num_global_batches(self) -> int:
        return len(self.super_tuples) * self.batches_per_super_tuple

    def _fingerprint(self) -> dict[str, Any]:
        return {**super()._fingerprint(), "samples_per_class": self.samples_per_class}

    def _part(self, rng: np.random.Generator, super_class: int) -> np.ndarray:
        classes = self._supers[super_class]
        n, spc = self.groups_per_part, self.samples_per_class
        picks = np.concatenate([rng.permutation(len(classes)) for _ in range(math.ceil(n / len(classes)))])[:n]
        groups = np.empty((n, spc), dtype=np.int64)
        for c in np.unique(picks):
            rows = np.flatnonzero(picks == c)
            groups[rows] = draw(rng, classes[int(c)], rows.size * spc).reshape(rows.size, spc)
        return groups

    def _whole_classes_part(self, rng: np.random.Generator, super_class: int) -> np.ndarray:
        """PML's ``"all"``: whole classes in random order while they fit in ``batch_size / k`` slots."""
        room = self.batch_size // self.super_classes_per_batch
        taken: list[np.ndarray] = []
        for c in rng.permutation(len(self._supers[super_class])):
            members = self._supers[super_class][int(c)]
            if members.size <= room:
                taken.append(rng.permutation(members))
                room -= members.size
            if room == 0:
                break
        return np.concatenate(taken)

    def _global_plan(self, rng: np.random.Generator) -> list[list[np.ndarray]]:
        plan = []
        for tup in self.super_tuples:
            for _ in range(self.batches_per_super_tuple):
                if self.whole_classes:  # one part of varying length: (1, n)
                    plan.append([np.concatenate([self._whole_classes_part(rng, s) for s in tup])[None]])
                else:
                    plan.append([self._part(rng, s) for s in tup])
        return [plan[i] for i in rng.permutation(len(plan))]
