"""``RetrievalTorchMetric``: the exact retrieval evaluator as a ``torchmetrics.Metric`` (needs ``torchmetrics``).

The contract of :class:`~pml_suprank.metrics.RetrievalMetric` (states reduced by concatenation; :meth:`compute`
evaluates once, exactly; repeated dataset ``indices`` kept once).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from .evaluator import RetrievalEvaluator
from .retrieval_metric import append_update, dedupe_by_index, make_evaluator

__all__ = ["RetrievalTorchMetric"]


class RetrievalTorchMetric(Metric):
    """Exact retrieval metrics of everything given to ``update``; ``compute`` returns ``{name: 0-d float64 tensor}``.

    Args:
        evaluator: a configured :class:`RetrievalEvaluator` (default: ``RetrievalEvaluator(**evaluator_kwargs)``).
        metric_kwargs: keyword arguments of ``torchmetrics.Metric`` (``process_group``, ``sync_on_compute``, ...).
        **evaluator_kwargs: passed to :class:`RetrievalEvaluator` when ``evaluator`` is None.

    Example:
        >>> metric = RetrievalTorchMetric(k_values=(1, 10))
        >>> metric.update(model(images), labels)   # (B, D), (B,) or (B, L)
        >>> metric.compute()["map_at_r"]
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        evaluator: RetrievalEvaluator | None = None,
        *,
        metric_kwargs: dict[str, Any] | None = None,
        **evaluator_kwargs: Any,
    ) -> None:
        evaluator = make_evaluator(evaluator, evaluator_kwargs)
        super().__init__(**(metric_kwargs or {}))
        self.evaluator = evaluator
        self.add_state("embeddings", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        self.add_state("indices", default=[], dist_reduce_fx="cat")

    def update(self, embeddings: Tensor, labels: Tensor, indices: Tensor | None = None) -> None:
        """Add ``embeddings (B, D)``, ``labels (B,)`` or ``(B, L)`` and optional dataset ``indices (B,)`` (then in
        every update)."""
        append_update(embeddings, labels, indices, (self.embeddings, self.labels, self.indices))

    def compute(self) -> dict[str, Tensor]:
        """Evaluate everything given since the last ``reset`` (gathered across processes by torchmetrics)."""
        if not self.embeddings:
            raise ValueError("RetrievalTorchMetric.compute() called before any update()")
        emb, labels = dim_zero_cat(self.embeddings), dim_zero_cat(self.labels)
        if self.indices:
            emb, labels = dedupe_by_index(emb, labels, dim_zero_cat(self.indices))
        result = self.evaluator.evaluate(emb, labels)
        return {k: torch.tensor(float(v), dtype=torch.float64) for k, v in result.items()}
