"""Proxy-based decomposability loss L_DG* (SupRank paper Eq. 8; NormSoftmax), used by ROADMAP++ and HAPPIER."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.reducers import MeanReducer
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
from torch import nn

from .._async_check import check_async
from .._precision import float32_forward
from .._similarity import normalized_logits
from .._validation import check_positive, check_positive_int
from ._inputs import check_embedding_size, check_indices_tuple, prepare_inputs, reduce_loss_dict
from .compile_guard import GuardedCompileMixin

__all__ = ["ClusterLoss"]


class ClusterLoss(GuardedCompileMixin, BaseMetricLossFunction):
    """Cluster (proxy) loss L_DG* (SupRank paper Eq. 8): ``CE(E · normalize(W)ᵀ / η, y)``.

    One learnable proxy per (fine) class, L2-normalised in the forward pass; the embeddings are used as given. The
    proxies ``W`` are the module's only ``nn.Parameter``: give them an optimizer, as for any PML loss with parameters
    (the reference uses Adam with lr 10).

    Args:
        num_classes: number of classes ``C`` (labels must lie in ``[0, C)``).
        embedding_size: embedding dimension ``d``.
        temperature: ``η`` (0.05).
        **kwargs: PML options (``reducer``, ``embedding_regularizer``, ...).

    Shapes: ``embeddings (B, d)``, ``labels (B,)``; returns a scalar; no ``ref_emb``. Proxies start ``U(−1/√d, 1/√d)``.
    """

    uses_reference_set = False

    def __init__(self, num_classes: int, embedding_size: int, temperature: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.embedding_size = check_positive_int("embedding_size", embedding_size)
        self.temperature = check_positive("temperature", temperature)
        bound = 1.0 / math.sqrt(embedding_size)
        self.proxies = nn.Parameter(torch.empty(num_classes, embedding_size).uniform_(-bound, bound))

    @float32_forward
    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """Compute L_DG*; see the class docstring."""
        if ref_emb is not None and ref_emb is not embeddings:
            raise ValueError("ClusterLoss does not take ref_emb/ref_labels: its proxies are the reference set")
        embeddings, labels, _, _, _ = prepare_inputs(type(self).__name__, embeddings, labels, None, None)
        return self.prepared_forward(embeddings, labels, indices_tuple)

    def prepared_forward(self, embeddings, labels, indices_tuple=None):
        """:meth:`forward` on inputs a combined loss has already validated (``prepare_inputs``); an ``indices_tuple``
        weights each item by how often it appears in it, as PML's proxy losses do."""
        self.reset_stats()
        check_indices_tuple(indices_tuple, embeddings.shape[0], embeddings.shape[0])
        check_embedding_size(embeddings, self.embedding_size)
        check_async(  # labels in [0, C) iff labels // C == 0; no host round trip on accelerators
            (torch.div(labels, self.num_classes, rounding_mode="floor") == 0).all(),
            lambda: ValueError(
                f"labels must lie in [0, num_classes={self.num_classes}); got values in "
                f"[{int(labels.min())}, {int(labels.max())}]"
            ),
            f"ClusterLoss: labels must lie in [0, num_classes={self.num_classes})",
        )
        reduce = type(self.reducer) is MeanReducer and not self.collect_stats and indices_tuple is None
        loss_dict = self._loss_dict(embeddings, labels, indices_tuple, reduce=reduce)
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return reduce_loss_dict(self.reducer, loss_dict, embeddings, labels)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        """PML loss dict of per-item cross-entropies (element reduction)."""
        check_indices_tuple(indices_tuple, embeddings.shape[0], embeddings.shape[0])
        return self._loss_dict(embeddings, labels, indices_tuple, reduce=False)

    def _loss_dict(self, embeddings, labels, indices_tuple=None, *, reduce: bool) -> dict:
        """Per-item cross-entropies (weighted by ``indices_tuple`` as PML's proxy losses), or (``reduce``: under PML's
        plain ``MeanReducer``, no ``indices_tuple``) their mean, already reduced."""
        proxies = self.proxies if self.proxies.dtype == embeddings.dtype else self.proxies.to(embeddings.dtype)
        labels = labels if labels.dtype == torch.long else labels.long()
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            logits = normalized_logits(embeddings, proxies, self.temperature)  # x · normalize(p) / T
        if reduce:
            loss = F.cross_entropy(logits, labels)
            return {"loss": {"losses": loss, "indices": None, "reduction_type": "already_reduced"}}
        losses = F.cross_entropy(logits, labels, reduction="none")
        if indices_tuple is not None:
            losses = losses * lmu.convert_to_weights(indices_tuple, labels, dtype=losses.dtype)
        indices = torch.arange(len(labels), device=embeddings.device)
        return {"loss": {"losses": losses, "indices": indices, "reduction_type": "element"}}
