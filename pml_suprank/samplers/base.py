"""Epoch plan, sharding, resumable state and drawing helpers shared by the batch samplers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Sampler

from .._validation import check_positive_int
from ..collectives import get_rank, get_world_size

__all__ = [
    "ShardedBatchSampler",
    "SmallClassPolicy",
    "as_int_array",
    "check_group_size",
    "deal",
    "draw",
    "groups_per_class",
    "resolve_replicas",
]

SmallClassPolicy = Literal["replace", "skip"]


def as_int_array(labels: Any, name: str = "labels") -> np.ndarray:
    """``labels`` (a tensor, an array or nested lists) as an int64 array; ``TypeError`` for non-integer values."""
    try:
        arr = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    except (TypeError, ValueError) as err:  # ragged rows, a dtype numpy does not have
        raise TypeError(f"{name} must be array-like of integers; got {type(labels).__name__}") from err
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype; got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def resolve_replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, each defaulting to the ``torch.distributed`` world (1, 0 without one)."""
    num_replicas = check_positive_int("num_replicas", get_world_size() if num_replicas is None else num_replicas)
    rank = check_positive_int("rank", (get_rank() if num_replicas > 1 else 0) if rank is None else rank, minimum=0)
    if rank >= num_replicas:
        raise ValueError(f"rank must lie in [0, num_replicas - 1] = [0, {num_replicas - 1}]; got rank={rank}")
    return num_replicas, rank


def draw(rng: np.random.Generator, pool: np.ndarray, size: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """``size`` items of ``pool``, without replacement while possible (items not in ``exclude`` first; ``O(size +
    |exclude|)`` when ``pool`` is large enough)."""
    if exclude is not None and pool.size >= size + exclude.size:  # at most |exclude| of the candidates are excluded
        candidates = rng.choice(pool, size + exclude.size, replace=False)
        return candidates[~np.isin(candidates, exclude)][:size]
    if exclude is not None and exclude.size:
        fresh = pool[~np.isin(pool, exclude)]
        if fresh.size >= size:
            return rng.choice(fresh, size, replace=False)
        rest, short = pool[np.isin(pool, exclude)], size - pool.size  # short > 0: the pool holds fewer than size
        if short <= 0:
            return np.concatenate([rng.permutation(fresh), rng.choice(rest, size - fresh.size, replace=False)])
        return np.concatenate([rng.permutation(fresh), rng.permutation(rest), rng.choice(pool, short, replace=True)])
    if pool.size >= size:
        return rng.choice(pool, size, replace=False)
    return np.concatenate([rng.permutation(pool), rng.choice(pool, size - pool.size, replace=True)])


def groups_per_class(sizes: np.ndarray, m: int, groups_per_batch: int, *, pad: bool = True) -> np.ndarray:
    """``ceil(n_c / m)`` groups of ``m`` per class of ``sizes`` (at least one), capped at the number of batches of
    ``groups_per_batch`` groups they make (rounded up with ``pad``, else down): a class gives one group per batch."""
    k = np.maximum(1, -(-sizes // m))
    while True:
        total = int(k.sum())
        nb = -(-total // groups_per_batch) if pad else total // groups_per_batch
        if nb < 1:
            raise ValueError(
                f"labels provide {total} groups of m={m}, fewer than one global batch of {groups_per_batch} groups; "
                "use drop_last=False"
            )
        if k.max() <= nb:
            return k
        k = np.minimum(k, nb)


def deal(
    rng: np.random.Generator, owner: np.ndarray, num_batches: int, groups_per_batch: int, num_classes: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Deal groups, ``owner`` the class of each (a class's groups contiguous and at most ``num_batches``), into
    ``num_batches`` batches, position ``p`` into batch ``p % num_batches``, so that a batch never holds a class twice;
    yields, batch by batch, its group positions and the distinct other classes that complete it to
    ``groups_per_batch`` groups (drawn from ``rng`` at that batch's turn)."""
    for sel in (np.arange(b, owner.size, num_batches) for b in range(num_batches)):  # positions p with p % nb == b
        missing = groups_per_batch - sel.size
        if missing <= 0:
            yield sel, np.empty(0, dtype=np.int64)
        else:
            yield sel, rng.choice(np.setdiff1d(np.arange(num_classes), owner[sel]), missing, replace=False)


class ShardedBatchSampler(Sampler[list[int]]):
    """Epoch plan, sharding and resumable state of the batch samplers: ``_global_plan(rng)`` returns the global batches
    of an epoch (``rng = np.random.default_rng((seed, epoch))``), each a list of *parts* ``(groups, group_size)``;
    with ``num_replicas = R``, rank ``r`` takes the ``r``-th ``1/R`` of every part's groups, interleaved part by part
    (whole class groups of a global batch of ``R * batch_size``)."""

    def __init__(self, batch_size: int, seed: int, num_replicas: int | None, rank: int | None) -> None:
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.seed = check_positive_int("seed", seed, minimum=0)
        self.num_replicas, self.rank = resolve_replicas(num_replicas, rank)
        self.drop_last = True  # every batch has exactly batch_size indices (read by accelerate's BatchSamplerShard)
        self.epoch = 0
        self._position = 0  # local batches handed out in the current pass over `epoch`
        self._resume_from = 0  # first batch of the next pass (set by load_state_dict)
        self._cache: tuple[int, list[list[int]]] | None = None

    def _global_plan(self, rng: np.random.Generator) -> list[list[np.ndarray]]:
        raise NotImplementedError

    def _num_global_batches(self) -> int:
        raise NotImplementedError

    def _fingerprint(self) -> dict[str, Any]:
        """What a saved ``state_dict`` must agree with to resume (the subclass adds its own size parameters)."""
        return {
            "sampler": type(self).__name__,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "batch_size": self.batch_size,
            "num_batches": self._num_global_batches(),
        }

    def _local_batches(self, epoch: int) -> list[list[int]]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng((self.seed, epoch))
        R, r = self.num_replicas, self.rank
        local = []
        for parts in self._global_plan(rng):
            slices = [part[r * (part.shape[0] // R) : (r + 1) * (part.shape[0] // R)] for part in parts]
            # interleave the parts group by group: [p0 g0, p1 g0, p0 g1, p1 g1, ...]
            local.append(np.stack(slices, axis=1).reshape(-1).tolist())
        self._cache = (epoch, local)
        return local

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        """All local batches of ``epoch`` (default: the current epoch), without touching the iteration state."""
        return [list(b) for b in self._local_batches(self.epoch if epoch is None else int(epoch))]

    def __len__(self) -> int:
        return self._num_global_batches()

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._local_batches(self.epoch)
        start, self._resume_from = self._resume_from, 0
        self._position = start
        for i in range(start, len(batches)):
            self._position = i + 1
            yield list(batches[i])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next iteration yields (the epoch restored by ``load_state_dict`` keeps the
        resume position)."""
        epoch = check_positive_int("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self._resume_from = 0
            self._position = 0
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position", ...}``; ``position`` = batches already handed out in this epoch (with
        ``num_workers > 0`` the loader reads ahead: overwrite it with the batches your loop consumed)."""
        return {"epoch": self.epoch, "position": self._position, **self._fingerprint()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``epoch`` and the position: the next iteration continues exactly where the saved one stopped."""
        if not isinstance(state_dict, dict) or "epoch" not in state_dict or "position" not in state_dict:
            raise ValueError(f"state_dict must be a dict with keys 'epoch' and 'position'; got {state_dict!r}")
        mine = self._fingerprint()
        diff = {k: (state_dict[k], v) for k, v in mine.items() if k in state_dict and state_dict[k] != v}
        if diff:
            raise ValueError(
                "state_dict was saved by a sampler with a different configuration (saved, current): "
                + ", ".join(f"{k}={a!r} vs {b!r}" for k, (a, b) in diff.items())
            )
        position = check_positive_int("state_dict['position']", state_dict["position"], minimum=0)
        if position > self._num_global_batches():
            raise ValueError(
                f"state_dict['position'] must be <= the number of batches = {self._num_global_batches()}; "
                f"got {position}"
            )
        self.epoch = check_positive_int("state_dict['epoch']", state_dict["epoch"], minimum=0)
        self._position = position
        self._resume_from = position


def check_group_size(m: Any, batch_size: int, minimum: int = 1) -> int:
    """``m`` checked as a group size of ``batch_size``: an int >= ``minimum`` dividing ``batch_size``."""
    m = check_positive_int("m", m, minimum=minimum)
    if m > batch_size:
        raise ValueError(f"m must be <= batch_size = {batch_size}; got m={m}")
    if batch_size % m:
        raise ValueError(f"batch_size must be a multiple of m = {m}; got batch_size={batch_size}")
    return m
