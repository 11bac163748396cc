"""CUB-200-2011 (Wah et al., 2011) from its release ``CUB_200_2011/images/<NNN.Name>/*.jpg``, one level (species),
with the open-set protocol of Oh Song et al. (CVPR 2016): the first half of the sorted classes train, the rest test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..paths import PathConfiner
from ._native import FileImageDataset, Record, file_split

__all__ = ["CUB_LABEL_NAMES", "CUB_SPLITS", "load_cub"]

CUB_LABEL_NAMES = ("label",)
CUB_SPLITS = ("train", "test")
_SUFFIXES = {".jpg", ".jpeg", ".png"}


def _images_folder(root: Path) -> Path:
    for candidate in (root / "CUB_200_2011" / "images", root / "images"):
        if candidate.is_dir():
            return candidate
    raise ValueError(f"{root}: missing folder CUB_200_2011/images (or images/) with one sub-folder per class")


def load_cub(root: str | Path, split: str, transform: Callable | None = None) -> FileImageDataset:
    """CUB-200-2011 ``split`` (``"train"``: first half of the sorted classes, ``"test"``: second half) of ``root``
    (holding ``CUB_200_2011/``, or that folder): labels ``(N, 1)``, the rank of the class folder (0–99 train, 100–199
    test). ``ValueError``: no images folder, fewer than two classes, an empty class folder."""
    root = Path(root)
    images = _images_folder(root)
    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise ValueError(f"{images}: expected one folder per class (200 in the release); got {len(classes)}")
    n_train = (len(classes) + 1) // 2
    records: dict[str, list[Record]] = {"train": [], "test": []}
    confine = PathConfiner(images)
    for rank, name in enumerate(classes):
        files = sorted(p for p in (images / name).iterdir() if p.suffix.lower() in _SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"{images / name}: class folder without images")
        side = "train" if rank < n_train else "test"
        records[side].extend((confine(p.relative_to(images), where=str(p)), (name,), str(p)) for p in files)
    return file_split(records, split, CUB_LABEL_NAMES, images, benchmark="cub", transform=transform)
