"""What a training set allows: the batch an m-per-class sampler can fill (:func:`fit_batch`; all processes together
need ``num_processes * batch_size / m`` distinct classes) and whether a run is long enough (:func:`short_run_warning`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._validation import check_positive_int

__all__ = ["MIN_STEPS", "BatchFit", "fit_batch", "short_run_warning"]

#: a run with fewer optimizer steps than this gets a warning (a model hardly moves from its initialisation)
MIN_STEPS = 200


@dataclass(frozen=True)
class BatchFit:
    """The batch a training set allows: ``batch_size`` per process (a multiple of m = ``samples_per_class``), its
    ``num_classes`` and ``images_per_class`` ``(fewest, median, most)``; ``changed`` from / ``fits`` the request."""

    batch_size: int
    samples_per_class: int
    num_classes: int
    images_per_class: tuple[int, int, int]
    changed: bool
    fits: bool

    def describe_data(self) -> str:
        """``"6 classes (3 to 9 images each)"``."""
        low, _, high = self.images_per_class
        each = f"{low} images each" if low == high else f"{low} to {high} images each"
        return f"{self.num_classes} classes ({each})"


def fit_batch(labels: Any, *, batch_size: int, samples_per_class: int, num_processes: int = 1) -> BatchFit:
    """The batch that the fine classes (column 0) of ``labels`` ``(N, L)`` / ``(N,)`` can fill: the requested one
    when ``num_processes * batch_size / m`` classes (at least 2) fill it and most classes have ``m`` images, else ``m``
    = the median images per class (at least 2) and ``batch_size = m * min(batch_size // m_requested, num_classes //
    num_processes)``. ``ValueError``: fewer than 2 classes, or fewer classes than processes."""
    labels = torch.as_tensor(labels)
    fine = labels if labels.dim() == 1 else labels[:, 0]
    for name, value in (("batch_size", batch_size), ("samples_per_class", samples_per_class),
                        ("num_processes", num_processes)):  # fmt: skip
        check_positive_int(name, value)
    _, counts = torch.unique(fine, return_counts=True)
    counts = np.sort(counts.numpy())
    num_classes = len(counts)
    spread = (int(counts[0]), int(np.median(counts)), int(counts[-1])) if num_classes else (0, 0, 0)
    groups = max(batch_size // samples_per_class, 1)
    fits = num_classes >= max(num_processes * groups, 2)
    m = samples_per_class if spread[1] >= samples_per_class else max(2, spread[1])
    new_groups = min(groups, num_classes // num_processes)
    if num_classes < 2 or new_groups < 1 or num_processes * new_groups < 2:
        raise ValueError(
            f"the training set has {num_classes} class(es): a retrieval batch needs at least 2 classes "
            f"(and one per process, {num_processes} process(es)); add classes"
        )
    new_batch = m * new_groups
    changed = (new_batch, m) != (batch_size, samples_per_class)
    return BatchFit(new_batch, m, num_classes, spread, changed, fits)


def short_run_warning(
    steps_per_epoch: int, total_steps: int, *, epochs: int, max_train_steps: int | None, min_steps: int = MIN_STEPS
) -> str | None:
    """One line when a run has fewer than ``min_steps`` optimizer steps, naming the ``--epochs`` /
    ``--max_train_steps`` that would reach them; ``None`` for a long enough run."""
    if total_steps >= min_steps:
        return None
    need_epochs = max(epochs, -(-min_steps // max(steps_per_epoch, 1)))
    fix = f"--epochs {need_epochs}"
    if max_train_steps is not None and max_train_steps < min_steps:
        fix = (f"{fix} " if need_epochs > epochs else "") + f"--max_train_steps {min_steps}"
    return (
        f"warning: only {total_steps} optimizer steps ({steps_per_epoch} per epoch); a model hardly trains in fewer "
        f"than ~{min_steps}: {fix} would reach {min_steps}"
    )
