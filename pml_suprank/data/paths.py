"""Paths read from a dataset's own files (list files, ``metadata.csv`` ...) kept inside the dataset's folder (no
absolute path, ``..`` or symbolic link out): :class:`PathConfiner` is the one check every loader applies."""

from __future__ import annotations

import os
from pathlib import Path, PurePath

__all__ = ["PathConfiner", "is_inside"]


def is_inside(root: str | Path, path: str | Path) -> bool:
    """Whether ``path``, symbolic links resolved, lies inside ``root`` (also resolved)."""
    return _under(os.path.realpath(path), os.path.realpath(root))


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def _named_inside(root: str | Path, path: str) -> bool:
    """Whether the absolute ``path`` as written (links not followed) names a file below ``root`` (given or real)."""
    name = os.path.normpath(path)
    return any(_under(name, base) for base in {os.path.normpath(os.path.abspath(root)), os.path.realpath(root)})


class PathConfiner:
    """Paths read from the files of the dataset folder ``root``, checked to stay inside it (each folder resolved once
    per instance)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._real_root = os.path.realpath(root)
        self._real_dirs: dict[str, str] = {}

    def __call__(self, *parts: str | Path, where: str, allow_absolute: bool = False) -> str:
        """``root / parts[0] / ...`` (a string, not resolved) once checked to stay inside ``root``; ``where`` names the
        file and line the parts were read at; ``allow_absolute`` accepts an absolute first part inside ``root``.
        ``ValueError`` (``"<where>: ..."``): an absolute part, a ``..`` component, a symbolic link leading outside."""
        joined = self.root
        for i, part in enumerate(parts):
            text = os.fspath(part)
            pure = PurePath(text)
            if pure.is_absolute() or (os.sep != "/" and text.startswith("/")):
                if not (allow_absolute and i == 0 and _named_inside(self.root, text)):
                    raise ValueError(
                        f"{where}: path {text!r} is absolute; paths listed by a dataset must be relative to its "
                        f"folder {self.root}"
                    )
            if ".." in pure.parts or ".." in text.replace("\\", "/").split("/"):
                raise ValueError(f"{where}: path {text!r} has a '..' component; it must stay inside {self.root}")
            joined = joined / pure
        real = self._resolve(str(joined))
        if not _under(real, self._real_root):
            raise ValueError(
                f"{where}: path {os.fspath(joined)!r} leads outside {self.root} (a symbolic link to {real!r}); "
                "dataset files must lie inside the dataset folder"
            )
        return str(joined)

    def _resolve(self, path: str) -> str:
        """``os.path.realpath(path)``, its folder resolved once per instance."""
        folder, name = os.path.split(path)
        real_folder = self._real_dirs.get(folder)
        if real_folder is None:
            real_folder = self._real_dirs[folder] = os.path.realpath(folder)
        candidate = os.path.join(real_folder, name)
        return os.path.realpath(candidate) if os.path.islink(candidate) else candidate
