"""OOD detection metrics: AUROC, FPR at a given TPR (both published conventions), AUPR-in/out, detection accuracy.

Every function takes two 1-D score vectors, ``id_scores`` ``(N_id,)`` and ``ood_scores`` ``(N_ood,)``, where
**higher = more OOD**, and returns a Python float; exact (ties grouped, never broken by input order), in float64.

Conventions (Lafon, thesis Sec. 5.3, Eqs. 5.8-5.9; OpenOOD v1.5; pytorch-ood 0.4.0):

* ``auroc``: P(s_ood > s_id) + ½ P(s_ood = s_id) (Mann-Whitney; ties count ½ as in sklearn, OpenOOD and
  pytorch-ood; the thesis Eq. 5.8 ignores ties).
* ``fpr_at_tpr(..., convention="id_positive")`` (default, HEAT / KNN-OOD / the thesis tables): the threshold is the
  linearly interpolated ``tpr``-quantile of the ID scores (95 % of ID accepted); the value is the share of OOD
  samples with a score strictly below it (accepted as ID).
* ``convention="ood_positive"`` (OpenOOD v1.5 since Aug 2023, pytorch-ood): on the exact ROC curve with OOD as the
  positive class, the share of **ID** samples flagged at the first threshold where at least ``tpr`` of OOD is caught.
* ``convention="id_positive_roc"``: OpenOOD's legacy ``fpr_recall``: ID positive, discrete ROC threshold instead of
  the interpolated quantile (differs from ``id_positive`` on small sets with ties).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from .._validation import check_choice, check_probability

__all__ = [
    "FPRConvention",
    "APMethod",
    "auroc",
    "fpr_at_tpr",
    "aupr_in",
    "aupr_out",
    "detection_accuracy",
    "evaluate",
]

FPRConvention = Literal["id_positive", "ood_positive", "id_positive_roc"]
APMethod = Literal["step", "trapezoid"]


def as_scores(name: str, x) -> Tensor:
    """``x`` as a finite, non-empty float64 vector of scores (``TypeError`` / ``ValueError`` naming ``name``)."""
    if not isinstance(x, Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a 1-D tensor or array of scores; got {type(x).__name__}") from err
    if x.dim() != 1:
        raise ValueError(f"{name} must be a 1-D vector of scores; got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must contain at least one score; got an empty vector")
    if x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must hold real scores; got dtype {x.dtype}")
    x = x.detach().to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf scores ({int((~torch.isfinite(x)).sum())} of {x.numel()})")
    return x


def _roc_counts(pos: Tensor, neg: Tensor) -> tuple[Tensor, Tensor]:
    """Cumulative (tp, fp) counts at each distinct threshold, thresholds in decreasing order (score >= t flagged)."""
    scores = torch.cat([pos, neg])
    is_pos = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    order = torch.argsort(scores, descending=True, stable=True)
    s, y = scores[order], is_pos[order]
    tps, fps = torch.cumsum(y, 0), torch.cumsum(1.0 - y, 0)
    # the last position of each group of equal scores closes a threshold
    last = torch.ones_like(s, dtype=torch.bool)
    last[:-1] = s[1:] != s[:-1]
    return tps[last], fps[last]


def auroc(id_scores, ood_scores) -> float:
    """Area under the ROC curve, OOD positive (thesis Eq. 5.8 with ties counted ½, as sklearn's ``roc_auc_score``)."""
    id_s, ood_s = as_scores("id_scores", id_scores), as_scores("ood_scores", ood_scores)
    scores = torch.cat([id_s, ood_s])
    sorted_s, order = torch.sort(scores, stable=True)
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    avg_rank = ends - (counts.to(torch.float64) - 1.0) / 2.0  # average 1-based rank of each tie group
    ranks = torch.empty_like(scores).scatter(0, order, avg_rank[inverse])
    n_id, n_ood = id_s.numel(), ood_s.numel()
    u = ranks[n_id:].sum() - n_ood * (n_ood + 1) / 2.0
    return float(u / (n_id * n_ood))


def fpr_at_tpr(id_scores, ood_scores, tpr: float = 0.95, convention: FPRConvention = "id_positive") -> float:
    """False-positive rate at the true-positive rate ``tpr`` in (0, 1] (FPR95 for 0.95), under ``convention``
    (``"id_positive"``: thesis Eq. 5.9; ``"ood_positive"``: OpenOOD v1.5; ``"id_positive_roc"``: see the module)."""
    check_tpr(tpr)
    check_choice("convention", convention, get_args(FPRConvention))
    id_s, ood_s = as_scores("id_scores", id_scores), as_scores("ood_scores", ood_scores)
    if convention == "id_positive":
        threshold = quantile_linear(id_s, tpr)
        return float((ood_s < threshold).to(torch.float64).mean())
    if convention == "ood_positive":
        pos, neg = ood_s, id_s
    else:  # id_positive_roc: ID is the positive class, confidence = -score
        pos, neg = -id_s, -ood_s
    tps, fps = _roc_counts(pos, neg)
    reached = (tps / pos.numel()) >= tpr
    first = int(torch.nonzero(reached)[0, 0])  # always exists: the last threshold has tp = N_pos
    return float(fps[first] / neg.numel())


def check_tpr(tpr: float, name: str = "tpr") -> float:
    """``tpr`` in (0, 1], else ``TypeError`` / ``ValueError`` naming it."""
    if check_probability(name, tpr) == 0.0:
        raise ValueError(f"{name} must lie in (0, 1]; got {tpr}")
    return float(tpr)


def quantile_linear(x: Tensor, q: float) -> Tensor:
    """0-dim ``q``-quantile (``q`` in [0, 1]) of all entries of ``x``, linearly interpolated (``numpy.percentile``'s
    default); unlike ``torch.quantile`` without a size limit (two ``kthvalue`` calls)."""
    flat = x.reshape(-1)
    n = flat.numel()
    pos = q * (n - 1)
    lo = int(pos)  # floor, pos >= 0
    hi = min(lo + 1, n - 1)
    v_lo = torch.kthvalue(flat, lo + 1).values
    if hi == lo or pos == lo:
        return v_lo
    v_hi = torch.kthvalue(flat, hi + 1).values
    return v_lo + (v_hi - v_lo) * (pos - lo)


def _average_precision(id_scores, ood_scores, method: APMethod, id_positive: bool) -> float:
    check_choice("method", method, get_args(APMethod))
    id_s, ood_s = as_scores("id_scores", id_scores), as_scores("ood_scores", ood_scores)
    pos, neg = (-id_s, -ood_s) if id_positive else (ood_s, id_s)
    tps, fps = _roc_counts(pos, neg)
    precision = tps / (tps + fps)
    recall = tps / pos.numel()
    prev_r = torch.cat([recall.new_zeros(1), recall[:-1]])
    if method == "step":  # sklearn average_precision_score
        return float(((recall - prev_r) * precision).sum())
    prev_p = torch.cat([precision.new_ones(1), precision[:-1]])  # sklearn's (recall 0, precision 1) end point
    return float(((recall - prev_r) * (precision + prev_p) / 2.0).sum())


def aupr_in(id_scores, ood_scores, method: APMethod = "step") -> float:
    """Area under the precision-recall curve, ID positive (score ``-s``): ``method="step"`` (average precision as
    sklearn and HEAT's code) or ``"trapezoid"`` (``auc(recall, precision)`` as OpenOOD v1.5 and pytorch-ood)."""
    return _average_precision(id_scores, ood_scores, method, id_positive=True)


def aupr_out(id_scores, ood_scores, method: APMethod = "step") -> float:
    """Area under the precision-recall curve, OOD positive; ``method`` as :func:`aupr_in`."""
    return _average_precision(id_scores, ood_scores, method, id_positive=False)


def detection_accuracy(id_scores, ood_scores) -> float:
    """Best balanced detection accuracy ``0.5·max_t(TPR_ood(t) + 1 − FPR_id(t))`` over all thresholds (HEAT DetAcc)."""
    id_s, ood_s = as_scores("id_scores", id_scores), as_scores("ood_scores", ood_scores)
    tps, fps = _roc_counts(ood_s, id_s)
    best = torch.clamp((tps / ood_s.numel() + 1.0 - fps / id_s.numel()).max(), min=1.0)  # t = +inf gives 1
    return float(0.5 * best)


def evaluate(
    id_scores, ood_scores, tpr: float = 0.95, convention: FPRConvention = "id_positive", ap_method: APMethod = "step"
) -> dict[str, float]:
    """All metrics at once: ``{"fpr", "auroc", "aupr_in", "aupr_out", "detection_accuracy"}`` (see each function)."""
    return {
        "fpr": fpr_at_tpr(id_scores, ood_scores, tpr=tpr, convention=convention),
        "auroc": auroc(id_scores, ood_scores),
        "aupr_in": aupr_in(id_scores, ood_scores, method=ap_method),
        "aupr_out": aupr_out(id_scores, ood_scores, method=ap_method),
        "detection_accuracy": detection_accuracy(id_scores, ood_scores),
    }
