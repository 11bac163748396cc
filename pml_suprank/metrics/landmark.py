"""Landmark retrieval evaluation: mAP@k of GLDv2 and the revisited Oxford / Paris protocol (Easy / Medium / Hard).

Both rank a ``(Q, N)`` similarity matrix with :func:`pml_suprank.metrics.ranks.retrieval_ranks` (**pessimistic
ties**: non-positives first among equal scores); *ignored* (junk) items are removed from the query's ranking.

* :func:`landmark_map_at_k` — mAP@k of the Google Landmarks v2 retrieval challenge (Weyand et al., CVPR 2020,
  Eq. 2), reported with ``k = 100`` for H-GLDv2 (SupRank TPAMI Sec. VII-C3, Table VII):
  ``mAP@k(q) = (1 / min(m_q, k)) Σ_{j ≤ k} P_q(j) rel_q(j)`` with ``m_q`` the number of positives of the query.
* :func:`revisited_map` — the revisited Oxford / Paris protocol (Radenović et al., CVPR 2018). Per query the
  ground truth lists ``easy``, ``hard`` and ``junk`` database indices; the three setups are

  ======  ======================  ==========================
  setup   positives               ignored (removed)
  ======  ======================  ==========================
  Easy    easy                    junk ∪ hard
  Medium  easy ∪ hard             junk
  Hard    hard                    junk ∪ easy
  ======  ======================  ==========================

  AP is the protocol's trapezoidal AP (the released evaluation code): with the positives at 0-based positions
  ``r_0 < r_1 < …`` of the ranking without the ignored items,
  ``AP = (1 / n) Σ_j ½ (P⁰_j + P¹_j)``, ``P⁰_j = j / r_j`` (``1`` when ``r_j = 0``), ``P¹_j = (j + 1) / (r_j + 1)``;
  mP@κ uses the protocol's capped precision ``#{positives at positions ≤ κ'} / κ'`` with
  ``κ' = min(κ, 1-based position of the last positive)``. Queries without a positive in a setup (e.g. no hard
  image) are left out of that setup's mean, as in the protocol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .from_ranks import map_at_k_from_ranks
from .ranks import check_mask, check_scores, rank_levels

__all__ = [
    "REVISITED_SETUPS",
    "landmark_map_at_k",
    "revisited_ground_truth",
    "revisited_map",
    "revisited_setup_masks",
]

#: setup → (ground-truth keys that are positives, keys that are ignored)
REVISITED_SETUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "easy": (("easy",), ("junk", "hard")),
    "medium": (("easy", "hard"), ("junk",)),
    "hard": (("hard",), ("junk", "easy")),
}


def landmark_map_at_k(scores: Tensor, positives: Tensor, junk: Tensor | None = None, k: int = 100) -> Tensor:
    """GLDv2 mAP@k per query (Weyand et al., CVPR 2020, Eq. 2; see the module), junk items removed.

    Args:
        scores: ``(Q, N)`` floating similarities of the database items to each query.
        positives: ``(Q, N)`` bool, ``True`` where the database item depicts the query's landmark (for H-GLDv2:
            ``query_labels[:, None, 0] == gallery_labels[None, :, 0]``).
        junk: Optional ``(Q, N)`` bool, ``True`` for items removed from that query's ranking (default: none).
        k: Cut-off (100 for the GLDv2 / H-GLDv2 protocol).

    Returns:
        ``(Q,)`` float tensor; NaN for queries without a positive (GLDv2 ignores them: take ``nanmean``).

    Raises:
        TypeError: ``positives`` / ``junk`` are not bool tensors, ``scores`` is not a floating tensor.
        ValueError: Shapes differ, ``k`` is not a positive int, ``scores`` holds NaN.
    """
    scores = check_scores(scores)
    if check_mask(positives, scores, "positives") is None:
        raise TypeError("positives must be a bool torch.Tensor of the shape of scores; got None")
    mask = None if junk is None else ~check_mask(junk, scores, "junk") | positives
    return map_at_k_from_ranks(rank_levels(scores, positives.long(), 1, mask), k)


def _index_array(value: Any, where: str, num_items: int) -> np.ndarray:
    array = np.asarray(value if value is not None else [], dtype=object).reshape(-1)
    out = np.empty(len(array), dtype=np.int64)
    for i, v in enumerate(array):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{where} must hold integer database indices; got {v!r}")
        out[i] = int(v)
    if len(out) and (out.min() < 0 or out.max() >= num_items):
        raise ValueError(f"{where} holds indices outside [0, {num_items}); got values in [{out.min()}, {out.max()}]")
    return out


def revisited_ground_truth(gnd: Sequence[Mapping[str, Any]], num_items: int) -> dict[str, Tensor]:
    """Per-query ``easy`` / ``hard`` / ``junk`` index lists as ``(Q, N)`` bool membership matrices.

    Args:
        gnd: One mapping per query with the keys ``"easy"``, ``"hard"``, ``"junk"`` (sequences of database indices;
            a missing ``"junk"`` is empty), as in ``gnd_roxford5k.pkl`` / ``gnd_rparis6k.pkl``.
        num_items: ``N``, the database size.

    Returns:
        ``{"easy", "hard", "junk"}`` → ``(Q, N)`` bool tensors.

    Raises:
        ValueError: A query lacks ``easy`` / ``hard`` or holds an index outside ``[0, N)`` (naming ``gnd[i][key]``).
    """
    if isinstance(gnd, (str, bytes, Mapping)) or not isinstance(gnd, Sequence):
        raise TypeError(f"gnd must be a sequence of per-query mappings; got {type(gnd).__name__}")
    out = {key: torch.zeros(len(gnd), num_items, dtype=torch.bool) for key in ("easy", "hard", "junk")}
    for q, entry in enumerate(gnd):
        if not isinstance(entry, Mapping):
            raise ValueError(f"gnd[{q}] must be a mapping with easy, hard, junk; got {type(entry).__name__}")
        for key in out:
            if key not in entry and key != "junk":
                raise ValueError(f"gnd[{q}] has no {key!r} list; got keys {sorted(entry)}")
            index = _index_array(entry.get(key), f"gnd[{q}][{key!r}]", num_items)
            out[key][q, torch.from_numpy(index)] = True
    return out


def revisited_setup_masks(membership: Mapping[str, Tensor], setup: str) -> tuple[Tensor, Tensor]:
    """``(positives, ignored)`` ``(Q, N)`` bool matrices of an Easy / Medium / Hard setup (see the module table); an
    item both positive and ignored is a positive."""
    if setup not in REVISITED_SETUPS:
        raise ValueError(f"setup must be one of {list(REVISITED_SETUPS)}; got {setup!r}")
    positive_keys, ignored_keys = REVISITED_SETUPS[setup]
    positives = torch.stack([membership[k] for k in positive_keys]).any(0)
    ignored = torch.stack([membership[k] for k in ignored_keys]).any(0) & ~positives
    return positives, ignored


def _revisited_scores(positions: Tensor, kappas: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Trapezoidal AP ``(Q,)`` and capped mP@κ ``(Q, K)`` from 1-based positions ``(Q, P)`` (0 = padding)."""
    valid = positions > 0
    n = valid.sum(1)
    r = (positions - 1).double()  # 0-based positions among the kept items
    j = (valid.long().cumsum(1) - 1).double()  # 0-based index of each positive
    p0 = torch.where(r > 0, j / r.clamp(min=1.0), torch.ones_like(r))
    p1 = (j + 1) / (r + 1)
    ap = torch.where(valid, (p0 + p1) / 2, torch.zeros_like(r)).sum(1) / n.clamp(min=1)
    last = positions.amax(1).double() if positions.shape[1] else torch.zeros(len(positions), dtype=torch.float64)
    prs = []
    for kappa in kappas:
        kq = torch.minimum(last, torch.full_like(last, float(kappa))).clamp(min=1.0)
        prs.append((valid & (positions.double() <= kq[:, None])).sum(1).double() / kq)
    ap = torch.where(n > 0, ap, math.nan)
    pr = torch.stack(prs, 1) if prs else torch.zeros(len(ap), 0, dtype=torch.float64)
    return ap, torch.where((n > 0)[:, None], pr, math.nan)


def revisited_map(
    scores: Tensor, gnd: Sequence[Mapping[str, Any]], kappas: Sequence[int] = (1, 5, 10), *, per_query: bool = False
) -> dict[str, Any]:
    """Revisited Oxford / Paris evaluation: mAP and mP@κ of the Easy, Medium and Hard setups.

    Args:
        scores: ``(Q, N)`` floating similarities of the ``N`` database images (``imlist`` order) to the ``Q`` queries
            (``qimlist`` order).
        gnd: The ground truth: one mapping per query with ``"easy"``, ``"hard"``, ``"junk"`` database indices (the
            ``gnd`` list of ``gnd_roxford5k.pkl``; :func:`pml_suprank.data.benchmarks.roxford.read_revisited_gnd`).
        kappas: The cut-offs κ of mP@κ (the protocol reports 1, 5, 10).
        per_query: Also return the per-query values (``"<setup>_ap"`` ``(Q,)`` and ``"<setup>_mp"`` ``(Q, K)``
            tensors, NaN for queries without a positive in the setup).

    Returns:
        ``{"easy_map", "medium_map", "hard_map"}`` and ``"<setup>_mp@<κ>"`` floats in ``[0, 1]`` (papers print × 100;
        NaN when no query has a positive in the setup), plus the per-query tensors when ``per_query``.

    Raises:
        TypeError: ``scores`` is not a floating tensor, ``gnd`` not a sequence.
        ValueError: ``len(gnd) != Q``, an index outside ``[0, N)``, a bad κ, NaN scores.
    """
    if not isinstance(scores, Tensor) or scores.dim() != 2:
        raise TypeError(f"scores must be a (Q, N) torch.Tensor; got {getattr(scores, 'shape', type(scores).__name__)}")
    if isinstance(kappas, (int, str)) or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in kappas):
        raise ValueError(f"kappas must be a sequence of positive ints; got {kappas!r}")
    num_queries, num_items = scores.shape
    membership = revisited_ground_truth(gnd, num_items)
    if len(gnd) != num_queries:
        raise ValueError(f"gnd must give one entry per query (scores has {num_queries} rows); got {len(gnd)}")
    membership = {k: v.to(scores.device) for k, v in membership.items()}
    scores = check_scores(scores)
    out: dict[str, Any] = {}
    for setup in REVISITED_SETUPS:
        positives, ignored = revisited_setup_masks(membership, setup)
        ranks = rank_levels(scores, positives.long(), 1, ~ignored)
        ap, pr = _revisited_scores(ranks.positions.cpu(), kappas)
        defined = ~torch.isnan(ap)
        out[f"{setup}_map"] = float(ap[defined].mean()) if bool(defined.any()) else math.nan
        for i, kappa in enumerate(kappas):
            out[f"{setup}_mp@{kappa}"] = float(pr[defined, i].mean()) if bool(defined.any()) else math.nan
        if per_query:
            out[f"{setup}_ap"], out[f"{setup}_mp"] = ap, pr
    return out
