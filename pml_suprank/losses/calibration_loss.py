"""Pair calibration loss L_DG (ROADMAP / SupRank paper Eq. 7): the decomposability term of ROADMAP and ROD-R@k."""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.reducers import AvgNonZeroReducer, MeanReducer

from .._precision import float32_backward, float32_forward
from .._validation import check_bool, check_choice
from ._inputs import check_similarity, entry_reducer, prepare_inputs, reduce_loss_dict, scores_and_mask
from .compile_guard import GuardedCompileMixin

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


class CalibrationLoss(GuardedCompileMixin, BaseMetricLossFunction):
    """Decomposability loss L_DG (SupRank paper Eq. 7; ROADMAP NeurIPS 2021 Eq. 7).

    ``L_DG = mean_{(q,j)∈Pos} [α − cos(q, j)]₊ + mean_{(q,j)∈Neg} [cos(q, j) − β]₊`` over (query, reference) pairs:
    positives above ``α``, negatives below ``β``. ``average="active"`` (default, the reference code: PML
    ``ContrastiveLoss`` + ``AvgNonZeroReducer``) averages each term over its non-zero pairs; ``average="all"`` over
    all pairs (the paper). Pairs follow the rank losses' conventions; scores are cosine similarities.

    Args:
        pos_margin: ``α`` (0.9).
        neg_margin: ``β`` (0.6).
        average: ``"active"`` or ``"all"``; ignored when an explicit ``reducer`` is passed.
        include_self: keep the (query, query) pair when the reference set is the batch (reference code).
        multilabel: ``(B, M)`` label sets padded with ``-1``; a pair sharing any label is positive.
        **kwargs: PML options (``distance``, ``reducer``, ...).

    Shapes: ``embeddings (B, D)``, ``labels (B,)``, optional ``ref_emb (N, D)``, ``ref_labels (N,)``; returns a scalar
    (loss dict: ``"pos_loss"``, ``"neg_loss"``).
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
        check_bool("multilabel", multilabel)
        check_bool("include_self", include_self)
        average = check_choice("average", average, ("active", "all"))
        # "active" reduction: zero-loss pairs cannot change the value, so they are never built (O(B·N) bools)
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

    @float32_forward
    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """Compute L_DG; see the class docstring."""
        embeddings, labels, ref_emb, ref_labels, _ = prepare_inputs(
            type(self).__name__, embeddings, labels, ref_emb, ref_labels, allow_2d_labels=self.multilabel
        )
        return self.prepared_forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)

    def prepared_forward(
        self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None, *, scores=None, valid=None
    ):
        """:meth:`forward` on prepared inputs, optionally with the rank term's ``(B, N)`` ``scores`` / ``valid``."""
        self.reset_stats()
        if ref_emb is None:
            ref_emb, ref_labels = embeddings, labels
        loss_dict = self.pair_losses(
            embeddings, labels, indices_tuple, ref_emb, ref_labels, reducer=self.reducer, scores=scores, valid=valid
        )
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return reduce_loss_dict(self.reducer, loss_dict, embeddings, labels)

    def shares_scores(self, distance, include_self: bool) -> bool:
        """Whether this loss's scores and reference mask equal a rank loss's with ``distance`` and ``include_self``."""
        mine = self.distance
        return (
            type(mine) is type(distance)
            and (mine.normalize_embeddings, mine.p, mine.power)
            == (distance.normalize_embeddings, distance.p, distance.power)
            and not (mine.collect_stats or distance.collect_stats)
            and self.include_self == include_self
            and not self.multilabel
        )

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        """PML's hook: the loss dict with one element per (anchor, reference) pair (any reducer)."""
        return self.pair_losses(embeddings, labels, indices_tuple, ref_emb, ref_labels)

    def pair_losses(
        self, embeddings, labels, indices_tuple, ref_emb, ref_labels, *, reducer=None, scores=None, valid=None
    ) -> dict:
        """``{"pos_loss": ..., "neg_loss": ...}`` on prepared inputs, already reduced under PML's plain
        ``AvgNonZeroReducer`` / ``MeanReducer``; ``scores`` / ``valid``: the caller's ``(B, N)`` matrices."""
        if scores is None:
            scores, valid = scores_and_mask(self.distance, embeddings, ref_emb, self.include_self, indices_tuple)
        same = _share_label(labels, ref_labels) if self.multilabel else labels.unsqueeze(1) == ref_labels.unsqueeze(0)
        pos, neg = valid & same, valid & ~same
        out = {}
        for name, mask, kind in (("pos_loss", pos, "pos_pair"), ("neg_loss", neg, "neg_pair")):
            averaged = _arithmetic_average(entry_reducer(reducer, name)) if not self.collect_stats else None
            if averaged is not None:
                margin = self.pos_margin - scores if kind == "pos_pair" else scores - self.neg_margin
                total, active = _MaskedHingeSum.apply(margin, mask)
                count = active if averaged == "nonzero" else mask.sum()
                value = total / count.clamp_min(1)
                out[name] = {"losses": value, "indices": None, "reduction_type": "already_reduced"}
                continue
            if self._prune_inactive:  # pairs with a zero loss cannot change an "active" average: never built
                mask = mask & (
                    (scores.detach() < self.pos_margin) if kind == "pos_pair" else (scores.detach() > self.neg_margin)
                )
            a, j = torch.nonzero(mask, as_tuple=True)
            if len(a) == 0:
                out[name] = self.zero_loss()
                continue
            s = scores[a, j]
            losses = torch.relu(self.pos_margin - s) if kind == "pos_pair" else torch.relu(s - self.neg_margin)
            out[name] = {"losses": losses, "indices": (a, j), "reduction_type": kind}
        return out


def _arithmetic_average(reducer) -> str | None:
    """``"nonzero"`` for PML's plain ``AvgNonZeroReducer``, ``"all"`` for ``MeanReducer``, else ``None``."""
    if type(reducer) is AvgNonZeroReducer and reducer.low == 0 and reducer.high is None and not reducer.collect_stats:
        return "nonzero"
    if type(reducer) is MeanReducer and not reducer.collect_stats:
        return "all"
    return None


class _MaskedHingeSum(torch.autograd.Function):
    """``(Σ relu(x) · m, #{relu(x) · m > 0})`` of a ``(B, N)`` margin matrix ``x`` and bool mask ``m``; backward saves
    only the bool mask of the active pairs (``∂/∂x = [x > 0] · m``), without host synchronisation."""

    @staticmethod
    def forward(ctx, margin, mask):
        active = (margin > 0) & mask
        ctx.save_for_backward(active)
        count = active.sum()
        ctx.mark_non_differentiable(count)
        return (margin * active).sum(), count

    @staticmethod
    @float32_backward
    def backward(ctx, grad_total, _grad_count):
        (active,) = ctx.saved_tensors
        return grad_total * active, None
