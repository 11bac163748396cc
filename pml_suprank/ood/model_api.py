"""``detector.fit_model(model, loader)`` / ``detector.predict(model, x)`` (pytorch-ood style) for timm classifiers
and :class:`~pml_suprank.models.RetrievalModel`::

    det = ood.ASH().fit_model(timm_model, train_loader)      # the head is taken from the model when not given
    scores = det.predict(timm_model, images)                  # (B,) outlier scores, higher = more OOD

For a timm classifier the features are those of :func:`~pml_suprank.ood.extract_features`. For a ``RetrievalModel``,
``z`` is the pooled backbone feature (``logits = classifier(z)``, ``None`` without a classification head) or, with
``features="embedding"``, the embedding. Extraction runs once per call: for several detectors, extract once and use
``fit`` / ``score`` (or :func:`ood.benchmark`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from .features import OODFeatures, batch_images, collect_features, extract_features, model_device, pool_feature_map

__all__ = ["ModelDetectorMixin", "extract_model_features", "read_state_dict"]

FeatureKind = Literal["pooled", "embedding"]
FEATURE_KINDS = get_args(FeatureKind)


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The state dict in ``path``: ``.safetensors``, or a ``torch.save`` file read with ``weights_only=True``.

    Raises:
        ValueError: naming the file: missing, unreadable, or not a flat mapping of parameter names to tensors.
    """
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


def is_retrieval_model(model: Any) -> bool:
    """A ``RetrievalModel`` (or a model with its interface), told by what it offers: ``models`` imports this package."""
    return all(callable(getattr(model, name, None)) for name in ("forward_features", "pool", "embed_pooled")) and (
        hasattr(model, "classifier")
    )


def _retrieval_features(model, batches: Iterable, device, max_batches: int | None, features: FeatureKind):
    def retrieval_parts(images: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        fmap = model.forward_features(images)
        pooled = model.pool(fmap)
        try:
            sigma = pool_feature_map(fmap)[1]
        except ValueError:  # a single spatial position: no std-pooled features
            sigma = None
        z = pooled if features == "pooled" else model.embed_pooled(pooled)
        return z, sigma, None if model.classifier is None else model.classifier(pooled)

    return collect_features(model, batches, device, max_batches, retrieval_parts)


def extract_model_features(
    model: nn.Module,
    batches: Iterable | Tensor,
    device: torch.device | str | None = None,
    max_batches: int | None = None,
    features: FeatureKind = "pooled",
) -> OODFeatures:
    """Features of a timm classifier or a ``RetrievalModel`` on a loader (or one image batch ``(B, C, H, W)``).

    ``batches`` as :func:`batch_images`; ``device`` defaults to the model's; ``features`` (``RetrievalModel`` only):
    ``"pooled"`` backbone features or the ``"embedding"``. Returns :class:`~pml_suprank.ood.OODFeatures` (float32,
    CPU).
    """
    if features not in FEATURE_KINDS:
        raise ValueError(f"features must be 'pooled' or 'embedding'; got {features!r}")
    if isinstance(batches, Tensor):
        batch_images(batches)  # validates the shape
        batches = [batches]
    device = device or model_device(model)
    if is_retrieval_model(model):
        return _retrieval_features(model, batches, device, max_batches, features)
    if features != "pooled":
        raise ValueError("features='embedding' needs a RetrievalModel; timm classifiers give pooled features")
    return extract_features(model, batches, device=device, max_batches=max_batches)


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
