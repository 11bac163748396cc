"""Index a dataset with a model and search it with new images (``RetrievalModel.build_index`` / ``.search``).

Queries (:func:`embed_inputs`): an image batch ``(B, 3, H, W)``, one image ``(3, H, W)``, a PIL image, an image file
path, or a list of these (PIL images and paths go through the model's evaluation transform).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._eval_mode import eval_mode
from ..data.embedding_cache import cached_embeddings
from ..metrics import compute_embeddings
from .index import RetrievalIndex

__all__ = ["build_index", "embed_inputs", "search_images"]


def build_index(
    model: nn.Module,
    data: Any,
    *,
    batch_size: int = 64,
    progress: bool = False,
    embedding_cache: str | Path | None = None,
    **index_kwargs: Any,
) -> RetrievalIndex:
    """A :class:`RetrievalIndex` whose row ``i`` is the L2-normalised embedding by ``model`` (eval mode, no gradient)
    of the ``i``-th item of ``data``, with its labels.

    Args:
        model: maps ``(B, 3, H, W)`` images to ``(B, D)`` embeddings.
        data: a dataset of the package contract (``ds[i] = {"image", "labels", "index"}``, its evaluation transform
            set; batches of ``batch_size``) or an iterable of ``(images, labels, ...)`` / dict batches, in order.
        **index_kwargs: passed to :class:`RetrievalIndex` (``ids``, ``backend``, ``device``, ``nlist``, ...).
        progress: a tqdm bar over the batches.
        embedding_cache: a folder where the gallery's embeddings for this model, data and transform are read from,
            or written to (:func:`pml_suprank.data.cached_embeddings`; items must carry ``"index"``).
    """
    if isinstance(data, torch.utils.data.Dataset) and not isinstance(data, torch.utils.data.IterableDataset):
        data = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False)
    if embedding_cache is not None:
        emb, labels, _ = cached_embeddings(model, data, embedding_cache, normalize=True, progress=progress,
                                           description="gallery")  # fmt: skip
    else:
        contract = hasattr(getattr(data, "dataset", None), "labels") and hasattr(data.dataset, "get_image")
        keys = {"input_key": "image", "label_key": "labels"} if contract else {}
        emb, labels = compute_embeddings(model, data, normalize=True, progress=progress, description="gallery", **keys)
    return RetrievalIndex(emb, labels=labels, **index_kwargs)


def _as_image_tensors(inputs: Any, transform: Any) -> Tensor:
    if isinstance(inputs, Tensor):
        if inputs.dim() == 3:
            inputs = inputs.unsqueeze(0)
        if inputs.dim() != 4 or not inputs.is_floating_point():
            raise ValueError(
                f"images must be a float tensor (B, 3, H, W) or (3, H, W); got {inputs.dtype} {tuple(inputs.shape)}"
            )
        return inputs
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if not items:
        raise ValueError("images must not be empty")
    tensors = []
    for item in items:
        if isinstance(item, (str, Path)):
            from PIL import Image

            with Image.open(item) as img:
                item = img.convert("RGB")
        if isinstance(item, Tensor):
            tensors.append(_as_image_tensors(item, transform)[0])
        elif hasattr(item, "convert"):  # a PIL image
            tensors.append(transform(item.convert("RGB")))
        else:
            raise TypeError(f"images must be tensors, PIL images or image paths; got {type(item).__name__}")
    return torch.stack(tensors)


def embed_inputs(model: nn.Module, images: Any, *, batch_size: int = 64, transform: Any = None) -> Tensor:
    """L2-normalised ``(B, D)`` embeddings of ``images`` (see the module docstring for the accepted inputs)."""
    if transform is None and not isinstance(images, Tensor):
        from ..data import build_transforms

        transform = build_transforms(model.data_config, train=False)
    x = _as_image_tensors(images, transform)
    device = next(iter(model.parameters()), torch.empty(0)).device
    with eval_mode(model), torch.no_grad():
        out = [model(x[s : s + batch_size].to(device)) for s in range(0, x.shape[0], batch_size)]
    return torch.nn.functional.normalize(torch.cat(out).float(), dim=-1)


def search_images(
    model: nn.Module, index: RetrievalIndex, images: Any, k: int, *, batch_size: int = 64
) -> tuple[Tensor, Tensor]:
    """Embed ``images`` with ``model`` and return ``index.search(embeddings, k)``: ``(scores (B, k),
    indices (B, k))``."""
    if not isinstance(index, RetrievalIndex):
        raise TypeError(
            f"index must be a RetrievalIndex (build one with model.build_index(dataset)); got {type(index).__name__}"
        )
    return index.search(embed_inputs(model, images, batch_size=batch_size), k)
