"""Hugging Face Hub integration: ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` and model cards.

A saved model (``RetrievalModel``) or OOD detector (``ood.Detector``) is a folder or Hub repo with ``config.json``,
``model.safetensors`` (pickles are never loaded), a generated ``README.md`` model card and optionally
``metrics.json`` and ``plots/*.png`` (:mod:`.serialization`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .card import generate_model_card
from .mixin import HubMixin
from .serialization import CONFIG_NAME, read_config
from .transport import resolve_folder
from .transport import upload_folder as push_folder_to_hub

__all__ = ["HubMixin", "from_pretrained", "generate_model_card", "load_config", "push_folder_to_hub"]


def from_pretrained(
    pretrained_model_name_or_path: str | Path, *, model_class: type | None = None, **kwargs: Any
) -> Any:
    """Restore any object saved by ``save_pretrained`` from a folder or a Hub repo id: ``model_class`` (a
    :class:`HubMixin` subclass that must match the saved ``architecture``), by default the loaded ``HubMixin``
    subclass of that name. ``kwargs`` as :meth:`HubMixin.from_pretrained`."""
    cls = HubMixin if model_class is None else model_class
    if not (isinstance(cls, type) and issubclass(cls, HubMixin)):
        raise TypeError(f"model_class must be a HubMixin subclass (e.g. RetrievalModel); got {model_class!r}")
    return cls.from_pretrained(pretrained_model_name_or_path, **kwargs)


def load_config(pretrained_model_name_or_path: str | Path, **hub_options: Any) -> dict[str, Any]:
    """Read and validate ``config.json`` from a folder or a Hub repo id (through the local cache when offline);
    ``hub_options``: ``revision``, ``cache_dir``, ``local_files_only``, ``token``, ``force_download``."""
    return read_config(resolve_folder(pretrained_model_name_or_path, (CONFIG_NAME,), **hub_options) / CONFIG_NAME)
