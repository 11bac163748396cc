"""Hugging Face Hub integration: ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` and model cards.

A saved model (``RetrievalModel``) or OOD detector (``ood.Detector``) is a folder or Hub repo with ``config.json``
(one layout: ``architecture``, ``library_name``, ``library_version``, ``task``, ``model_args`` = the constructor
kwargs, ``training`` metadata, plus object-specific keys), ``model.safetensors`` (pickles are never loaded), a
generated ``README.md`` model card and optionally ``metrics.json`` and ``plots/*.png``.

Layout of this package:

* :mod:`.serialization` — the file format: config layout, atomic folder writes, reading and validating tensors;
* :mod:`.transport` — resolving a folder or a Hub repo id (cache, ``revision``, ``cache_dir``, ``local_files_only``,
  ``token``) and uploading a folder;
* :mod:`.card` — the model card builders;
* :mod:`.mixin` — :class:`HubMixin`, the one ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``
  implementation that ``RetrievalModel`` and every ``Detector`` inherit.

The functions below are the same operations for a model given as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from .card import generate_model_card
from .mixin import HubMixin, build_config, push_folder, save_folder
from .serialization import CONFIG_NAME, read_config
from .transport import resolve_file
from .transport import upload_folder as push_folder_to_hub

__all__ = [
    "HubMixin",
    "from_pretrained",
    "generate_model_card",
    "load_config",
    "push_folder_to_hub",
    "push_to_hub",
    "save_pretrained",
]


def save_pretrained(model: nn.Module, save_directory: str | Path, **kwargs: Any) -> Path:
    """Write ``config.json``, ``model.safetensors`` and (by default) ``README.md`` for ``model``.

    Args:
        model: A :class:`HubMixin` object (``RetrievalModel``, a detector), or any ``nn.Module`` with ``get_config()``.
        save_directory: Output folder.
        **kwargs: ``metadata``, ``metrics``, ``hub_config``, ``plots``, ``model_card``, ``repo_id``
            (see :meth:`HubMixin.save_pretrained`).
    """
    if isinstance(model, HubMixin):
        return model.save_pretrained(save_directory, **kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    return _save_plain_module(model, save_directory, **kwargs)


def _save_plain_module(
    model: nn.Module,
    save_directory: str | Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    model_card: bool = True,
    **kwargs: Any,
) -> Path:
    config = build_config(model, metadata)
    return save_folder(save_directory, config, model, card=generate_model_card if model_card else None, **kwargs)


def from_pretrained(
    pretrained_model_name_or_path: str | Path,
    *,
    model_class: type | None = None,
    **kwargs: Any,
) -> Any:
    """Restore a model saved by :func:`save_pretrained` from a folder or a Hub repo id.

    Args:
        pretrained_model_name_or_path: Folder path or ``"org/name"``.
        model_class: A :class:`HubMixin` subclass (e.g. ``pml_suprank.models.RetrievalModel``) that must match the
            saved ``architecture``; default: the loaded ``HubMixin`` subclass of that name.
        **kwargs: ``map_location``, ``strict``, ``trust_config``, ``revision``, ``cache_dir``,
            ``local_files_only``, ``token``, ``force_download`` and constructor overrides (see
            :meth:`HubMixin.from_pretrained`).
    """
    cls = HubMixin if model_class is None else model_class
    if not (isinstance(cls, type) and issubclass(cls, HubMixin)):
        raise TypeError(f"model_class must be a HubMixin subclass (e.g. RetrievalModel); got {model_class!r}")
    return cls.from_pretrained(pretrained_model_name_or_path, **kwargs)


def push_to_hub(model: nn.Module, repo_id: str, **kwargs: Any) -> Any:
    """Save ``model`` (see :func:`save_pretrained`) and upload the folder to the Hub repo ``repo_id``.

    Keyword arguments as :meth:`HubMixin.push_to_hub`; returns the ``CommitInfo`` of ``HfApi.upload_folder``.
    """
    if isinstance(model, HubMixin):
        return model.push_to_hub(repo_id, **kwargs)
    push_keys = ("save_directory", "commit_message", "private", "token", "revision", "create_pr")
    push_kwargs = {k: kwargs.pop(k) for k in push_keys if k in kwargs}
    return push_folder(lambda folder: save_pretrained(model, folder, repo_id=repo_id, **kwargs), repo_id, **push_kwargs)


def load_config(
    pretrained_model_name_or_path: str | Path,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
    force_download: bool = False,
) -> dict[str, Any]:
    """Read and validate ``config.json`` from a folder or a Hub repo id (through the local cache when offline)."""
    options = dict(revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token)
    path = resolve_file(pretrained_model_name_or_path, CONFIG_NAME, force_download=force_download, **options)
    return read_config(path)
