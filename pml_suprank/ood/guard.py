"""The OOD guard of a retrieval model: a fitted detector, a calibrated threshold and the model it belongs to, saved
**inside the model folder** (it travels with the model and its Hub repo)::

    final/ood/config.json, final/ood/model.safetensors   the detector (Detector.save_pretrained)
    final/ood/guard.json   {"version", "detector", "feature_kind", "model_sha256", "threshold", "higher_is_ood",
                            "tpr_target", "id_tpr", "ood_sets": {name: {"fpr", "auroc"}}}

**The rule**, for every detector: an image is OOD when its outlier score ``> threshold``. Held-out ID scores are
split in two seeded halves: the threshold is the ``ceil(tpr_target · n)``-th smallest score of the first, ``id_tpr``
the share of the *second* half kept. ``ood_sets`` records, per OOD set scored at fit time, the FPR (share accepted
as ID) and the AUROC against all held-out ID images.

``model_sha256`` is the SHA-256 of the folder's ``model.safetensors`` and ``feature_kind`` the features the detector
reads (``"pooled"`` or ``"embedding"``); loading and :meth:`OODGuard.predict` raise :class:`GuardMismatchError` on
a mismatch. Nothing is unpickled::

    guard = OODGuard.fit(model, train_loader, heldout_loader, ood_loaders={"noise": noise_loader},
                         detector=ood.HEAT(priors=("gmm", "gmm_std"), preset="fast"))
    guard.save("run/final")                       # writes run/final/ood/
    model = RetrievalModel.from_pretrained("run/final")
    verdict = model.ood_guard.predict(model, images)   # verdict.scores (N,), verdict.is_ood (N,) bool
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._safe_json import atomic_write, load_json
from .._validation import check_probability
from ..data.embedding_cache import state_digest
from ..hub.serialization import sha256_file
from . import metrics as ood_metrics
from .base import Detector
from .features import FEATURE_KINDS

__all__ = [
    "GUARD_DIR",
    "GUARD_FILE",
    "GUARD_FILES",
    "GUARD_KEYS",
    "GuardMismatchError",
    "GuardVerdict",
    "OODGuard",
    "attach_guard",
    "calibrate_threshold",
    "state_digest",
    "weights_sha256",
]

GUARD_DIR, GUARD_FILE = "ood", "guard.json"
VERSION = 1
#: the keys of ``guard.json`` (besides ``version``), read by the model card
GUARD_KEYS = ("detector", "feature_kind", "model_sha256", "threshold", "higher_is_ood", "tpr_target", "id_tpr",
              "ood_sets")  # fmt: skip
_WEIGHTS = "model.safetensors"
#: the guard's files inside a model folder (fetched with the model from one Hub snapshot)
GUARD_FILES = tuple(f"{GUARD_DIR}/{name}" for name in (GUARD_FILE, "config.json", _WEIGHTS))


class GuardMismatchError(ValueError):
    """A guard used with a model (or a detector) it was not fitted for; the message names both sides."""


@dataclass(frozen=True)
class GuardVerdict:
    """Per-image answer: ``scores`` ``(N,)`` (higher = more OOD), ``is_ood`` ``(N,)`` bool (``scores > threshold``)."""

    scores: Tensor
    is_ood: Tensor
    threshold: float

    def records(self) -> list[dict[str, Any]]:
        """``[{"score": float, "is_ood": bool}, ...]``, one per image (the ``"ood"`` entry of ``search``)."""
        return [{"score": float(s), "is_ood": bool(o)} for s, o in zip(self.scores.tolist(), self.is_ood.tolist())]


def weights_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of a weights file, or of ``model.safetensors`` in the folder ``path``."""
    path = Path(path)
    return sha256_file(path / _WEIGHTS if path.is_dir() else path)


def _finite(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number; got {value!r}")
    return float(value)


def _checked_values(values: Mapping[str, Any], at: str = "") -> dict[str, Any]:
    """The guard's scalars and ``ood_sets`` checked and normalised (errors name ``at`` + the key)."""
    kind, sha = values["feature_kind"], values["model_sha256"]
    if kind not in FEATURE_KINDS:
        raise ValueError(f"{at}feature_kind must be one of {FEATURE_KINDS}; got {kind!r}")
    if not isinstance(sha, str) or len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
        raise ValueError(f"{at}model_sha256 must be 64 lowercase hex digits; got {sha!r}")
    sets = {} if values["ood_sets"] is None else values["ood_sets"]
    if not isinstance(sets, Mapping):
        raise ValueError(f"{at}ood_sets must map OOD set names to {{'fpr', 'auroc'}}; got {type(sets).__name__}")
    for name, row in sets.items():
        if not isinstance(row, Mapping) or set(row) != {"fpr", "auroc"}:
            raise ValueError(f"{at}ood_sets[{name!r}] must be {{'fpr': float, 'auroc': float}}; got {row!r}")
        for key in ("fpr", "auroc"):
            check_probability(f"{at}ood_sets[{name!r}][{key!r}]", row[key])
    return {
        "threshold": _finite(f"{at}threshold", values["threshold"]),
        "feature_kind": kind,
        "model_sha256": sha,
        "tpr_target": ood_metrics.check_tpr(values["tpr_target"], f"{at}tpr_target"),
        "id_tpr": check_probability(f"{at}id_tpr", values["id_tpr"]),
        "ood_sets": {str(k): {"fpr": float(v["fpr"]), "auroc": float(v["auroc"])} for k, v in sets.items()},
    }


def calibrate_threshold(id_scores: Tensor, tpr_target: float = 0.95, *, seed: int = 0) -> tuple[float, float]:
    """``(threshold, id_tpr)`` from held-out ID scores ``(N,)``, ``N >= 2`` (see the module docstring: the threshold
    keeps ``tpr_target`` of a seeded half, ``id_tpr`` is measured on the other half)."""
    tpr_target = ood_metrics.check_tpr(tpr_target, "tpr_target")
    scores = ood_metrics.as_scores("id_scores", id_scores).cpu()
    if scores.numel() < 2:
        raise ValueError(f"id_scores must hold at least 2 held-out ID scores (calibrate + check); got {scores.numel()}")
    order = torch.randperm(scores.numel(), generator=torch.Generator().manual_seed(seed))
    half = (scores.numel() + 1) // 2
    calibration, check = scores[order[:half]].sort().values, scores[order[half:]]
    k = max(1, math.ceil(tpr_target * calibration.numel() - 1e-9))
    threshold = float(calibration[k - 1])
    return threshold, float((check <= threshold).to(torch.float64).mean())


@dataclass(eq=False, repr=False)
class OODGuard:
    """A fitted :class:`~pml_suprank.ood.Detector` of features with its calibrated ``threshold``, bound to one model's
    weights; the fields are those of ``guard.json`` (see the module docstring)."""

    detector: Any
    _: KW_ONLY
    threshold: float
    feature_kind: str
    model_sha256: str
    tpr_target: float
    id_tpr: float
    ood_sets: Mapping[str, Mapping[str, float]] | None = None

    def __post_init__(self) -> None:
        detector = self.detector
        if not isinstance(detector, Detector):
            raise TypeError(f"detector must be a pml_suprank.ood.Detector; got {type(detector).__name__}")
        if detector._scores_images():
            raise ValueError(f"{type(detector).__name__} scores images through the network: a guard needs a detector "
                             "of features (HEAT, Mahalanobis, KNN, ...)")  # fmt: skip
        if not detector.is_fitted:
            raise ValueError(f"detector {type(detector).__name__} is not fitted")
        fields = ("threshold", "feature_kind", "model_sha256", "tpr_target", "id_tpr", "ood_sets")
        for key, value in _checked_values({k: getattr(self, k) for k in fields}).items():
            setattr(self, key, value)
        detector.feature_kind = self.feature_kind

    @property
    def detector_name(self) -> str:
        return type(self.detector).detector_name or type(self.detector).__name__

    @classmethod
    def calibrate(
        cls,
        detector: Any,
        id_scores: Tensor,
        *,
        model_sha256: str,
        feature_kind: str = "pooled",
        tpr_target: float = 0.95,
        ood_scores: Mapping[str, Tensor] | None = None,
        seed: int = 0,
    ) -> OODGuard:
        """A guard from a fitted ``detector`` and its scores ``(N,)`` on held-out ID images (and ``{name: (M,)}``
        scores of OOD sets, for the recorded FPR / AUROC)."""
        threshold, id_tpr = calibrate_threshold(id_scores, tpr_target, seed=seed)
        measured = {}
        for name, scores in (ood_scores or {}).items():
            s = ood_metrics.as_scores(f"ood_scores[{name!r}]", scores)
            measured[str(name)] = {"fpr": float((s <= threshold).to(torch.float64).mean()),
                                   "auroc": ood_metrics.auroc(id_scores.float(), s.float())}  # fmt: skip
        return cls(detector, threshold=threshold, feature_kind=feature_kind, model_sha256=model_sha256,
                   tpr_target=tpr_target, id_tpr=id_tpr, ood_sets=measured)  # fmt: skip

    @classmethod
    def fit(
        cls,
        model: Any,
        train: Iterable,
        heldout: Iterable,
        *,
        detector: Any,
        ood_loaders: Mapping[str, Iterable] | None = None,
        tpr_target: float = 0.95,
        feature_kind: str = "pooled",
        model_sha256: str | None = None,
        device: torch.device | str | None = None,
        seed: int = 0,
    ) -> OODGuard:
        """Fit ``detector`` on ``model``'s features of the ID loader ``train`` (with labels for class-conditional
        detectors), calibrate on the held-out ID loader ``heldout`` and measure each OOD loader.

        ``model_sha256`` defaults to the ``weights_sha256`` of a model loaded by ``RetrievalModel.from_pretrained``
        (a model built in memory has none: save it first, or pass the hash of the file it will be saved as).
        """
        sha = model_sha256 or getattr(model, "weights_sha256", None)
        if sha is None:
            raise ValueError("model_sha256 is required for a model not loaded with from_pretrained (it has no "
                             "weights_sha256): the guard must name the weights it belongs to")  # fmt: skip
        detector.fit_model(model, train, device=device, features=feature_kind)
        id_scores = detector.predict(model, heldout, device=device, features=feature_kind)
        ood_scores = {k: detector.predict(model, v, device=device, features=feature_kind)
                      for k, v in (ood_loaders or {}).items()}  # fmt: skip
        return cls.calibrate(detector, id_scores, model_sha256=sha, feature_kind=feature_kind, tpr_target=tpr_target,
                             ood_scores=ood_scores, seed=seed)  # fmt: skip

    def verdict(self, scores: Tensor, threshold: float | None = None) -> GuardVerdict:
        """The verdict of scores ``(N,)``: ``is_ood = scores > threshold`` (default: the stored one)."""
        threshold = self.threshold if threshold is None else _finite("threshold", threshold)
        scores = scores.detach().float().cpu()
        return GuardVerdict(scores, scores > threshold, threshold)

    def check_model(self, model: Any) -> None:
        """Refuse a model loaded from other weights than the guard's (models built in memory are not checked)."""
        sha = getattr(model, "weights_sha256", None)
        if sha is not None and sha != self.model_sha256:
            raise GuardMismatchError(
                f"this guard was fitted on the model with weights sha256 {self.model_sha256}, not on the given model "
                f"(weights sha256 {sha}): refit it (fit_heat --model) for these weights"
            )

    def predict(
        self, model: Any, images: Tensor | Iterable, *, threshold: float | None = None,
        device: torch.device | str | None = None,
    ) -> GuardVerdict:  # fmt: skip
        """Scores and verdicts of images ``(B, C, H, W)`` (or a loader's batches), features extracted by ``model``.

        Raises:
            GuardMismatchError: ``model`` was loaded from other weights than the guard's.
        """
        self.check_model(model)
        scores = self.detector.predict(model, images, device=device, features=self.feature_kind)
        return self.verdict(scores, threshold)

    def to_dict(self) -> dict[str, Any]:
        """The content of ``guard.json``."""
        return {"version": VERSION, "detector": self.detector_name, "feature_kind": self.feature_kind,
                "model_sha256": self.model_sha256, "threshold": self.threshold, "higher_is_ood": True,
                "tpr_target": self.tpr_target, "id_tpr": self.id_tpr,
                "ood_sets": {k: dict(v) for k, v in self.ood_sets.items()}}  # fmt: skip

    def save(self, model_folder: str | Path) -> Path:
        """Write the guard into ``model_folder/ood/`` (the folder must hold the ``model.safetensors`` the guard was
        fitted on: refused otherwise). Returns the ``ood`` folder."""
        model_folder = Path(model_folder)
        if not (model_folder / _WEIGHTS).is_file():
            raise FileNotFoundError(f"{model_folder} has no {_WEIGHTS}: a guard is saved inside its model's folder")
        actual = weights_sha256(model_folder)
        if actual != self.model_sha256:
            raise GuardMismatchError(
                f"{model_folder / _WEIGHTS} has sha256 {actual}, but this guard was fitted on weights with sha256 "
                f"{self.model_sha256}: save it with the model it was fitted on"
            )
        folder = model_folder / GUARD_DIR
        self.detector.save_pretrained(folder, model_card=False)
        text = json.dumps(self.to_dict(), indent=1)
        atomic_write(folder / GUARD_FILE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        return folder

    @classmethod
    def load(cls, model_folder: str | Path, *, model_sha256: str | None = None) -> OODGuard:
        """The guard stored in ``model_folder/ood/``, checked against the folder's ``model.safetensors`` (or against
        ``model_sha256`` when given).

        Raises:
            FileNotFoundError: no ``ood/guard.json``.
            GuardMismatchError: the guard names other weights, or another feature kind than its detector's.
            ValueError: a malformed ``guard.json`` (naming the file and key), or an ``ood`` folder that is a link.
        """
        model_folder = Path(model_folder)
        path = model_folder / GUARD_DIR / GUARD_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{model_folder} has no {GUARD_DIR}/{GUARD_FILE} (no OOD guard was saved with it)")
        if (model_folder / GUARD_DIR).is_symlink():  # a Hub snapshot links files, never this folder
            raise ValueError(f"{model_folder / GUARD_DIR} is a link to {(model_folder / GUARD_DIR).resolve()}: a guard "
                             "is read only from inside its model folder (copy the folder there instead)")  # fmt: skip
        data = load_json(path, what="OOD guard", expected=dict)
        if set(data) != {"version", *GUARD_KEYS}:
            expected = sorted({"version", *GUARD_KEYS})
            raise ValueError(f"{path}: expected exactly the keys {expected}; got {sorted(data)}")
        if data["version"] != VERSION:
            raise ValueError(f"{path}: key 'version' must be {VERSION}; got {data['version']!r}")
        if data["higher_is_ood"] is not True:
            raise ValueError(f"{path}: key 'higher_is_ood' must be true (the one rule: score > threshold is OOD); got "
                             f"{data['higher_is_ood']!r}")  # fmt: skip
        if not isinstance(data["detector"], str):
            raise ValueError(f"{path}: key 'detector' must be a string; got {data['detector']!r}")
        values = _checked_values(data, at=f"{path}: key ")
        sha = model_sha256 or weights_sha256(model_folder)
        if data["model_sha256"] != sha:
            raise GuardMismatchError(
                f"{path} was fitted on the model with weights sha256 {data['model_sha256']}, but "
                f"{model_folder / _WEIGHTS} has sha256 {sha}: the guard belongs to other weights (refit it with "
                "fit_heat --model on this folder)"
            )
        detector = Detector.from_pretrained(model_folder / GUARD_DIR)
        name = type(detector).detector_name or type(detector).__name__
        if name != data["detector"]:
            raise GuardMismatchError(f"{path} names the detector {data['detector']!r}, but {GUARD_DIR}/config.json "
                                     f"holds a {name!r}")  # fmt: skip
        kind = getattr(detector, "feature_kind", None)
        if kind is not None and kind != data["feature_kind"]:
            raise GuardMismatchError(
                f"{path} has feature_kind {data['feature_kind']!r}, but its detector ({GUARD_DIR}/config.json) was "
                f"fitted on {kind!r} features"
            )
        return cls(detector, **values)

    def for_weights(self, model_sha256: str) -> OODGuard:
        """The same guard bound to another file of the *same* weights (a re-save: :func:`state_digest` unchanged)."""
        return dataclasses.replace(self, model_sha256=model_sha256)

    def __repr__(self) -> str:
        return (f"OODGuard(detector={self.detector_name}, feature_kind={self.feature_kind!r}, threshold="
                f"{self.threshold:.6g}, tpr_target={self.tpr_target}, id_tpr={self.id_tpr:.3f})")  # fmt: skip


def attach_guard(model: Any, folder: str | Path) -> Any:
    """Set ``model.weights_sha256`` and ``model.ood_guard`` (``None`` when ``folder`` has no guard) for a model just
    loaded from the local ``folder`` (a model folder, or the Hub snapshot its files came from). Returns ``model``.

    Raises:
        GuardMismatchError: the folder's guard was fitted on other weights or another feature kind.
    """
    folder = Path(folder)
    model.weights_sha256 = weights_sha256(folder)
    model._weights_digest = state_digest(model)  # to tell, when saving, whether the weights changed since
    has_guard = (folder / GUARD_DIR / GUARD_FILE).is_file()
    model.ood_guard = OODGuard.load(folder, model_sha256=model.weights_sha256) if has_guard else None
    return model
