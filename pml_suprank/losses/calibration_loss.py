"""Pair calibration loss L_DG (ROADMAP / SupRank paper Eq. 7): the decomposability term of ROADMAP and ROD-R@k."""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.reducers import AvgNonZeroReducer, MeanReducer

from .._validation import check_choice
from ._inputs import check_similarity, prepare_inputs, reference_mask, similarity_matrix

__all__ = ["CalibrationLoss"]


def _check_margin(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a real number in [-1, 1] (a cosine similarity); got {value!r}")
    return float(value)


def _share_label(labels, ref_labels):
    """``(B, N)`` bool: the query's label set (``(B, M)``, ``-1`` padding) meets the item's (``(N, M')``)."""
    labels = labels.view(labels.shape[0], -1)
    ref_labels = ref_labels.view(ref_labels.shape[0], -1)
    same = torch.zeros(labels.shape[0], ref_labels.shape[0], dtype=torch.bool, device=labels.device)
    for col in labels.unbind(1):  # M passes over a (B, N, M') comparison
        same = same | ((col.view(-1, 1, 1) == ref_labels.unsqueeze(0)).any(2) & (col >= 0).unsqueeze(1))
    return same


class CalibrationLoss(BaseMetricLossFunction):
    """Decomposability loss L_DG (SupRank paper Eq. 7; ROADMAP NeurIPS 2021 Eq. 7).

    ``L_DG = mean_{(q,j)∈Pos} [α − cos(q, j)]₊ + mean_{(q,j)∈Neg} [cos(q, j) − β]₊`` over (query, reference) pairs:
    positives are pushed above ``α`` and negatives below ``β`` so that scores are comparable across batches.

    ``average="active"`` (default) averages each term over its *active* (non-zero) pairs, pooled over the batch — this
    is what the reference code does (PML ``ContrastiveLoss`` + ``AvgNonZeroReducer``); ``average="all"`` averages over
    all positive / negative pairs as written in the paper. Pairs follow the rank losses' conventions (``ref_emb``,
    ``indices_tuple``, ``include_self``). Scores are cosine similarities (embeddings are L2-normalised by the default
    ``CosineSimilarity``, gradient included).

    Args:
        pos_margin: ``α`` (0.9).
        neg_margin: ``β`` (0.6).
        average: ``"active"`` or ``"all"``; ignored when an explicit ``reducer`` is passed.
        include_self: keep the (query, query) pair when the reference set is the batch (reference code).
        multilabel: take ``(B, M)`` label sets padded with ``-1`` (``ref_labels`` ``(N, M)``); a pair is positive
            when the two items share any label (the calibration term of ``ROADMAPLoss(multilabel="per_label")``).
        **kwargs: PML options (``distance``, ``reducer``, ...).

    Shapes: ``embeddings (B, D)``, ``labels (B,)``, optional ``ref_emb (N, D)``, ``ref_labels (N,)``; returns a scalar.
    Loss dict: ``"pos_loss"`` (``pos_pair``) and ``"neg_loss"`` (``neg_pair``).
    """

    def __init__(
        self,
        pos_margin: float = 0.9,
        neg_margin: float = 0.6,
        average: str = "active",
        include_self: bool = False,
        multilabel: bool = False,
        **kwargs,
    ):
        if not isinstance(multilabel, bool):
            raise TypeError(f"multilabel must be a bool; got {type(multilabel).__name__} {multilabel!r}")
        average = check_choice("average", average, ("active", "all"))
        if not isinstance(include_self, bool):
            raise TypeError(f"include_self must be a bool; got {type(include_self).__name__} {include_self!r}")
        # with the default "active" reduction, pairs with a zero loss cannot change the value: they are never built,
        # which keeps a memory of N items at O(B·N) bools instead of O(B·N) index pairs
        self._prune_inactive = kwargs.get("reducer") is None and average == "active"
        if kwargs.get("reducer") is None:
            kwargs["reducer"] = AvgNonZeroReducer() if average == "active" else MeanReducer()
        super().__init__(**kwargs)
        check_similarity(type(self).__name__, self.distance)
        self.pos_margin = _check_margin("pos_margin", pos_margin)
        self.neg_margin = _check_margin("neg_margin", neg_margin)
        self.average = average
        self.include_self = include_self
        self.multilabel = multilabel

    def get_default_distance(self):
        return CosineSimilarity()

    def _sub_loss_names(self):
        return ["pos_loss", "neg_loss"]

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """Compute L_DG; see the class docstring."""
        self.reset_stats()
        embeddings, labels, ref_emb, ref_labels, _ = prepare_inputs(
            type(self).__name__, embeddings, labels, ref_emb, ref_labels, allow_2d_labels=self.multilabel
        )
        loss_dict = self.compute_loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return self.reducer(loss_dict, embeddings, labels)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        scores = similarity_matrix(self.distance, embeddings, ref_emb)
        valid = reference_mask(
            embeddings.shape[0],
            ref_emb.shape[0],
            embeddings.device,
            same_source=ref_emb is embeddings,
            include_self=self.include_self,
            indices_tuple=indices_tuple,
        )
        same = _share_label(labels, ref_labels) if self.multilabel else labels.unsqueeze(1) == ref_labels.unsqueeze(0)
        pos, neg = valid & same, valid & ~same
        if self._prune_inactive:
            pos = pos & (scores.detach() < self.pos_margin)
            neg = neg & (scores.detach() > self.neg_margin)
        out = {}
        for name, mask, kind in (("pos_loss", pos, "pos_pair"), ("neg_loss", neg, "neg_pair")):
            a, j = torch.nonzero(mask, as_tuple=True)
            if len(a) == 0:
                out[name] = self.zero_loss()
                continue
            s = scores[a, j]
            losses = torch.relu(self.pos_margin - s) if kind == "pos_pair" else torch.relu(s - self.neg_margin)
            out[name] = {"losses": losses, "indices": (a, j), "reduction_type": kind}
        return out
