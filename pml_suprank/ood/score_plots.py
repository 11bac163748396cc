"""Histograms of outlier scores (``fit_heat``, ``ood_benchmark``): one row per detector, one panel per OOD group.

Each panel shows the ID test scores (grey) against each OOD set of its group (fraction per bin, outliers in the outer
bins, x range the 0.5 %–99.5 % quantiles), every set's AUROC and FPR95 in the legend; heavy-tailed scores are drawn
on a symmetric-log axis. Names are drawn literally (no mathtext).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._validation import check_choice
from ..plots import DPI, literal, pyplot, save_figure
from .metrics import auroc, fpr_at_tpr

__all__ = ["plot_score_histograms"]

#: symmetric-log axis when the 0.5-99.5 % range exceeds this many times the smallest interquartile range of a set
HEAVY_TAIL_RATIO = 25.0


def _edges(sets: list[np.ndarray], bins: int) -> tuple[np.ndarray, float | None]:
    """``(bin edges, symlog linear threshold or None)`` of one panel (the linear part: the smallest set's IQR)."""
    values = np.concatenate(sets)
    lo, q1, q3, hi = np.quantile(values, [0.005, 0.25, 0.75, 0.995])
    if hi <= lo:
        return np.linspace(lo - 0.5, lo + 0.5, bins + 1), None
    spreads = [float(np.subtract(*np.quantile(a, [0.75, 0.25]))) for a in sets]
    iqr = min([x for x in spreads if x > 0], default=float(q3 - q1))
    if iqr > 0 and (hi - lo) / iqr <= HEAVY_TAIL_RATIO:
        return np.linspace(lo, hi, bins + 1), None
    c = float(max(iqr, (hi - lo) * 1e-6, np.finfo(float).tiny))
    # edges evenly spaced in y = sign(x) log10(1 + |x| / c), mapped back to x
    y = np.linspace(*(np.sign(x) * np.log10(1.0 + np.abs(x) / c) for x in (lo, hi)), bins + 1)
    return np.sign(y) * c * (10.0 ** np.abs(y) - 1.0), c


#: what FPR95 means under each convention of :func:`pml_suprank.ood.metrics.fpr_at_tpr` (stated on the figure)
CONVENTION_TEXT = {
    "id_positive": "FPR95 = share of OOD accepted at the threshold keeping 95 % of ID (ID positive)",
    "ood_positive": "FPR95 = share of ID flagged at the threshold catching 95 % of OOD (OOD positive, OpenOOD v1.5)",
    "id_positive_roc": "FPR95 = share of OOD accepted at the ROC threshold keeping 95 % of ID (OpenOOD legacy)",
}


def plot_score_histograms(
    id_scores: Mapping[str, Tensor],
    ood_scores: Mapping[str, Mapping[str, Tensor]],
    path: str | Path,
    *,
    groups: Mapping[str, Sequence[str]] | None = None,
    bins: int = 40,
    dpi: int = DPI,
    title: str = "Outlier scores: ID test vs OOD",
    convention: str = "id_positive",
) -> Path:
    """Save the score histograms to the PNG ``path``: ``id_scores`` ``{detector: (N_id,)}`` against ``ood_scores``
    ``{set: {detector: (N,)}}``, one panel per group of ``groups`` ``{group: [sets]}`` (default: one panel of every
    set); ``convention`` is the FPR95 convention (:func:`~pml_suprank.ood.metrics.fpr_at_tpr`) stated on the figure.

    Raises:
        ValueError: no detector, a detector missing from a set, a group naming an unknown set, or an empty /
            non-finite score set.
    """
    if not id_scores:
        raise ValueError("id_scores must name at least one detector; got none")
    if isinstance(bins, bool) or not isinstance(bins, int) or not 2 <= bins <= 1000:
        raise ValueError(f"bins must be an int in [2, 1000]; got {bins!r}")
    check_choice("convention", convention, CONVENTION_TEXT)
    for name, per_detector in ood_scores.items():
        missing = [d for d in id_scores if d not in per_detector]
        if missing:
            raise ValueError(f"ood_scores[{name!r}] lacks the detectors {missing}")
    named_groups = groups is not None
    groups = {str(g): list(sets) for g, sets in (groups or {"OOD": list(ood_scores)}).items()}
    for g, sets in groups.items():
        if not sets or not set(sets) <= ood_scores.keys():
            raise ValueError(f"groups[{g!r}] must name sets of ood_scores {list(ood_scores)}; got {sets}")
    plt = pyplot()
    names = list(id_scores)
    panels = [(name, group, sets) for name in names for group, sets in groups.items()]
    # a row per detector with a panel per group; one group: two detectors a row (the figure keeps a page's width)
    cols = len(groups) if len(groups) > 1 else min(2, len(names))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols + 0.4, 3.1 * rows + 0.9), squeeze=False)
    colours = [c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if c != "#7f7f7f"]
    colour_of = {s: colours[i % len(colours)] for i, s in enumerate(ood_scores)}
    for k, (name, group, sets) in enumerate(panels):
        row, col = divmod(k, cols)
        ax = axes[row, col]
        arrays = {"ID test": _array(id_scores[name], name, "ID test")}
        arrays.update({s: _array(ood_scores[s][name], name, s) for s in sets})
        edges, linthresh = _edges(list(arrays.values()), bins)
        for label, arr in arrays.items():
            weights = np.full(arr.size, 1.0 / arr.size)
            clipped = np.clip(arr, edges[0], edges[-1])
            if label == "ID test":
                ax.hist(clipped, bins=edges, weights=weights, color="#7f7f7f", alpha=0.45, label="ID test")
                continue
            a = auroc(id_scores[name], ood_scores[label][name])
            f = fpr_at_tpr(id_scores[name], ood_scores[label][name], convention=convention)
            ax.hist(clipped, bins=edges, weights=weights, histtype="step", lw=1.6, color=colour_of[label],
                    label=f"{literal(label)}: AUROC {100 * a:.1f} · FPR95 {100 * f:.1f}")  # fmt: skip
        if linthresh is not None:
            ax.set_xscale("symlog", linthresh=linthresh)
        ax.set_title(f"{literal(name)} — {literal(group)}" if named_groups else literal(name), fontsize=9)
        ax.set_xlabel("score (higher = more OOD)" + (", symlog" if linthresh is not None else ""), fontsize=8)
        ax.set_ylabel("fraction of the set", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="best", frameon=False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{literal(title)}\n{CONVENTION_TEXT[convention]}", fontsize=9)
    return save_figure(fig, path, dpi=dpi, top=1 - 0.6 / fig.get_size_inches()[1])  # room for the two-line title


def _array(scores: Tensor, detector: str, label: str) -> np.ndarray:
    arr = torch.as_tensor(scores).detach().double().cpu().reshape(-1).numpy()
    if arr.size == 0 or not np.isfinite(arr).all():
        raise ValueError(f"scores of {detector!r} on {label!r} must be non-empty and finite")
    return arr
