"""Near / far OOD benchmark harness: fit each detector once, score ID test and every OOD set, report per-set and
per-group metrics (CSV, markdown table, score histograms)::

    result = ood.benchmark(
        {"KNN": ood.KNN(k=50), "RMDS": ood.RMDS(), "ASH": ood.ASH(head=fc)},
        id_test=test_feats,
        ood_sets={"near": {"ssb_hard": f1, "ninco": f2}, "far": {"textures": f3, "inaturalist": f4}},
        id_train=train_feats,
    )
    print(result.to_markdown())
    result.save("outputs/ood_benchmark")        # results.csv, results.md, score_histograms.png

Metrics per (detector, set): :data:`METRICS` of :mod:`pml_suprank.ood.metrics`; a group's row (``set = "mean"``) is
the unweighted mean over its sets, as OpenOOD's near / far columns.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor
from tqdm.auto import tqdm

from .._validation import check_choice
from . import metrics as ood_metrics
from .base import Detector, NotFittedError
from .features import OODFeatures
from .score_plots import plot_score_histograms

__all__ = ["METRICS", "BenchmarkResult", "benchmark"]

#: Metric columns of a benchmark row: AUROC, FPR at ``tpr`` (thesis Eq. 5.9 / HEAT; OpenOOD v1.5), AUPR-In / -Out.
METRICS = ("auroc", "fpr_id_positive", "fpr_ood_positive", "aupr_in", "aupr_out")
_TITLES = dict(zip(METRICS, ("AUROC ↑", "FPR{tpr} (ID+) ↓", "FPR{tpr} (OOD+) ↓", "AUPR-In ↑", "AUPR-Out ↑")))


def _as_inputs(where: str, value: Any) -> dict[str, Tensor]:
    if isinstance(value, OODFeatures):
        value = value.as_kwargs()
    if not isinstance(value, Mapping) or not any(isinstance(v, Tensor) for v in value.values()):
        raise TypeError(f"{where} must be an OODFeatures or a dict of tensors (features=..., logits=...); "
                        f"got {type(value).__name__}")  # fmt: skip
    return {k: v for k, v in value.items() if v is not None}


def _groups(ood_sets: Any) -> dict[str, dict[str, dict[str, Tensor]]]:
    """``{group: {set: inputs}}``; a feature set given directly under a name forms its own one-set group."""
    if not isinstance(ood_sets, Mapping) or not ood_sets:
        raise ValueError(f"ood_sets must be a non-empty mapping group -> {{name: features}}; got {ood_sets!r:.80}")
    out: dict[str, dict[str, dict[str, Tensor]]] = {}
    seen: set[str] = set()
    for group, sets in ood_sets.items():
        tensors = isinstance(sets, Mapping) and all(isinstance(v, Tensor) or v is None for v in sets.values())
        if isinstance(sets, OODFeatures) or (tensors and sets):
            sets = {group: sets}
        if not isinstance(sets, Mapping) or not sets:
            raise ValueError(f"ood_sets[{group!r}] must be a non-empty mapping name -> features; got {type(sets)}")
        out[str(group)] = {}
        for name, value in sets.items():
            if name in seen or name == "ID":
                raise ValueError(f"OOD set name {name!r} is used twice (or is the reserved 'ID'); names must be unique")
            seen.add(name)
            out[str(group)][str(name)] = _as_inputs(f"ood_sets[{group!r}][{name!r}]", value)
    return out


def _named(detectors: Any) -> dict[str, Detector]:
    if isinstance(detectors, Detector):
        detectors = [detectors]
    if isinstance(detectors, Mapping):
        items = list(detectors.items())
    elif isinstance(detectors, Sequence):
        items = [(d.detector_name or type(d).__name__, d) for d in detectors]
    else:
        raise TypeError(f"detectors must be a mapping name -> Detector or a list of detectors; got {type(detectors)}")
    named: dict[str, Detector] = {}
    for name, det in items:
        if not isinstance(det, Detector):
            raise TypeError(f"detectors[{name!r}] must be an ood.Detector; got {type(det).__name__}")
        if name in named:
            raise ValueError(f"two detectors are named {name!r}; pass a mapping name -> detector to tell them apart")
        named[name] = det
    if not named:
        raise ValueError("detectors must not be empty")
    return named


@dataclass
class BenchmarkResult:
    """Scores and metrics of :func:`benchmark`.

    Attributes:
        rows: One dict per (detector, group, set) and per (detector, group) mean (``set == "mean"``): ``detector``,
            ``group``, ``set``, ``n_id``, ``n_ood`` and :data:`METRICS`.
        scores: ``{detector: {"ID": (N_id,), set: (N_set,)}}`` outlier scores on CPU.
        groups: ``{group: (set names)}``.
        fit_seconds: ``{detector: seconds}`` spent in ``fit`` (empty without ``id_train``).
        tpr: The TPR of the FPR columns.
    """

    rows: list[dict[str, Any]]
    scores: dict[str, dict[str, Tensor]]
    groups: dict[str, tuple[str, ...]]
    fit_seconds: dict[str, float] = field(default_factory=dict)
    tpr: float = 0.95

    def row(self, detector: str, set_name: str, group: str | None = None) -> dict[str, Any]:
        """The row of one detector on one set (``set_name="mean"`` with ``group`` for a group's mean)."""
        for r in self.rows:
            if r["detector"] == detector and r["set"] == set_name and (group is None or r["group"] == group):
                return r
        raise KeyError(f"no row for detector {detector!r}, set {set_name!r}, group {group!r}")

    def to_markdown(self, metrics: Sequence[str] = METRICS, per_set: bool = True, digits: int = 1) -> str:
        """Markdown table in percent: one row per detector and set (``per_set``) or per group mean only."""
        for m in metrics:
            check_choice("metrics", m, METRICS)
        tpr = f"{100 * self.tpr:g}"
        head = ["detector", "group", "set", *(_TITLES[m].format(tpr=tpr) for m in metrics)]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * len(metrics)]
        for r in self.rows:
            if not per_set and r["set"] != "mean":
                continue
            cells = [r["detector"], r["group"], r["set"], *(f"{100 * r[m]:.{digits}f}" for m in metrics)]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def to_csv(self, path: str | Path) -> Path:
        """Write :attr:`rows` (fractions, not percent) as CSV. Returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["detector", "group", "set", "n_id", "n_ood", *METRICS])
            writer.writeheader()
            writer.writerows(self.rows)
        return path

    def plot(self, path: str | Path, bins: int = 40, dpi: int = 150) -> Path:
        """Score histograms (:func:`~pml_suprank.ood.score_plots.plot_score_histograms`). Returns the path."""
        id_scores = {name: per_set["ID"] for name, per_set in self.scores.items()}
        sets = [s for group in self.groups.values() for s in group]
        ood_scores = {s: {name: per_set[s] for name, per_set in self.scores.items()} for s in sets}
        return plot_score_histograms(id_scores, ood_scores, path, groups=self.groups, bins=bins, dpi=dpi)

    def save(self, output_dir: str | Path, plot: bool = True) -> dict[str, Path]:
        """Write ``results.csv``, ``results.md`` (markdown table) and ``score_histograms.png`` into ``output_dir``."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {"csv": self.to_csv(out / "results.csv")}
        files["markdown"] = out / "results.md"
        files["markdown"].write_text(
            "Per group (mean over its sets)\n\n" + self.to_markdown(per_set=False) + "\n\nPer set\n\n"
            + self.to_markdown() + "\n"
        )  # fmt: skip
        if plot:
            files["figure"] = self.plot(out / "score_histograms.png")
        return files

    def __str__(self) -> str:
        return self.to_markdown()


def _set_metrics(id_s: Tensor, ood_s: Tensor, tpr: float, ap_method: str) -> dict[str, float]:
    return {
        "auroc": ood_metrics.auroc(id_s, ood_s),
        "fpr_id_positive": ood_metrics.fpr_at_tpr(id_s, ood_s, tpr=tpr, convention="id_positive"),
        "fpr_ood_positive": ood_metrics.fpr_at_tpr(id_s, ood_s, tpr=tpr, convention="ood_positive"),
        "aupr_in": ood_metrics.aupr_in(id_s, ood_s, method=ap_method),
        "aupr_out": ood_metrics.aupr_out(id_s, ood_s, method=ap_method),
    }


def _score(det: Detector, name: str, where: str, inputs: dict[str, Tensor]) -> Tensor:
    scores = det.score(**{k: v for k, v in inputs.items() if k != "labels"})
    if not isinstance(scores, Tensor) or scores.dim() != 1:
        raise ValueError(f"{name}.score on {where} must return a 1-D tensor; got {getattr(scores, 'shape', scores)}")
    return scores.detach().cpu()


def benchmark(
    detectors: Mapping[str, Detector] | Sequence[Detector],
    id_test: OODFeatures | Mapping[str, Tensor],
    ood_sets: Mapping[str, Any],
    *,
    id_train: OODFeatures | Mapping[str, Tensor] | None = None,
    tpr: float = 0.95,
    ap_method: str = "step",
    output_dir: str | Path | None = None,
    plot: bool = True,
    progress: bool = True,
) -> BenchmarkResult:
    """Fit every detector once on ``id_train``, score ``id_test`` and every OOD set, and compute the metrics.

    Args:
        detectors: ``{name: Detector}`` (or a list, named by their registered names).
        id_test: ID test features (:class:`OODFeatures` or a dict of keyword tensors for ``score``).
        ood_sets: ``{group: {set name: features}}``, e.g. ``{"near": {...}, "far": {...}}``; a feature set given
            directly (``{"svhn": feats}``) is a group of its own.
        id_train: ID training features (with labels for class-conditional detectors): every detector is fitted on
            it once; without it the detectors must be fitted.
        tpr: TPR of the two FPR columns (0.95: FPR95).
        ap_method: ``"step"`` (HEAT / sklearn AP) or ``"trapezoid"`` (OpenOOD) AUPR.
        output_dir: Where :meth:`BenchmarkResult.save` writes CSV, markdown and (``plot``) the figure.
        plot: Write the histogram figure with ``output_dir`` (needs matplotlib).
        progress: Show a tqdm bar (stderr).
    """
    ood_metrics.check_tpr(tpr)
    check_choice("ap_method", ap_method, ("step", "trapezoid"))
    named = _named(detectors)
    test_inputs = _as_inputs("id_test", id_test)
    groups = _groups(ood_sets)
    train_inputs = None if id_train is None else _as_inputs("id_train", id_train)
    if train_inputs is None:
        unfitted = [n for n, d in named.items() if not d.is_fitted]
        if unfitted:
            raise NotFittedError(f"{unfitted} (benchmark without id_train= needs fitted detectors); the detectors")
    n_sets = sum(len(s) for s in groups.values())
    bar = tqdm(total=len(named) * (n_sets + 1 + (train_inputs is not None)), desc="OOD benchmark", disable=not progress)
    scores: dict[str, dict[str, Tensor]] = {}
    fit_seconds: dict[str, float] = {}
    try:
        for name, det in named.items():
            if train_inputs is not None:
                bar.set_postfix_str(f"fit {name}")
                start = time.perf_counter()
                det.fit(**train_inputs)
                fit_seconds[name] = time.perf_counter() - start
                bar.update(1)
            bar.set_postfix_str(f"score {name}")
            scores[name] = {"ID": _score(det, name, "id_test", test_inputs)}
            bar.update(1)
            for sets in groups.values():
                for set_name, inputs in sets.items():
                    scores[name][set_name] = _score(det, name, set_name, inputs)
                    bar.update(1)
    finally:
        bar.close()
    rows = []
    for name, per_set in scores.items():
        n_id = per_set["ID"].numel()
        for group, sets in groups.items():
            set_rows = [
                {"detector": name, "group": group, "set": set_name, "n_id": n_id, "n_ood": per_set[set_name].numel(),
                 **_set_metrics(per_set["ID"], per_set[set_name], tpr, ap_method)}
                for set_name in sets
            ]  # fmt: skip
            mean = {m: sum(r[m] for r in set_rows) / len(set_rows) for m in METRICS}
            n_ood = sum(r["n_ood"] for r in set_rows)
            rows += [*set_rows, {"detector": name, "group": group, "set": "mean", "n_id": n_id, "n_ood": n_ood, **mean}]
    result = BenchmarkResult(rows, scores, {g: tuple(s) for g, s in groups.items()}, fit_seconds, tpr)
    if output_dir is not None:
        result.save(output_dir, plot=plot)
    return result
