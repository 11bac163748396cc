"""``CombinedRankLoss``: a rank loss plus a decomposability loss, ``(1 − λ)·L_rank + λ·L_dec`` (SupRank Eq. 12)."""

from __future__ import annotations

from pytorch_metric_learning.losses import BaseMetricLossFunction
from torch import Tensor, nn

from .._validation import check_probability
from ._inputs import PreparedForwardMixin, entry_reducer, fine_labels
from .base_rank_loss import BaseRankLoss
from .calibration_loss import CalibrationLoss
from .cluster_loss import ClusterLoss
from .compile_guard import GuardedCompileMixin

__all__ = ["CombinedRankLoss"]

# PML options that act on the combined loss dict (the rest, e.g. distance, belong to the rank loss)
COMBINATION_OPTIONS = ("reducer", "embedding_regularizer", "embedding_reg_weight")


def _make_decomposability(
    kind, *, include_self: bool, num_classes: int | None, embedding_size: int | None
) -> nn.Module:
    """``"calibration"`` → ``CalibrationLoss(include_self=...)`` (L_DG, Eq. 7), ``"proxy"`` →
    ``ClusterLoss(num_classes, embedding_size)`` (L_DG*, Eq. 8), an ``nn.Module`` as is; ``ValueError`` otherwise."""
    if isinstance(kind, nn.Module):
        return kind
    if kind == "calibration":
        return CalibrationLoss(include_self=include_self)
    if kind == "proxy":
        if num_classes is None or embedding_size is None:
            raise ValueError(
                "decomposability='proxy' (ClusterLoss, L_DG*) needs num_classes and embedding_size; got "
                f"num_classes={num_classes!r}, embedding_size={embedding_size!r}"
            )
        return ClusterLoss(num_classes=num_classes, embedding_size=embedding_size)
    raise ValueError(f"decomposability must be one of (None, 'calibration', 'proxy') or an nn.Module; got {kind!r}")


class CombinedRankLoss(GuardedCompileMixin, PreparedForwardMixin, BaseMetricLossFunction):
    """A rank loss combined with a decomposability loss (SupRank TPAMI 2025, Eq. 12; ROADMAP NeurIPS 2021).

    ``L = (1 − λ)·L_rank + λ·L_dec`` where ``L_rank`` is any :class:`~pml_suprank.losses.BaseRankLoss` and
    ``L_dec`` the pair calibration loss L_DG (Eq. 7, ``"calibration"``), the proxy loss L_DG* (Eq. 8,
    ``"proxy"``, queries only) or any PML loss module, on the finest labels and the rank loss's reference set.
    ROADMAP, ROD-R@k, HAPPIER and ROD-NDCG are subclasses.

    Loss dict: ``"rank_loss"`` (per-query losses × ``1 − λ``, this loss's reducer) and ``"decomposability_loss"``
    (``λ·L_dec``, already reduced); :meth:`compute_terms` returns them reduced. The rank loss's public attributes
    (``include_self``, ``tau``, ``hierarchy``, ...) are readable on the combined loss.

    Args:
        rank_loss: the rank loss; it owns the scores (``distance``) and ``include_self``.
        decomposability_loss: ``"calibration"``, ``"proxy"`` or an ``nn.Module`` loss, called as
            ``module(embeddings, fine, indices_tuple[, ref_emb, ref_fine])`` (:meth:`decomposability_arguments`).
        weight: ``λ`` in ``[0, 1]``.
        num_classes, embedding_size: needed by ``"proxy"`` (``decomposability_loss.proxies``).
        **kwargs: PML options of the combined loss (``reducer``, ``embedding_regularizer``, ...).

    Shapes: ``embeddings (B, D)``, ``labels`` as the rank loss takes them (``(B,)`` or ``(B, L)``), optional
    ``ref_emb (N, D)``, ``ref_labels``; returns a scalar.

    Example:
        >>> from pml_suprank.losses import SupAPLoss
        >>> loss_fn = CombinedRankLoss(SupAPLoss(), "calibration", weight=0.1)  # = ROADMAPLoss()
    """

    def __init__(
        self,
        rank_loss: BaseRankLoss,
        decomposability_loss: str | nn.Module = "calibration",
        weight: float = 0.1,
        *,
        num_classes: int | None = None,
        embedding_size: int | None = None,
        **kwargs,
    ):
        if not isinstance(rank_loss, BaseRankLoss):
            raise TypeError(
                f"rank_loss must be a pml_suprank BaseRankLoss (e.g. SupAPLoss()); got {type(rank_loss).__name__}"
            )
        if decomposability_loss is None:
            raise ValueError(
                "decomposability_loss must be 'calibration', 'proxy' or an nn.Module loss; got None (use the rank "
                "loss alone)"
            )
        if "distance" in kwargs:
            raise TypeError("CombinedRankLoss takes its distance from rank_loss; give distance= to the rank loss")
        weight = check_probability("weight", weight)
        super().__init__(distance=rank_loss.distance, **kwargs)
        self.rank_loss = rank_loss
        self.decomposability_loss = _make_decomposability(
            decomposability_loss,
            include_self=rank_loss.include_self,
            num_classes=num_classes,
            embedding_size=embedding_size,
        )
        self.decomposability_weight = weight
        self.add_to_recordable_attributes(list_of_names=["num_kept_queries"], is_stat=True)

    @property
    def weight(self) -> float:
        """``λ``, the weight of the decomposability term (also the attribute ``decomposability_weight``)."""
        return self.decomposability_weight

    @weight.setter
    def weight(self, value: float) -> None:
        self.decomposability_weight = check_probability("weight", value)

    @property
    def term_weights(self) -> dict[str, float]:
        """The weight of each loss-dict term: ``{"rank_loss": 1 − λ, "decomposability_loss": λ}``."""
        return {"rank_loss": 1.0 - self.weight, "decomposability_loss": self.weight}

    def init_preset(
        self, rank_cls: type, rank_args: dict, decomposability, weight, kwargs: dict, *, proxy_only=False, **sizes
    ) -> None:
        """The presets' constructor (ROADMAP, ROD-R@k, HAPPIER, ROD-NDCG): ``rank_cls(**rank_args, ...)`` combined
        with ``decomposability`` (``sizes``: ``num_classes``, ``embedding_size``). ``kwargs`` go to the rank loss,
        except :data:`COMBINATION_OPTIONS` (the combined loss's) and ``collect_stats`` (both).

        Raises:
            TypeError: ``proxy_only`` (always the proxy term) and ``kwargs`` sets ``decomposability``, ``num_classes``
                or ``embedding_size``.
            ValueError: ``decomposability`` is ``None`` or ``weight`` (``decomposability_weight``) not in ``[0, 1]``.
        """
        owner = type(self).__name__
        for key in ("decomposability", "num_classes", "embedding_size") if proxy_only else ():
            if key in kwargs:
                raise TypeError(f"{owner} sets {key} itself; got an extra {key}= argument")
        if decomposability is None:
            raise ValueError(f"{owner} needs decomposability='calibration', 'proxy' or a module; got None")
        weight = check_probability("decomposability_weight", weight)
        rank_kwargs = {k: v for k, v in kwargs.items() if k not in COMBINATION_OPTIONS}
        combination_kwargs = {k: v for k, v in kwargs.items() if k in COMBINATION_OPTIONS or k == "collect_stats"}
        rank_loss = rank_cls(**rank_args, **rank_kwargs)
        CombinedRankLoss.__init__(self, rank_loss, decomposability, weight, **sizes, **combination_kwargs)

    def _sub_loss_names(self):
        return ["rank_loss", "decomposability_loss"]

    def rank_entry(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, *, reducer=None, inputs=None) -> dict:
        """The ``"rank_loss"`` entry on prepared inputs: per-query losses times ``1 − λ`` (see
        :meth:`BaseRankLoss.rank_entry`: ``reducer``, ``inputs``)."""
        entry = self.rank_loss.rank_entry(
            embeddings, labels, indices_tuple, ref_emb, ref_labels, scale=1.0 - self.weight, reducer=reducer,
            inputs=inputs,
        )  # fmt: skip
        self.num_kept_queries = self.rank_loss.num_kept_queries
        return entry

    def decomposability_arguments(self, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> tuple:
        """The positional arguments of ``self.decomposability_loss(...)`` on the finest labels (the whole label sets for
        a ``multilabel=True`` term): ``(embeddings, fine)`` (proxy loss), ``(embeddings, fine, indices_tuple)`` (batch
        references), else ``(..., ref_emb, ref_fine)``."""
        label_sets = getattr(self.decomposability_loss, "multilabel", False) is True
        fine = labels if label_sets else fine_labels(labels)
        if not getattr(self.decomposability_loss, "uses_reference_set", True):
            return embeddings, fine
        if ref_emb is embeddings:
            return embeddings, fine, indices_tuple
        return embeddings, fine, indices_tuple, ref_emb, ref_labels if label_sets else fine_labels(ref_labels)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        """``{"rank_loss": (1 − λ)·per-query losses, "decomposability_loss": already-reduced λ·L_dec}``; a
        CalibrationLoss whose ``shares_scores`` agrees reuses the rank term's score matrix and mask."""
        rank, dec = self.rank_loss, self.decomposability_loss
        shared = getattr(dec, "shares_scores", None)
        inputs = None
        if shared is not None and shared(rank.distance, rank.include_self):  # one score matrix for both terms
            inputs = rank.rank_inputs(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        reducer = entry_reducer(self.reducer, "rank_loss")
        rank_entry = self.rank_entry(
            embeddings, labels, indices_tuple, ref_emb, ref_labels, reducer=reducer, inputs=inputs
        )
        args = self.decomposability_arguments(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        prepared = getattr(dec, "prepared_forward", None)
        shared_scores = {} if inputs is None else {"scores": inputs.scores, "valid": inputs.valid}
        value: Tensor = dec(*args) if prepared is None else prepared(*args, **shared_scores)
        dec_entry = {"losses": self.weight * value, "indices": None, "reduction_type": "already_reduced"}
        return {"rank_loss": rank_entry, "decomposability_loss": dec_entry}

    def compute_terms(self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None) -> dict[str, Tensor]:
        """The loss's terms, each reduced as in :meth:`forward` (they sum to it): ``{"rank_loss": (1 − λ)·L_rank,
        "decomposability_loss": λ·L_dec}`` (plus ``"embedding_reg_loss"``); :attr:`term_weights` unweights them."""
        loss_dict, embeddings, labels = self.prepared_loss_dict(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        return {name: self.reducer({name: entry}, embeddings, labels) for name, entry in loss_dict.items()}


#: the rank loss's public hyper-parameters, read-only properties of the combined loss (``roadmap.tau`` is
#: ``roadmap.rank_loss.tau``; not ``__getattr__``, which dynamo cannot trace)
RANK_LOSS_ATTRIBUTES = (
    "allow_2d_labels", "alpha", "chunk_size", "delta", "hierarchy", "hrank", "include_self", "k", "kernel",
    "level_weights", "multilabel", "offset", "relevance", "rho", "start", "step", "tau", "temperature", "with_hrank",
)  # fmt: skip


def _read_through(name: str) -> property:
    def get(self: CombinedRankLoss):
        return getattr(self.rank_loss, name)

    get.__name__ = name
    return property(get, doc=f"``rank_loss.{name}`` (read-only; set it on :attr:`rank_loss`).")


for _name in RANK_LOSS_ATTRIBUTES:
    setattr(CombinedRankLoss, _name, _read_through(_name))
del _name
