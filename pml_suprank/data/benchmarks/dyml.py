"""DyML-Vehicle / -Animal / -Product (Sun et al., "Dynamic Metric Learning", CVPR 2021) from the release folders
(csv headers keep the release's leading spaces and ``0.jpg`` typos): ``train/label.csv`` + ``train/imgs/`` (3
levels), ``bmk_<g>/{query,gallery}.csv`` + ``bmk_<g>/<query|gallery>/`` (one level per granularity ``g``) and, for
DyML-Product, ``mini-bmk_all_in_one/label.csv`` (split ``test``). Ids are contiguous per shared label space.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..paths import PathConfiner
from ._native import FileImageDataset, Record, file_split, parse_int, read_table

__all__ = ["DYML_GRANULARITIES", "DYML_LABEL_NAMES", "dyml_label_names", "dyml_splits", "load_dyml"]

DYML_LABEL_NAMES = DYML_GRANULARITIES = ("fine", "middle", "coarse")
_TRAIN_COLUMNS = ("fname", " fine_id0.jpg", " middle_id", " coarse_id")
_BMK_COLUMNS = ("fname", " labels0.jpg")


def dyml_splits(product: bool = False) -> tuple[str, ...]:
    """The split names: ``train``, ``query_<g>`` / ``gallery_<g>`` per granularity, and ``test`` for DyML-Product."""
    splits = ["train"] + [f"{kind}_{g}" for g in DYML_GRANULARITIES for kind in ("query", "gallery")]
    return tuple(splits + (["test"] if product else []))


def dyml_label_names(split: str) -> tuple[str, ...]:
    """Label columns of a DyML split: the 3 levels for ``train`` / ``test``, the granularity for benchmark sets."""
    return DYML_LABEL_NAMES if split in ("train", "test") else (split.split("_", 1)[1],)


def _records(root: Path, csv: str, images: str, columns: tuple[str, ...]) -> list[Record]:
    """The records of the csv file ``root/csv`` (integer labels in ``columns[1:]``), images under ``root/images``."""
    path = root / csv
    out, confine = [], PathConfiner(root)
    for line, cells in read_table(path, columns):
        keys = tuple(parse_int(cells[c], path, line, c) for c in columns[1:])
        where = f"{path}, line {line}"
        out.append((confine(images, cells["fname"].strip(), where=where), keys, where))
    return out


def load_dyml(
    root: str | Path, split: str, *, name: str = "dyml", transform: Callable | None = None
) -> FileImageDataset:
    """A split of the DyML release folder ``root`` of benchmark ``name``: ``train`` (3 levels), ``query_<g>`` /
    ``gallery_<g>`` (1 level) or ``test`` (DyML-Product). ``ValueError``: a missing or malformed csv (wrong header,
    non-integer label), a missing image, a class with two parents."""
    root = Path(root)
    if split in ("train", "test"):
        sub = "train" if split == "train" else "mini-bmk_all_in_one"
        records = {split: _records(root, f"{sub}/label.csv", f"{sub}/imgs", _TRAIN_COLUMNS)}
    else:
        g = split.split("_", 1)[1]
        records = {
            f"{k}_{g}": _records(root, f"bmk_{g}/{k}.csv", f"bmk_{g}/{k}", _BMK_COLUMNS) for k in ("query", "gallery")
        }
    return file_split(records, split, dyml_label_names(split), root, benchmark=name, transform=transform)
