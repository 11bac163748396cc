"""How a rank loss and a decomposability loss are combined (SupRank paper Eq. 12), in one place.

``L = (1 − λ)·L_rank + λ·L_dec`` where ``L_dec`` is the pair calibration loss L_DG (Eq. 7,
:class:`~pml_suprank.losses.CalibrationLoss`) or the proxy loss L_DG* (Eq. 8, :class:`~pml_suprank.losses.ClusterLoss`).
The loss dict keeps the two weighted terms apart: ``"rank_loss"`` (per-query losses times ``1 − λ``, reduced by the
combined loss's reducer) and ``"decomposability_loss"`` (``λ`` times the decomposability loss, already reduced by its
own reducer). The decomposability term sees the finest labels (column 0 of 2-D labels). Used by
:class:`~pml_suprank.losses.CombinedRankLoss` and by ``BaseRankLoss(decomposability=...)``.
"""

from __future__ import annotations

from torch import Tensor, nn

from ._inputs import entry_reducer, fine_labels
from .calibration_loss import CalibrationLoss
from .cluster_loss import ClusterLoss

__all__ = [
    "DECOMPOSABILITY_KINDS",
    "combined_loss_dict",
    "decomposability_arguments",
    "make_decomposability",
]

DECOMPOSABILITY_KINDS = ("calibration", "proxy")


def make_decomposability(
    kind: str | nn.Module,
    *,
    include_self: bool = False,
    num_classes: int | None = None,
    embedding_size: int | None = None,
) -> nn.Module:
    """The decomposability loss named by ``kind``.

    Args:
        kind: ``"calibration"`` (L_DG, Eq. 7: ``CalibrationLoss(include_self=include_self)``), ``"proxy"`` (L_DG*,
            Eq. 8: ``ClusterLoss(num_classes, embedding_size)``) or an ``nn.Module`` loss (returned as is).
        include_self: the rank loss's ``include_self``, shared by the calibration pairs.
        num_classes, embedding_size: needed by ``"proxy"``.

    Raises:
        ValueError: unknown ``kind``, or ``"proxy"`` without ``num_classes``/``embedding_size``.
    """
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


def decomposability_arguments(module: nn.Module, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> tuple:
    """Positional arguments of ``module(...)`` for the decomposability term, on the finest labels.

    A module with ``uses_reference_set = False`` (a proxy loss such as ``ClusterLoss``) gets ``(embeddings, fine)``;
    otherwise ``(embeddings, fine, indices_tuple)`` when the reference set is the batch (``ref_emb is embeddings``),
    else ``(embeddings, fine, indices_tuple, ref_emb, ref_fine)``. Inputs are the already prepared ones.
    """
    fine = fine_labels(labels)
    if not getattr(module, "uses_reference_set", True):
        return embeddings, fine
    if ref_emb is embeddings:
        return embeddings, fine, indices_tuple
    return embeddings, fine, indices_tuple, ref_emb, fine_labels(ref_labels)


def combined_loss_dict(
    rank_loss,
    decomposability_loss: nn.Module,
    weight: float,
    embeddings,
    labels,
    indices_tuple,
    ref_emb,
    ref_labels,
    reducer=None,
) -> dict:
    """The PML loss dict of ``(1 − λ)·rank_loss + λ·decomposability_loss`` on prepared inputs.

    Args:
        rank_loss: a :class:`~pml_suprank.losses.BaseRankLoss` (its ``rank_entry`` gives the per-query losses).
        decomposability_loss: the L_dec module.
        weight: ``λ`` in ``[0, 1]``.
        embeddings, labels, indices_tuple, ref_emb, ref_labels: as returned by ``rank_loss.prepare_inputs``.
        reducer: the combined loss's reducer (its ``"rank_loss"`` reducer reduces the rank entry; lets
            ``rank_entry`` reduce a plain mean without a host synchronisation), or ``None``.

    A decomposability module with ``prepared_forward`` (the package's CalibrationLoss / ClusterLoss) is called
    through it, skipping a second validation of the same inputs; a CalibrationLoss whose similarity and
    ``include_self`` match the rank loss's (``shares_scores``) reuses the rank term's score matrix and mask.

    Returns:
        ``{"rank_loss": element entry (weighted by 1 − λ), "decomposability_loss": already-reduced λ·L_dec}``.
    """
    shared = getattr(decomposability_loss, "shares_scores", None)
    inputs = None
    if shared is not None and shared(rank_loss.distance, rank_loss.include_self):  # one score matrix for both terms
        inputs = rank_loss.rank_inputs(embeddings, labels, indices_tuple, ref_emb, ref_labels)
    rank_entry = rank_loss.rank_entry(
        embeddings, labels, indices_tuple, ref_emb, ref_labels, scale=1.0 - weight,
        reducer=entry_reducer(reducer, "rank_loss"), inputs=inputs,
    )  # fmt: skip
    args = decomposability_arguments(decomposability_loss, embeddings, labels, indices_tuple, ref_emb, ref_labels)
    prepared = getattr(decomposability_loss, "prepared_forward", None)
    if prepared is None:
        value: Tensor = decomposability_loss(*args)
    elif inputs is not None:
        value = prepared(*args, scores=inputs.scores, valid=inputs.valid)
    else:
        value = prepared(*args)
    return {
        "rank_loss": rank_entry,
        "decomposability_loss": {"losses": weight * value, "indices": None, "reduction_type": "already_reduced"},
    }
