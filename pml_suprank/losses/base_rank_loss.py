"""``BaseRankLoss``: the PML ``BaseMetricLossFunction`` subclass shared by every rank loss of the package.

It owns everything that is not the rank surrogate itself: argument validation, the score matrix, which reference
items count for each query (``include_self``, ``indices_tuple``), mixed precision, dropping queries without a
positive, PML reducers, and the optional decomposability term of the combined losses (ROADMAP, ROD-R@k, HAPPIER,
ROD-NDCG). Subclasses implement one hook, :meth:`BaseRankLoss.compute_query_losses`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from torch import Tensor, nn

from .._validation import check_embeddings, check_labels, check_probability

__all__ = ["BaseRankLoss", "RankInputs", "check_similarity", "prepare_inputs", "reference_mask"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass
class RankInputs:
    """What :meth:`BaseRankLoss.compute_query_losses` receives.

    Attributes:
        scores: ``(B, N)`` similarities ``S[b, j] = sim(embeddings[b], ref_emb[j])`` in float32 or float64
            (fp16/bf16 inputs are up-cast), connected to the graph of ``embeddings`` (and of ``ref_emb``).
        valid: ``(B, N)`` bool, the reference items that count for each query: all of them, restricted to the pairs
            of ``indices_tuple`` when one is given, minus the query itself (by index) when the reference set is the
            batch and ``include_self=False``.
        labels: ``(B,)`` (or ``(B, L)`` for hierarchical subclasses) integer labels of the queries.
        ref_labels: ``(N,)`` (or ``(N, L)``) labels of the reference items.
        same_source: True when the reference set is the batch itself (``ref_emb is None or ref_emb is embeddings``).
    """

    scores: Tensor
    valid: Tensor
    labels: Tensor
    ref_labels: Tensor
    same_source: bool

    def positives(self) -> Tensor:
        """``(B, N)`` bool: valid reference items with the same (1-D) label as the query."""
        return self.valid & (self.labels.unsqueeze(1) == self.ref_labels.unsqueeze(0))

    def positive_pairs(self, positives: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(query_idx, item_idx)`` of every (query, positive) pair, grouped by query (row-major order)."""
        pos = self.positives() if positives is None else positives
        q, i = torch.nonzero(pos, as_tuple=True)
        return q, i


def check_similarity(owner: str, distance) -> None:
    """Accept only cosine / dot-product similarities (``CosineSimilarity``, ``DotProductSimilarity``, power 1)."""
    ok = (
        isinstance(distance, DotProductSimilarity)
        and distance.power == 1
        and distance.is_inverted
        and (not distance.normalize_embeddings or distance.p == 2)
    )
    if not ok:
        raise ValueError(
            f"{owner} needs distance=CosineSimilarity() or DotProductSimilarity() (power=1, p=2): rank losses are "
            f"defined on similarity scores; got distance={type(distance).__name__}"
            f"(p={getattr(distance, 'p', None)}, power={getattr(distance, 'power', None)}, "
            f"normalize_embeddings={getattr(distance, 'normalize_embeddings', None)})"
        )


def _check_indices_tuple(indices_tuple, num_queries: int, num_refs: int):
    if indices_tuple is None:
        return None
    if not isinstance(indices_tuple, (tuple, list)) or len(indices_tuple) not in (3, 4):
        raise ValueError(
            "indices_tuple must be None, a 4-tuple of pair indices (anchors1, positives, anchors2, negatives) or a "
            f"3-tuple of triplet indices (anchors, positives, negatives); got {type(indices_tuple).__name__} of "
            f"length {len(indices_tuple) if isinstance(indices_tuple, (tuple, list)) else 'n/a'}"
        )
    for k, idx in enumerate(indices_tuple):
        if not isinstance(idx, Tensor) or idx.dim() != 1 or idx.is_floating_point() or idx.dtype == torch.bool:
            raise TypeError(f"indices_tuple[{k}] must be a 1-D integer tensor; got {getattr(idx, 'dtype', idx)}")
    if len(indices_tuple) == 3:
        a, p, n = indices_tuple
        if not len(a) == len(p) == len(n):
            raise ValueError(f"indices_tuple triplets must have equal lengths; got {len(a)}, {len(p)}, {len(n)}")
        pairs = (a, p, a, n)
    else:
        pairs = tuple(indices_tuple)
        if len(pairs[0]) != len(pairs[1]) or len(pairs[2]) != len(pairs[3]):
            raise ValueError(
                "indices_tuple pairs must have len(anchors1) == len(positives) and len(anchors2) == len(negatives); "
                f"got {[len(x) for x in pairs]}"
            )
    for k, (idx, bound, what) in enumerate(
        zip(pairs, (num_queries, num_refs) * 2, ("embeddings", "ref_emb") * 2, strict=True)
    ):
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= bound):
            raise ValueError(
                f"indices_tuple entry {k} indexes {what} (size {bound}); "
                f"got values in [{int(idx.min())}, {int(idx.max())}]"
            )
    return pairs


def reference_mask(
    num_queries: int,
    num_refs: int,
    device: torch.device,
    *,
    same_source: bool,
    include_self: bool,
    indices_tuple=None,
) -> Tensor:
    """``(B, N)`` bool mask of the (query, reference) pairs that count.

    All pairs by default; only the pairs listed in ``indices_tuple`` when one is given (pairs ``(a1, p)`` and
    ``(a2, n)``, or ``(a, p)`` and ``(a, n)`` for triplets — this is how PML's ``CrossBatchMemory`` removes the
    queries' own copies from the memory); the query itself is removed by index when the reference set is the batch
    (``same_source``) unless ``include_self`` (the reference code's convention).
    """
    pairs = _check_indices_tuple(indices_tuple, num_queries, num_refs)
    if pairs is None:
        valid = torch.ones(num_queries, num_refs, dtype=torch.bool, device=device)
    else:
        valid = torch.zeros(num_queries, num_refs, dtype=torch.bool, device=device)
        a1, p, a2, n = (x.to(device=device, dtype=torch.long) for x in pairs)
        valid[a1, p] = True
        valid[a2, n] = True
    if same_source and not include_self:
        idx = torch.arange(min(num_queries, num_refs), device=device)
        valid[idx, idx] = False
    return valid


def prepare_inputs(owner: str, embeddings, labels, ref_emb, ref_labels, *, allow_2d_labels: bool = False):
    """Validate a loss call and resolve the reference set (PML's identity convention).

    Returns ``(embeddings, labels, ref_emb, ref_labels, same_source)`` where fp16/bf16 embeddings are up-cast to
    float32, ``ref_emb is embeddings`` when the reference set is the batch, and labels are on the embeddings' device.
    """
    same_source = ref_emb is None or ref_emb is embeddings
    embeddings = check_embeddings("embeddings", embeddings)
    if labels is None:
        raise ValueError(f"{owner} requires labels (an integer tensor of shape (batch_size,)); got None")
    labels = check_labels("labels", labels, embeddings.shape[0], allow_2d=allow_2d_labels)
    labels = labels.to(embeddings.device)
    if same_source:
        if ref_labels is not None and ref_labels is not labels:
            ref_labels = check_labels("ref_labels", ref_labels, embeddings.shape[0], allow_2d=allow_2d_labels)
            if not torch.equal(ref_labels.to(labels.device), labels):
                raise ValueError("ref_labels must be None or equal to labels when ref_emb is None")
        ref_labels = labels
    else:
        ref_emb = check_embeddings("ref_emb", ref_emb)
        if ref_emb.shape[1] != embeddings.shape[1]:
            raise ValueError(
                f"ref_emb must have the embedding size of embeddings ({embeddings.shape[1]}); got shape "
                f"{tuple(ref_emb.shape)}"
            )
        if ref_emb.device != embeddings.device:
            raise ValueError(f"ref_emb must be on {embeddings.device}; got {ref_emb.device}")
        if ref_labels is None:
            raise ValueError(f"{owner} requires ref_labels when ref_emb is given; got None")
        ref_labels = check_labels(
            "ref_labels", ref_labels, ref_emb.shape[0], allow_2d=allow_2d_labels, n_name="ref_emb"
        )
        ref_labels = ref_labels.to(embeddings.device)
        if ref_labels.shape[1:] != labels.shape[1:]:
            raise ValueError(
                f"ref_labels must have the label columns of labels {tuple(labels.shape[1:])}; got shape "
                f"{tuple(ref_labels.shape)}"
            )
    if embeddings.dtype in _LOW_PRECISION:
        embeddings = embeddings.float()
    if same_source:
        ref_emb = embeddings
    elif ref_emb.dtype != embeddings.dtype:
        ref_emb = ref_emb.to(embeddings.dtype)
    return embeddings, labels, ref_emb, ref_labels, same_source


def similarity_matrix(distance, embeddings: Tensor, ref_emb: Tensor) -> Tensor:
    """``(B, N)`` similarity matrix computed in full precision (autocast disabled)."""
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        return distance(embeddings, ref_emb)


class BaseRankLoss(BaseMetricLossFunction):
    """Base class of the rank losses (Smooth-AP, SupAP, Sup-R@k, Sup-H-AP, Sup-NDCG, and their combinations).

    Call: ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None)`` like any PML loss.

    Semantics (DESIGN.md §2): scores are cosine / dot-product similarities (``distance`` must be a
    ``DotProductSimilarity``/``CosineSimilarity``; anything else raises ``ValueError``); the reference set is the
    batch unless ``ref_emb``/``ref_labels`` are given; when it is the batch (``ref_emb is None or ref_emb is
    embeddings``) the query is removed from its own reference set *by index* unless ``include_self=True`` (the
    reference code's convention, used by the golden vectors); an ``indices_tuple`` of pairs/triplets restricts the
    (query, reference) pairs that count; queries without a positive are dropped; if no query has one the loss is
    a zero connected to the graph. fp16/bf16 embeddings are up-cast and the loss is computed in float32.

    Extension contract (how to write a rank loss on top of this class):

    1. Implement ``compute_query_losses(self, inputs: RankInputs) -> (losses, query_idx)``. ``inputs.scores`` is
       the ``(B, N)`` differentiable score matrix, ``inputs.valid`` the ``(B, N)`` bool mask of counted pairs,
       ``inputs.labels``/``inputs.ref_labels`` the labels as given. Return the per-query losses ``(Q,)`` of the
       queries you keep (those with at least one positive / relevant item) and their row indices ``(Q,)`` long.
       They are reduced by the loss's PML reducer (``MeanReducer`` by default, i.e. the mean over kept queries).
       For ranks use :mod:`pml_suprank.ranking`: ``suprank_negative_sum`` / ``heaviside_positive_count`` /
       ``sigmoid_rank_sums`` (flat, fast) or the general ``pairwise_step_sum`` (any step, pair-dependent masks);
       they are ``O(pairs × N)`` in time and never save ``pairs × N`` tensors for backward.
    2. Hierarchical losses set the class attribute ``allow_2d_labels = True`` to accept ``(N, L)`` labels
       (column 0 = finest); the base validates them and passes them through unchanged.
    3. Combined losses (``(1 − λ)·rank loss + λ·decomposability loss``) pass ``decomposability=`` (``"calibration"``,
       ``"proxy"`` or a loss module), ``decomposability_weight=``, and for proxies ``num_classes=`` /
       ``embedding_size=`` to this constructor. The loss dict then has two entries: ``"rank_loss"`` (element-wise,
       weighted by ``1 − λ``) and ``"decomposability_loss"`` (already reduced, weighted by ``λ``); otherwise a
       single ``"loss"`` entry. The decomposability term uses the finest labels (column 0 of 2-D labels).

    Args:
        include_self: keep the query as its own positive when the reference set is the batch (reference code).
        decomposability: ``None``, ``"calibration"`` (L_DG, ROADMAP Eq. 7), ``"proxy"`` (L_DG*, Eq. 8), or an
            ``nn.Module`` loss, called as ``module(embeddings, fine_labels, indices_tuple[, ref_emb, ref_fine_labels])``
            (or ``module(embeddings, fine_labels)`` when it has ``uses_reference_set = False``, like ClusterLoss).
        decomposability_weight: ``λ`` in ``[0, 1]``.
        num_classes, embedding_size: needed by ``decomposability="proxy"``.
        **kwargs: passed to ``BaseMetricLossFunction`` (``distance``, ``reducer``, ``embedding_regularizer``, ...).
    """

    allow_2d_labels = False

    def __init__(
        self,
        include_self: bool = False,
        decomposability: str | nn.Module | None = None,
        decomposability_weight: float = 0.1,
        num_classes: int | None = None,
        embedding_size: int | None = None,
        **kwargs,
    ):
        if not isinstance(include_self, bool):
            raise TypeError(f"include_self must be a bool; got {type(include_self).__name__} {include_self!r}")
        # plain attributes read by _sub_loss_names(), which PML calls inside super().__init__
        self._has_decomposability = decomposability is not None
        super().__init__(**kwargs)
        self.include_self = include_self
        check_similarity(type(self).__name__, self.distance)
        self.decomposability_weight = check_probability("decomposability_weight", decomposability_weight)
        self.decomposability_loss = self._make_decomposability(decomposability, num_classes, embedding_size)
        self.add_to_recordable_attributes(list_of_names=["num_kept_queries"], is_stat=True)

    def get_default_distance(self):
        return CosineSimilarity()

    def _sub_loss_names(self):
        if getattr(self, "_has_decomposability", False):
            return ["rank_loss", "decomposability_loss"]
        return ["loss"]

    def _make_decomposability(self, kind, num_classes, embedding_size):
        if kind is None:
            return None
        if isinstance(kind, nn.Module):
            return kind
        if kind == "calibration":
            from .calibration_loss import CalibrationLoss

            return CalibrationLoss(include_self=self.include_self)
        if kind == "proxy":
            from .cluster_loss import ClusterLoss

            if num_classes is None or embedding_size is None:
                raise ValueError(
                    "decomposability='proxy' (ClusterLoss, L_DG*) needs num_classes and embedding_size; got "
                    f"num_classes={num_classes!r}, embedding_size={embedding_size!r}"
                )
            return ClusterLoss(num_classes=num_classes, embedding_size=embedding_size)
        raise ValueError(f"decomposability must be one of (None, 'calibration', 'proxy') or an nn.Module; got {kind!r}")

    # ------------------------------------------------------------------ PML entry points
    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """Compute the loss; see the class docstring. Returns a scalar tensor."""
        self.reset_stats()
        embeddings, labels, ref_emb, ref_labels = self._resolve(embeddings, labels, ref_emb, ref_labels)
        loss_dict = self.compute_loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return self.reducer(loss_dict, embeddings, labels)

    def _resolve(self, embeddings, labels, ref_emb, ref_labels):
        emb, labels, ref, ref_labels, _ = prepare_inputs(
            type(self).__name__, embeddings, labels, ref_emb, ref_labels, allow_2d_labels=self.allow_2d_labels
        )
        return emb, labels, ref, ref_labels

    def rank_inputs(self, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> RankInputs:
        """Build :class:`RankInputs` (scores + validity mask) for already-resolved inputs."""
        same_source = ref_emb is embeddings
        scores = similarity_matrix(self.distance, embeddings, ref_emb)
        valid = reference_mask(
            embeddings.shape[0],
            ref_emb.shape[0],
            embeddings.device,
            same_source=same_source,
            include_self=self.include_self,
            indices_tuple=indices_tuple,
        )
        return RankInputs(scores=scores, valid=valid, labels=labels, ref_labels=ref_labels, same_source=same_source)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        inputs = self.rank_inputs(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        losses, query_idx = self.compute_query_losses(inputs)
        self.num_kept_queries = int(len(query_idx)) if self.collect_stats else 0
        rank_weight = 1.0 - self.decomposability_weight if self.decomposability_loss is not None else 1.0
        if len(query_idx) == 0:
            rank_entry = self.zero_loss()
        else:
            rank_entry = {"losses": rank_weight * losses, "indices": query_idx, "reduction_type": "element"}
        if self.decomposability_loss is None:
            return {"loss": rank_entry}
        value = self.compute_decomposability(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        return {
            "rank_loss": rank_entry,
            "decomposability_loss": {
                "losses": self.decomposability_weight * value,
                "indices": None,
                "reduction_type": "already_reduced",
            },
        }

    def compute_decomposability(self, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> Tensor:
        """The decomposability term (unweighted scalar) on the finest labels."""
        fine = labels[:, 0] if labels.dim() == 2 else labels
        module = self.decomposability_loss
        if getattr(module, "uses_reference_set", True):
            if ref_emb is embeddings:
                return module(embeddings, fine, indices_tuple)
            ref_fine = ref_labels[:, 0] if ref_labels.dim() == 2 else ref_labels
            return module(embeddings, fine, indices_tuple, ref_emb, ref_fine)
        return module(embeddings, fine)

    def compute_query_losses(self, inputs: RankInputs) -> tuple[Tensor, Tensor]:
        """Per-query losses ``(Q,)`` and the kept query rows ``(Q,)`` long; see the class docstring."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers for flat AP-like losses
    @staticmethod
    def segment_mean(values: Tensor, query_idx: Tensor, num_queries: int) -> tuple[Tensor, Tensor]:
        """Mean of ``values`` per query (pairs grouped by ``query_idx``) → ``(per_query (Q,), kept rows (Q,))``."""
        sums = values.new_zeros(num_queries).index_add(0, query_idx, values)
        counts = torch.bincount(query_idx, minlength=num_queries)
        kept = torch.nonzero(counts > 0, as_tuple=True)[0]
        return sums[kept] / counts[kept].to(values.dtype), kept
