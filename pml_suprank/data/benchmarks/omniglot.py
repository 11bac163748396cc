"""Omniglot (Lake, Salakhutdinov & Tenenbaum, Science 2015) background archives, character → alphabet: the
``images_background*.zip`` archives (or extracted folders) under ``root``, merged by (alphabet, character). Open set:
in every alphabet the first half of the sorted characters (rounded up) train, the others test.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

from ..paths import PathConfiner
from ._native import FileImageDataset, NativeImageDataset, ZipImageDataset, encode_split

__all__ = ["OMNIGLOT_LABEL_NAMES", "OMNIGLOT_SPLITS", "load_omniglot"]

OMNIGLOT_LABEL_NAMES = ("character", "alphabet")
OMNIGLOT_SPLITS = ("train", "test")
_SUFFIXES = (".png", ".jpg", ".jpeg")


def _entries(root: Path) -> tuple[list[tuple[str, str, str, str, str]], bool]:
    """``(source, alphabet, character, file name, where)`` per image of every archive under ``root``, and whether
    the sources are zip members (``"<zip>::<member>"``) rather than files."""
    zips = sorted(p for p in root.glob("images_background*.zip") if p.is_file())
    folders = sorted(p for p in root.glob("images_background*") if p.is_dir())
    if not zips and not folders:
        raise ValueError(f"{root}: missing images_background*.zip archives (or the folders they extract to)")
    if zips:
        members = [(archive, m) for archive in zips for m in _zip_members(archive) if not m.endswith("/")]
        return [_entry(f"{a}::{m}", m, a, f"{a}, entry {m}") for a, m in members], True
    out, confine = [], PathConfiner(root)
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            out.append(_entry(confine(rel, where=str(path)), rel, folder, str(path)))
    return out, False


def _zip_members(archive: Path) -> list[str]:
    """The member names of a zip archive, or a ``ValueError`` naming the archive (truncated, not a zip)."""
    try:
        with zipfile.ZipFile(archive) as z:
            return z.namelist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as err:
        raise ValueError(
            f"{archive}: not a readable zip archive (truncated or corrupt? {type(err).__name__}: {err})"
        ) from None


def _entry(source: str, rel: str, container: Path, where: str) -> tuple[str, str, str, str, str]:
    parts = rel.split("/")
    if len(parts) != 4 or not parts[3].lower().endswith(_SUFFIXES):
        raise ValueError(f"{where}: expected <archive>/<alphabet>/<character>/<image>.png inside {container}")
    return source, parts[1], parts[2], parts[3], where


def load_omniglot(root: str | Path, split: str, transform: Callable | None = None) -> NativeImageDataset:
    """Omniglot open-set ``split`` (``"train"`` / ``"test"``) of the archives (or extracted folders) in ``root``:
    labels ``(N, 2)`` = (character, alphabet). ``ValueError``: no archive, or an entry outside the
    ``<archive>/<alphabet>/<character>/<image>`` layout."""
    root = Path(root)
    entries, zipped = _entries(root)
    unique: dict[tuple[str, str, str], tuple[str, str, str, str, str]] = {}
    for entry in entries:
        unique.setdefault(entry[1:4], entry)
    characters: dict[str, set[str]] = {}
    for _, alphabet, character, _, _ in unique.values():
        characters.setdefault(alphabet, set()).add(character)
    train = {(a, c) for a, cs in characters.items() for c in sorted(cs)[: (len(cs) + 1) // 2]}
    records: dict[str, list] = {"train": [], "test": []}
    for key in sorted(unique):
        source, alphabet, character, _, where = unique[key]
        side = "train" if (alphabet, character) in train else "test"
        records[side].append((source, ((alphabet, character), alphabet), where))
    part, labels = encode_split(records, split, OMNIGLOT_LABEL_NAMES)
    kwargs = {"transform": transform, "benchmark": "omniglot", "split": split}
    if zipped:
        members = [tuple(r[0].split("::", 1)) for r in part]
        return ZipImageDataset(labels, OMNIGLOT_LABEL_NAMES, members, **kwargs)
    return FileImageDataset(labels, OMNIGLOT_LABEL_NAMES, [r[0] for r in part], root, **kwargs)
