"""Decomposability gap of a retrieval metric (SupRank Eq. 6)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_embeddings, check_labels
from .evaluator import RetrievalEvaluator

__all__ = ["decomposability_gap"]


def decomposability_gap(
    embeddings: Tensor,
    labels: Tensor,
    batch_size: int,
    metric: str = "ap",
    *,
    num_repeats: int = 1,
    generator: torch.Generator | None = None,
    evaluator: RetrievalEvaluator | None = None,
) -> dict[str, Any]:
    """``DG = (1/K) Σ_b M_b − M``: mean metric over random batches minus the metric on the whole set (Eq. 6).

    ``K = N // batch_size`` shuffled batches (remainder dropped); batches without any positive are skipped
    (``"num_skipped_batches"``). A positive gap means the batch estimate is optimistic.

    Args:
        embeddings: ``(N, D)`` embeddings.
        labels: ``(N,)`` or ``(N, L)`` labels.
        batch_size: ``B`` (``2 <= B <= N``).
        metric: a key of :meth:`RetrievalEvaluator.evaluate`'s result, e.g. ``"ap"``, ``"h_ap"``, ``"recall_at_1"``.
        num_repeats: independent shuffles (``K · num_repeats`` batches in total).
        generator: ``torch.Generator`` of the shuffles (default: ``torch.Generator().manual_seed(0)``).
        evaluator: the evaluator to use (default ``RetrievalEvaluator()``).

    Returns:
        ``{"gap", "batch_mean", "full", "num_batches", "num_skipped_batches"}``.
    """
    embeddings = check_embeddings("embeddings", embeddings)
    labels = check_labels("labels", labels, embeddings.shape[0])
    n = embeddings.shape[0]
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 2 <= batch_size <= n:
        raise ValueError(f"batch_size must be an int in [2, N={n}]; got {batch_size!r}")
    if isinstance(num_repeats, bool) or not isinstance(num_repeats, int) or num_repeats < 1:
        raise ValueError(f"num_repeats must be a positive int; got {num_repeats!r}")
    evaluator = evaluator if evaluator is not None else RetrievalEvaluator()
    full = evaluator.evaluate(embeddings, labels)
    if metric not in full or not isinstance(full[metric], float):
        valid = sorted(k for k, v in full.items() if isinstance(v, float))
        raise ValueError(f"unknown metric {metric!r}; valid names: {valid}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    values, skipped = [], 0
    num_batches = n // batch_size
    for _ in range(num_repeats):
        perm = torch.randperm(n, generator=generator).to(embeddings.device)
        for b in range(num_batches):
            idx = perm[b * batch_size : (b + 1) * batch_size]
            value = evaluator.evaluate(embeddings[idx], labels[idx])[metric]
            if value != value:  # NaN: no query of the batch has a positive
                skipped += 1
            else:
                values.append(value)
    batch_mean = sum(values) / len(values) if values else float("nan")
    return {
        "gap": batch_mean - full[metric],
        "batch_mean": batch_mean,
        "full": full[metric],
        "num_batches": len(values),
        "num_skipped_batches": skipped,
    }
