"""Unlabelled images read from disk (every image file under a folder, or one file): :class:`ImageFiles`, the
queries of ``search``, the images of ``ood_score`` and ``fit_heat``'s OOD folder, the demo's gallery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..data.folders import IMAGE_SUFFIXES, has_dataset_files
from ..data.retrieval_dataset import decode_image

__all__ = ["ImageFiles", "is_flat_image_folder"]


def _image_paths(root: Path) -> list[Path]:
    """``root`` when it is an image file, else every image file below it (sorted, hidden files and folders skipped)."""
    if root.is_file():
        return [root] if root.suffix.lower() in IMAGE_SUFFIXES else []
    visible = (
        p for p in sorted(root.rglob("*")) if not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    return [p for p in visible if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]


def is_flat_image_folder(root: str | Path) -> bool:
    """``root`` is a folder holding image files directly, no sub-folder of images and no dataset source files."""
    root = Path(root)
    if not root.is_dir() or has_dataset_files(root):
        return False
    paths = _image_paths(root)
    return bool(paths) and all(p.parent == root for p in paths)


class ImageFiles(torch.utils.data.Dataset):
    """Every image file under the folder ``root`` (or the image file ``root``) as items of
    :func:`pml_suprank.data.collate`: ``transform`` applied to each RGB PIL image, label ``-1``; ``names[i]`` is the
    file relative to the folder (POSIX). Every file is checked once here
    (:func:`pml_suprank.data.image_check.check_image_files`); ``what`` names ``root`` in the ``ValueError`` (no such
    path, no image file, unreadable images)."""

    def __init__(self, root: str | Path, transform: Any = None, *, what: str | None = None) -> None:
        from pml_suprank.data.image_check import check_image_files

        self.root = Path(root)
        what = what or str(root)
        if not self.root.exists():
            raise ValueError(f"{what}: no such file or folder")
        self.paths = _image_paths(self.root)
        if not self.paths:
            kind = "is not an image file" if self.root.is_file() else "holds no image file"
            raise ValueError(f"{what} {kind} ({', '.join(IMAGE_SUFFIXES)})")
        check_image_files(self.paths, what=what)
        base = self.root.parent if self.root.is_file() else self.root
        self.names = [p.relative_to(base).as_posix() for p in self.paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def item_path(self, i: int) -> str:
        return str(self.paths[i])

    def get_image(self, i: int) -> Any:
        return decode_image(self.paths[i], self.item_path(i))

    def __getitem__(self, i: int) -> dict[str, Any]:
        image = self.get_image(i)
        return {"image": image if self.transform is None else self.transform(image), "labels": torch.tensor([-1]),
                "index": i}  # fmt: skip
