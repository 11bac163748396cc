"""Feature extraction for post-hoc OOD detection (HEAT, thesis Sec. 5.2.2) from a timm classifier or a
:class:`~pml_suprank.models.RetrievalModel`.

timm: ``z = forward_head(fmap, pre_logits=True)`` is the input of the classifier's last linear layer, so that
detectors using the head see ``logits = W z + b`` (for ResNets exactly the spatial mean of ``layer4``; for ViTs
timm's own pooling). ``RetrievalModel``: ``z`` is the pooled backbone feature (``logits = classifier(z)``, ``None``
without a classification head) or, with ``features="embedding"``, the embedding. ``σ`` is the **unbiased** std
(ddof = 1) of the raw map over its positions or tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from .._eval_mode import eval_mode

__all__ = ["OODFeatures", "extract_features", "extract_model_features", "feature_map_positions", "pool_feature_map"]

FeatureKind = Literal["pooled", "embedding"]
FEATURE_KINDS = get_args(FeatureKind)


@dataclass
class OODFeatures:
    """Per-sample features: ``features`` ``(N, C)`` (``z``), ``std_features`` ``(N, C)`` (``σ``), ``logits``
    ``(N, K)`` and ``labels`` ``(N,)`` (column 0 of the dataset's labels) or ``None``."""

    features: Tensor
    std_features: Tensor
    logits: Tensor
    labels: Tensor | None = None

    def as_kwargs(self) -> dict[str, Tensor]:
        """Keyword arguments for ``Detector.fit`` / ``score``: ``features, std_features, logits, labels``."""
        out = {"features": self.features, "std_features": self.std_features, "logits": self.logits}
        if self.labels is not None:
            out["labels"] = self.labels
        return out

    def __len__(self) -> int:
        return self.features.shape[0]


def pool_feature_map(feature_map: Tensor) -> tuple[Tensor, Tensor]:
    """``(z, σ)``, each ``(B, C)``: mean and unbiased std of a ``(B, C, H, W)`` map over ``H·W ≥ 2`` positions, or of
    ``(B, N, C)`` tokens over ``N``."""
    if not isinstance(feature_map, Tensor) or feature_map.dim() not in (3, 4):
        shape = tuple(feature_map.shape) if isinstance(feature_map, Tensor) else type(feature_map).__name__
        raise ValueError(f"feature_map must have shape (B, C, H, W) or (B, N, C); got {shape}")
    dims = (2, 3) if feature_map.dim() == 4 else (1,)
    n_positions = feature_map.shape[2] * feature_map.shape[3] if feature_map.dim() == 4 else feature_map.shape[1]
    if n_positions < 2:
        raise ValueError(f"std pooling needs at least 2 spatial positions; got feature_map {tuple(feature_map.shape)}")
    return feature_map.mean(dim=dims), feature_map.std(dim=dims, unbiased=True)


@torch.no_grad()
def feature_map_positions(model: nn.Module, image_size: int, device: torch.device | str = "cpu") -> int:
    """The positions ``H·W`` (or tokens ``N``) of ``model.forward_features`` on one ``image_size`` image (std pooling
    needs 2); one forward pass in eval mode."""
    with eval_mode(model):
        fmap = model.forward_features(torch.zeros(1, 3, image_size, image_size, device=device))
    return int(fmap.shape[2] * fmap.shape[3]) if fmap.dim() == 4 else int(fmap.shape[1])


def batch_images(batch: Any) -> tuple[Tensor, Tensor | None]:
    """``(images, labels or None)`` of a batch: a dict (``"image"`` / ``"pixel_values"``, ``"labels"`` /
    ``"label"``), an ``(images, labels)`` tuple or an image tensor; 2-D labels keep column 0 (finest level)."""
    if isinstance(batch, dict):
        images = batch.get("image", batch.get("pixel_values"))
        labels = batch.get("labels", batch.get("label"))
    elif isinstance(batch, (list, tuple)):
        images, labels = batch[0], (batch[1] if len(batch) > 1 else None)
    else:
        images, labels = batch, None
    if not isinstance(images, Tensor) or images.dim() != 4:
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise TypeError(f"batches must hold an image tensor (B, C, H, W) (dict 'image' or first element); got {got}")
    if isinstance(labels, Tensor) and labels.dim() == 2:
        labels = labels[:, 0]
    return images, labels if isinstance(labels, Tensor) else None


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    first = next(model.parameters(), None) if isinstance(model, nn.Module) else None
    return first.device if first is not None else torch.device("cpu")


def is_retrieval_model(model: Any) -> bool:
    """A ``RetrievalModel`` (or a model with its interface), told by what it offers: ``models`` imports this package."""
    return all(callable(getattr(model, name, None)) for name in ("forward_features", "pool", "embed_pooled")) and (
        hasattr(model, "classifier")
    )


def _parts(model: nn.Module, images: Tensor, features: FeatureKind) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(z (B, D), σ or None, logits or None)`` of one image batch."""
    fmap = model.forward_features(images)
    if not is_retrieval_model(model):
        return model.forward_head(fmap, pre_logits=True), pool_feature_map(fmap)[1], model.forward_head(fmap)
    pooled = model.pool(fmap)
    try:
        sigma = pool_feature_map(fmap)[1]
    except ValueError:  # a single spatial position: no std-pooled features
        sigma = None
    z = pooled if features == "pooled" else model.embed_pooled(pooled)
    return z, sigma, None if model.classifier is None else model.classifier(pooled)


@torch.no_grad()
def extract_model_features(
    model: nn.Module,
    batches: Iterable | Tensor,
    device: torch.device | str | None = None,
    max_batches: int | None = None,
    features: FeatureKind = "pooled",
) -> OODFeatures:
    """Features of a timm classifier or a ``RetrievalModel`` (in eval mode) on a loader or one image batch
    ``(B, C, H, W)`` (as :func:`batch_images`; at most ``max_batches``), on ``device`` (default: the model's), as
    :class:`OODFeatures` (float32, CPU; ``None`` fields where a batch has none). ``features`` (``RetrievalModel``
    only): the ``"pooled"`` backbone features or the ``"embedding"``."""
    if features not in FEATURE_KINDS:
        raise ValueError(f"features must be 'pooled' or 'embedding'; got {features!r}")
    if not is_retrieval_model(model):
        if not (hasattr(model, "forward_features") and hasattr(model, "forward_head")):
            raise TypeError(
                f"model must be a timm model with forward_features/forward_head; got {type(model).__name__}"
            )
        if features != "pooled":
            raise ValueError("features='embedding' needs a RetrievalModel; timm classifiers give pooled features")
    if isinstance(batches, Tensor):
        batches = [batch_images(batches)[0]]
    device = device or model_device(model)
    zs, sigmas, logits, labels = [], [], [], []
    with eval_mode(model):
        for i, batch in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            images, y = batch_images(batch)
            z, sigma, logit = _parts(model, images.to(device), features)
            zs.append(z.float().cpu())
            sigmas.append(None if sigma is None else sigma.float().cpu())
            logits.append(None if logit is None else logit.float().cpu())
            if y is not None:
                labels.append(y.cpu())
    if not zs:
        raise ValueError("batches yielded no data")
    cat = lambda parts: None if any(p is None for p in parts) else torch.cat(parts)  # noqa: E731
    return OODFeatures(torch.cat(zs), cat(sigmas), cat(logits), torch.cat(labels) if len(labels) == len(zs) else None)


def extract_features(
    model: nn.Module, batches: Iterable, device: torch.device | str | None = None, max_batches: int | None = None
) -> OODFeatures:
    """``z``, ``σ``, logits and labels of a timm classifier over ``batches``: :func:`extract_model_features`."""
    return extract_model_features(model, batches, device=device, max_batches=max_batches)
