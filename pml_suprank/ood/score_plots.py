"""Histograms of outlier scores, one panel per detector, shared by ``fit_heat`` and ``ood_benchmark``.

Each panel shows the in-distribution test scores against every OOD group (the fraction of each set per bin; scores
beyond the drawn range count in the outer bins), with the x axis labelled
(higher = more out-of-distribution), the group's AUROC and FPR95 (:func:`pml_suprank.ood.metrics.auroc`,
:func:`~pml_suprank.ood.metrics.fpr_at_tpr`, FPR95 in the convention of the result tables) in the
panel's title, and one legend for the figure. Scores whose range spans orders of magnitude (energies, Mahalanobis
distances, KNN, RMDS, ...) are drawn on a symmetric-log x axis with bins even on that axis, so that neither set is
squeezed into one bin; the x range is the 0.5 %–99.5 % quantile range of all scores of the panel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .metrics import auroc, fpr_at_tpr

__all__ = ["plot_score_histograms"]

#: a panel is drawn on a symmetric-log axis when its 0.5-99.5 % range exceeds this many times the smallest
#: interquartile range of its sets
HEAVY_TAIL_RATIO = 25.0


def _edges(sets: list[np.ndarray], bins: int) -> tuple[np.ndarray, float | None]:
    """``(bin edges, symlog linear threshold or None)`` for the score sets of one panel (the linear part of the
    symlog axis is the smallest interquartile range of a set, so the tightest set still spans several bins)."""
    values = np.concatenate(sets)
    lo, hi = np.quantile(values, [0.005, 0.995])
    q1, q3 = np.quantile(values, [0.25, 0.75])
    if hi <= lo:
        return np.linspace(lo - 0.5, lo + 0.5, bins + 1), None
    spreads = [float(np.subtract(*np.quantile(a, [0.75, 0.25]))) for a in sets]
    iqr = min([x for x in spreads if x > 0], default=float(q3 - q1))
    if iqr > 0 and (hi - lo) / iqr <= HEAVY_TAIL_RATIO:
        return np.linspace(lo, hi, bins + 1), None
    c = float(max(iqr, (hi - lo) * 1e-6, np.finfo(float).tiny))

    def forward(x: np.ndarray) -> np.ndarray:
        return np.sign(x) * np.log10(1.0 + np.abs(x) / c)

    def inverse(y: np.ndarray) -> np.ndarray:
        return np.sign(y) * c * (10.0 ** np.abs(y) - 1.0)

    return inverse(np.linspace(forward(np.array(lo)), forward(np.array(hi)), bins + 1)), c


def plot_score_histograms(
    id_scores: Mapping[str, Tensor],
    ood_scores: Mapping[str, Mapping[str, Tensor]],
    path: str | Path,
    *,
    bins: int = 40,
    dpi: int = 110,
    title: str = "Outlier scores: ID test vs OOD",
    convention: str = "id_positive",
) -> Path:
    """Save the score histograms of every detector to ``path``.

    Args:
        id_scores: detector name → ``(N_id,)`` scores of the ID test set.
        ood_scores: OOD group name (e.g. ``"near"``, ``"far"`` or a set name) → detector name → ``(N,)`` scores.
        path: The PNG file written.
        bins: Bins per panel.
        dpi: Resolution.
        title: The figure's title.
        convention: FPR95 convention (:func:`pml_suprank.ood.metrics.fpr_at_tpr`), that of the result tables.

    Raises:
        ValueError: no detector, a detector missing from a group, or an empty / non-finite score set.
    """
    if not id_scores:
        raise ValueError("id_scores must name at least one detector; got none")
    if isinstance(bins, bool) or not isinstance(bins, int) or not 2 <= bins <= 1000:
        raise ValueError(f"bins must be an int in [2, 1000]; got {bins!r}")
    for group, per_detector in ood_scores.items():
        missing = [d for d in id_scores if d not in per_detector]
        if missing:
            raise ValueError(f"ood_scores[{group!r}] lacks the detectors {missing}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(id_scores)
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.0 * rows + 0.6), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes.flat, names):
        sets = {"ID test": id_scores[name], **{f"OOD {g}": s[name] for g, s in ood_scores.items()}}
        arrays = {}
        for label, scores in sets.items():
            arr = torch.as_tensor(scores).detach().double().cpu().reshape(-1).numpy()
            if arr.size == 0 or not np.isfinite(arr).all():
                raise ValueError(f"scores of {name!r} on {label!r} must be non-empty and finite")
            arrays[label] = arr
        edges, linthresh = _edges(list(arrays.values()), bins)
        for j, (label, arr) in enumerate(arrays.items()):
            ax.hist(np.clip(arr, edges[0], edges[-1]), bins=edges, weights=np.full(arr.size, 1.0 / arr.size),
                    alpha=0.5 if j == 0 else 0.45, color=colours[j % len(colours)], label=label)  # fmt: skip
        if linthresh is not None:
            ax.set_xscale("symlog", linthresh=linthresh)
        lines = [name]
        for g, s in ood_scores.items():
            lines.append(
                f"{g}: AUROC {100 * auroc(id_scores[name], s[name]):.1f} · FPR95 "
                f"{100 * fpr_at_tpr(id_scores[name], s[name], convention=convention):.1f}"
            )
        ax.set_title("\n".join(lines), fontsize=8)
        ax.set_xlabel("score (higher = more OOD)" + (", symlog" if linthresh is not None else ""), fontsize=8)
        ax.set_ylabel("fraction of the set", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
