"""DyML-Vehicle / DyML-Animal / DyML-Product (Sun et al., "Dynamic Metric Learning", CVPR 2021) from the release
folders (comma-separated csv files whose headers keep the release's leading spaces and ``0.jpg`` typos):

* ``train/label.csv`` (``fname, fine_id0.jpg, middle_id, coarse_id``), images in ``train/imgs/``: 3 levels;
* ``bmk_<fine|middle|coarse>/{query,gallery}.csv`` (``fname, labels0.jpg``), images in
  ``bmk_<g>/<query|gallery>/``: the per-granularity test sets, one level each;
* DyML-Product also ships ``mini-bmk_all_in_one/label.csv`` (split ``test``).

Ids are contiguous per group of files sharing a label space (``train``; ``query_<g>`` with ``gallery_<g>``; ``test``).
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


def _three_levels(root: Path, sub: str) -> list[Record]:
    path = root / sub / "label.csv"
    out, confine = [], PathConfiner(root)
    for line, cells in read_table(path, _TRAIN_COLUMNS, delimiter=","):
        keys = tuple(parse_int(cells[i], path, line, _TRAIN_COLUMNS[i]) for i in (1, 2, 3))
        where = f"{path}, line {line}"
        out.append((confine(sub, "imgs", cells[0].strip(), where=where), keys, where))
    return out


def _benchmark_set(root: Path, kind: str, granularity: str) -> list[Record]:
    folder = root / f"bmk_{granularity}"
    path = folder / f"{kind}.csv"
    out, confine = [], PathConfiner(root)
    for line, cells in read_table(path, _BMK_COLUMNS, delimiter=","):
        label = parse_int(cells[1], path, line, _BMK_COLUMNS[1])
        where = f"{path}, line {line}"
        out.append((confine(folder.name, kind, cells[0].strip(), where=where), (label,), where))
    return out


def load_dyml(
    root: str | Path, split: str, *, name: str = "dyml", transform: Callable | None = None
) -> FileImageDataset:
    """A split of the DyML release folder ``root`` of benchmark ``name``: ``train`` (3 levels), ``query_<g>`` /
    ``gallery_<g>`` (1 level) or ``test`` (DyML-Product). ``ValueError``: a missing or malformed csv (wrong header,
    non-integer label), a missing image, a class with two parents."""
    root = Path(root)
    if split == "train":
        records = {"train": _three_levels(root, "train")}
    elif split == "test":
        records = {"test": _three_levels(root, "mini-bmk_all_in_one")}
    else:
        granularity = split.split("_", 1)[1]
        records = {f"{k}_{granularity}": _benchmark_set(root, k, granularity) for k in ("query", "gallery")}
    return file_split(records, split, dyml_label_names(split), root, benchmark=name, transform=transform)
