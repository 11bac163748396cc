"""Shared machinery of the benchmark readers: errors naming file and line, and the lazily decoded image datasets
(files, zip members, pixel arrays). Every reader turns its archive into *records* ``(image source, raw label keys fine
→ coarse, "file, line N")``; :func:`encode_levels` maps them to contiguous ids and refuses a child with two parents.
"""

from __future__ import annotations

import csv
import io
import os
import zipfile
import zlib
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..retrieval_dataset import RetrievalDatasetBase, decode_image

__all__ = [
    "ArrayImageDataset",
    "FileImageDataset",
    "NativeImageDataset",
    "ZipImageDataset",
    "encode_levels",
    "encode_split",
    "file_split",
    "layout_error",
    "parse_int",
    "read_table",
    "read_text",
    "require_file",
]


def layout_error(file: str | Path, line: int | str | None, message: str) -> ValueError:
    """A ``ValueError`` for a malformed archive: ``"<file>, line <line>: <message>"`` (line may name an entry)."""
    where = str(file) if line is None else f"{file}, line {line}" if isinstance(line, int) else f"{file}, {line}"
    return ValueError(f"{where}: {message}")


def require_file(path: Path, what: str) -> Path:
    """``path``, or a ``ValueError`` naming the missing file and what it should hold."""
    if not path.is_file():
        raise ValueError(f"{path}: missing file ({what})")
    return path


def read_text(path: Path) -> str:
    """The content of a UTF-8 text file, or a ``ValueError`` naming the file and the line of the first bad byte."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise layout_error(
            path, line, f"not UTF-8 text (byte {err.start}: {err.reason}); expected a UTF-8 list file"
        ) from None


def read_table(
    path: Path, columns: Sequence[str], *, delimiter: str | None = ",", exact: bool = True
) -> list[tuple[int, dict[str, str]]]:
    """``[(line number, {column: cell})]`` of the non-empty data lines of a UTF-8 csv file (``delimiter=None``: split
    at whitespace) whose header is exactly ``columns`` (spaces included; ``exact=False``: includes them).
    ``ValueError``: a missing file, another header, a line with another number of cells."""
    text = read_text(require_file(path, f"columns {list(columns)}"))
    if delimiter is None:
        lines = [(number, line.split()) for number, line in enumerate(text.split("\n"), start=1)]
    else:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
        try:
            lines = [(reader.line_num, cells) for cells in reader]
        except csv.Error as err:  # e.g. a field over csv.field_size_limit()
            raise layout_error(path, reader.line_num, f"not a readable csv line ({err})") from None
    header = lines[0][1] if lines else []
    if (header != list(columns)) if exact else not set(columns) <= set(header):
        expected = f"the columns {list(columns)}" if exact else f"columns including {list(columns)}"
        raise layout_error(path, 1, f"expected {expected}; got {header}")
    rows = []
    for number, cells in lines[1:]:
        if any(c.strip() for c in cells):
            if len(cells) != len(header):
                raise layout_error(path, number, f"expected {len(header)} cells {header}; got {cells}")
            rows.append((number, dict(zip(header, cells))))
    return rows


def parse_int(value: str, path: Path, line: int, column: str) -> int:
    """``int(value)`` or a ``ValueError`` naming file, line and column."""
    try:
        return int(value.strip())
    except ValueError:
        raise layout_error(path, line, f"column {column!r} must be an integer; got {value!r}") from None


def encode_levels(keys: Sequence[Sequence[Hashable]], wheres: Sequence[str], level_names: Sequence[str]) -> Tensor:
    """``(N, L)`` contiguous ids (the rank among the sorted distinct keys of each level) of ``keys``, L raw keys per
    image, fine → coarse; ``ValueError`` naming both rows' ``wheres`` when a key has two parents (not a tree)."""
    num_levels = len(level_names)
    if any(len(k) != num_levels for k in keys):
        raise ValueError(f"every row must give {num_levels} keys {list(level_names)}")
    for c in range(num_levels - 1):
        parent: dict[Hashable, tuple[Hashable, str]] = {}
        for row, where in zip(keys, wheres):
            seen = parent.setdefault(row[c], (row[c + 1], where))
            if seen[0] != row[c + 1]:
                raise ValueError(
                    f"{where}: {level_names[c]} {row[c]!r} has {level_names[c + 1]} {row[c + 1]!r} but "
                    f"{seen[0]!r} at {seen[1]}; a class must belong to exactly one {level_names[c + 1]} (a tree)"
                )
    out = np.zeros((len(keys), num_levels), dtype=np.int64)
    for c in range(num_levels):
        ids = {k: i for i, k in enumerate(sorted({row[c] for row in keys}))}
        out[:, c] = [ids[row[c]] for row in keys]
    return torch.from_numpy(out)


Record = tuple[Any, tuple[Hashable, ...], str]  # (image source, raw keys fine → coarse, "file, line N")


def encode_split(
    records: dict[str, list[Record]], split: str, level_names: Sequence[str]
) -> tuple[list[Record], Tensor]:
    """The records of ``split`` and their ``(N, L)`` labels, ids encoded over the records of *all* splits."""
    everything = [r for part in records.values() for r in part]
    labels = encode_levels([r[1] for r in everything], [r[2] for r in everything], level_names)
    start = 0
    for name, part in records.items():
        if name == split:
            return part, labels[start : start + len(part)]
        start += len(part)
    raise ValueError(f"split must be one of {sorted(records)}; got {split!r}")


def file_split(
    records: dict[str, list[Record]],
    split: str,
    level_names: Sequence[str],
    root: Path,
    *,
    benchmark: str,
    transform: Callable | None,
    cls: type[FileImageDataset] | None = None,
    **kwargs: Any,
) -> FileImageDataset:
    """A ``cls`` (:class:`FileImageDataset`) of ``split`` from records whose sources are image paths; ``ValueError``
    naming the list file and line of an image that does not exist."""
    part, labels = encode_split(records, split, level_names)
    if not part:
        raise ValueError(f"{root}: split {split!r} of {benchmark} lists no image")
    for path, _, where in part:
        if not os.path.isfile(path):
            raise ValueError(f"{where}: image {path} does not exist")
    paths = [r[0] for r in part]
    return (cls or FileImageDataset)(
        labels, level_names, paths, root, transform=transform, benchmark=benchmark, split=split, **kwargs
    )


class NativeImageDataset(RetrievalDatasetBase):
    """A benchmark split read from its archive: ``labels`` ``(N, L)``, ``names`` a file name per item; subclasses
    implement :meth:`image_record` (the encoded file) or :meth:`get_image` (then encoded as PNG)."""

    def __init__(
        self,
        labels: Tensor,
        label_names: Sequence[str],
        names: Sequence[str],
        transform: Callable | None = None,
        *,
        benchmark: str = "",
        split: str = "",
    ) -> None:
        super().__init__(labels, label_names, transform)
        if len(names) != len(self):
            raise ValueError(f"names must give one file name per item ({len(self)}); got {len(names)}")
        self.names = list(names)
        self._sources = self.names  # what error messages name per item (subclasses: the file path or zip member)
        self.benchmark = benchmark
        self.split = split

    def image_record(self, index: int) -> dict[str, Any]:
        """``{"bytes": encoded image, "path": file name}`` of item ``index`` (the ``datasets.Image`` storage)."""
        index = self._check_index(index)
        buffer = io.BytesIO()
        self.get_image(index).save(buffer, format="PNG")
        return {"bytes": buffer.getvalue(), "path": self.names[index]}

    def get_image(self, index: int) -> Any:
        """The untransformed PIL RGB image of item ``index`` (``ValueError`` naming the file)."""
        index = self._check_index(index)
        record = self.image_record(index)
        return decode_image(io.BytesIO(record["bytes"]), self.describe_item(index))

    def describe_item(self, index: int) -> str:
        """``"<benchmark> <split> item <i> (<source>)"``, for error messages."""
        return f"{self.benchmark} {self.split} item {index} ({self._sources[index]})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(benchmark={self.benchmark!r}, split={self.split!r}, num_items={len(self)}, "
            f"label_names={self.label_names})"
        )


class FileImageDataset(NativeImageDataset):
    """Images stored as files; ``paths[i]`` is the absolute path of item ``i``."""

    def __init__(self, labels: Tensor, label_names: Sequence[str], paths: Sequence[str], root: Path, **kwargs: Any):
        self.paths = [str(p) for p in paths]
        names = [os.path.relpath(p, root) for p in self.paths]
        super().__init__(labels, label_names, names, **kwargs)
        self._sources = self.paths

    def image_record(self, index: int) -> dict[str, Any]:
        """The file's bytes and its path relative to the benchmark root."""
        index = self._check_index(index)
        try:
            with open(self.paths[index], "rb") as f:
                return {"bytes": f.read(), "path": self.names[index]}
        except OSError as err:
            raise ValueError(f"{self.describe_item(index)}: cannot read the image file ({err})") from None


class ZipImageDataset(NativeImageDataset):
    """Images stored as zip members ``members[i] = (zip path, member name)``, opened per process on first use."""

    def __init__(
        self, labels: Tensor, label_names: Sequence[str], members: Sequence[tuple[str, str]], **kwargs: Any
    ) -> None:
        self.members = [(str(z), m) for z, m in members]
        super().__init__(labels, label_names, [m for _, m in self.members], **kwargs)
        self._sources = [f"{z}::{m}" for z, m in self.members]
        self._handles: dict[tuple[int, str], zipfile.ZipFile] = {}

    def image_record(self, index: int) -> dict[str, Any]:
        """The member's bytes and its name inside the archive."""
        archive, member = self.members[self._check_index(index)]
        key = (os.getpid(), archive)
        try:
            if key not in self._handles:
                self._handles[key] = zipfile.ZipFile(archive)
            data = self._handles[key].read(member)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, KeyError, zlib.error) as err:
            raise ValueError(
                f"{archive}, entry {member}: cannot read the zip member ({type(err).__name__}: {err})"
            ) from None
        return {"bytes": data, "path": member}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


class ArrayImageDataset(NativeImageDataset):
    """Images held as an ``(N, H, W, 3)`` uint8 array (e.g. the CIFAR pickles); records are PNG-encoded."""

    def __init__(self, labels: Tensor, label_names: Sequence[str], pixels: np.ndarray, names: Sequence[str], **kwargs):
        if pixels.ndim != 4 or pixels.shape[-1] != 3 or pixels.dtype != np.uint8:
            raise ValueError(f"pixels must be an (N, H, W, 3) uint8 array; got {pixels.dtype} {pixels.shape}")
        self.pixels = pixels
        super().__init__(labels, label_names, names, **kwargs)

    def get_image(self, index: int) -> Any:
        """The untransformed PIL RGB image of item ``index``."""
        from PIL import Image

        return Image.fromarray(self.pixels[self._check_index(index)])
