"""``detector.fit_model(model, loader)`` / ``detector.predict(model, x)`` (pytorch-ood style) for timm classifiers
and :class:`~pml_suprank.models.RetrievalModel`, features as :func:`~pml_suprank.ood.features.extract_model_features`::

    det = ood.ASH().fit_model(timm_model, train_loader)      # the head is taken from the model when not given
    scores = det.predict(timm_model, images)                  # (B,) outlier scores, higher = more OOD

Extraction runs once per call: for several detectors, extract once and use ``fit`` / ``score`` (or
:func:`ood.benchmark`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .features import FeatureKind, batch_images, extract_model_features, is_retrieval_model, model_device

__all__ = ["ModelDetectorMixin", "model_head", "read_state_dict"]


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The state dict in ``path``: ``.safetensors``, or a ``torch.save`` file read with ``weights_only=True``
    (``ValueError`` naming the file: missing, unreadable, or not a flat mapping of parameter names to tensors)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # SafetensorError, UnpicklingError (a pickled object), a truncated zip: all "unreadable"
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise ValueError(f"{path} cannot be read as a state dict ({type(e).__name__}: {first})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        nested = [k for k, v in state.items() if isinstance(v, dict)] if isinstance(state, dict) else []
        hint = f" (it nests dicts under {nested[:3]}: save model.state_dict() itself)" if nested else ""
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict of parameter names to tensors{hint}")
    return state


def model_head(model: nn.Module, who: str) -> nn.Module:
    """The classifier head of a ``RetrievalModel`` or a timm model (``get_classifier``); ``ValueError`` naming
    ``who`` when it has none."""
    if is_retrieval_model(model):
        head = model.classifier
    else:
        get = getattr(model, "get_classifier", None)
        head = get() if callable(get) else None
    if not isinstance(getattr(head, "weight", None), Tensor):
        raise ValueError(f"{who} needs a classifier head and the model has none")
    return head


class ModelDetectorMixin:
    """``fit_model`` / ``predict`` for every :class:`~pml_suprank.ood.Detector` (mixed into the base class)."""

    def _adopt(self, model: nn.Module) -> None:
        """Take from ``model`` what the detector was built without: the classifier head (head detectors, HEAT with
        ``el``) or the network (ODIN). Default: nothing."""

    def _scores_images(self) -> bool:
        """Detectors built around the network (ODIN: a ``model=`` argument) score images, not features."""
        return "model" in inspect.signature(type(self)).parameters

    def fit_model(
        self,
        model: nn.Module,
        loader: Iterable,
        *,
        device: torch.device | str | None = None,
        max_batches: int | None = None,
        features: FeatureKind = "pooled",
        **fit_kwargs: Any,
    ):
        """Extract features of ``model`` on ``loader`` (ID training data) and :meth:`fit` on them. Returns ``self``.

        ``fit_kwargs`` go to ``fit`` (e.g. ``callback=`` for HEAT). The detector remembers ``features``
        (``feature_kind``): :meth:`predict` extracts the same kind by default.
        """
        self._adopt(model)
        if self._scores_images():
            return self.fit(**fit_kwargs)
        feats = extract_model_features(model, loader, device=device, max_batches=max_batches, features=features)
        fitted = self.fit(**feats.as_kwargs(), **fit_kwargs)
        self.feature_kind = features
        return fitted

    def predict(
        self,
        model: nn.Module,
        x: Tensor | Iterable,
        *,
        device: torch.device | str | None = None,
        features: FeatureKind | None = None,
    ) -> Tensor:
        """Outlier scores ``(N,)`` (higher = more OOD) of images ``x`` ``(B, C, H, W)`` or of a loader's batches,
        features extracted by ``model`` as in :meth:`fit_model`; ``features`` defaults to the fitted kind.

        Raises:
            ValueError: ``features`` differs from the kind the detector was fitted on.
        """
        fitted = getattr(self, "feature_kind", None)
        if features is not None and fitted is not None and features != fitted:
            raise ValueError(
                f"{type(self).__name__} was fitted on {fitted!r} features (fit_model(features={fitted!r})); got "
                f"features={features!r}: scores of another feature space mean nothing"
            )
        features = features or fitted or "pooled"
        self._adopt(model)
        if self._scores_images():
            device = device or model_device(model)
            batches = [x] if isinstance(x, Tensor) else x
            return torch.cat([self.score(inputs=batch_images(b)[0].to(device)).cpu() for b in batches])
        feats = extract_model_features(model, x, device=device, features=features)
        return self.score(**{k: v for k, v in feats.as_kwargs().items() if k != "labels"})
