"""Stanford Online Products (Oh Song et al., CVPR 2016) from its release ``Stanford_Online_Products/``:
``Ebay_{train,test}.txt`` (``image_id class_id super_class_id path``, 1-based ids) and the images at ``<root>/<path>``.
Two levels, product (22,634) → category (12), ids ``class_id - 1`` / ``super_class_id - 1``; disjoint products.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..paths import PathConfiner
from ._native import FileImageDataset, Record, file_split, layout_error, parse_int, read_table

__all__ = ["SOP_LABEL_NAMES", "SOP_SPLITS", "load_sop"]

SOP_LABEL_NAMES = ("class_id", "super_class_id")
SOP_SPLITS = ("train", "test")
_COLUMNS = ("image_id", "class_id", "super_class_id", "path")


def _records(root: Path, split: str) -> list[Record]:
    path = root / f"Ebay_{split}.txt"
    out, confine = [], PathConfiner(root)
    for line, cells in read_table(path, _COLUMNS, delimiter=None):
        ids = [parse_int(cells[c], path, line, c) for c in _COLUMNS[:3]]
        if min(ids) < 1:
            raise layout_error(path, line, f"ids are 1-based; got image_id, class_id, super_class_id = {ids}")
        where = f"{path}, line {line}"
        out.append((confine(cells["path"], where=where), (ids[1], ids[2]), where))
    return out


def load_sop(root: str | Path, split: str, transform: Callable | None = None) -> FileImageDataset:
    """SOP ``split`` (``"train"`` / ``"test"``) of the ``Stanford_Online_Products`` folder ``root``: labels ``(N, 2)``
    = (product, category), 0-based (``ValueError``: a missing or malformed list file or image, a product with two
    categories)."""
    root = Path(root)
    records = {s: _records(root, s) for s in SOP_SPLITS}
    return file_split(records, split, SOP_LABEL_NAMES, root, benchmark="sop", transform=transform)
