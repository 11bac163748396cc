"""What a saved or pushed model folder may say about the machine it was trained on: names, never local paths.

A model folder travels (Hub repo, a colleague's disk): ``config.json``, ``data_spec.json``, the card and the OOD
guard's files name a local dataset by its folder name (``photos``, not ``/home/me/data/photos`` or
``../data/photos``) and leave out the run's own folders (``output_dir``, ``logging_dir``). Hub ids, built-in set names
and benchmark names are names already and stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["LOCAL_PATH_KEYS", "public_name", "without_local_paths"]

#: options holding the run's own folders, left out of what a model folder records
LOCAL_PATH_KEYS = ("output_dir", "logging_dir", "cache_dir")


def public_name(source: Any) -> Any:
    """``source`` as a model folder records it: the name of a local file or folder, else unchanged."""
    if not isinstance(source, (str, Path)) or not str(source):
        return source
    path = Path(source)
    if path.exists() or path.is_absolute() or ".." in path.parts or str(source).startswith(("./", "~")):
        return path.expanduser().resolve().name or str(source)
    return source


def without_local_paths(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``options`` without :data:`LOCAL_PATH_KEYS`, with ``dataset`` as its :func:`public_name`."""
    out = {k: v for k, v in options.items() if k not in LOCAL_PATH_KEYS}
    if "dataset" in out:
        out["dataset"] = public_name(out["dataset"])
    return out
