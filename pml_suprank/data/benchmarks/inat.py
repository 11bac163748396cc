"""iNaturalist 2018 (Van Horn et al., CVPR 2018) with the open-set splits of Smooth-AP (Brown et al., ECCV 2020):
``inat_base`` species → super-category from the image path (2 levels); ``inat_full`` species → ... → kingdom from
``train2018.json`` (7 levels, a taxon identified by its whole lineage).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..._safe_json import loads_json
from ..paths import PathConfiner
from ._native import FileImageDataset, Record, file_split, layout_error, read_text, require_file

__all__ = ["INAT_BASE_LABEL_NAMES", "INAT_FULL_LABEL_NAMES", "INAT_SPLITS", "load_inat"]

INAT_SPLITS = ("train", "test")
INAT_BASE_LABEL_NAMES = ("species", "supercategory")
INAT_FULL_LABEL_NAMES = ("species", "genus", "family", "order", "class", "phylum", "kingdom")
_RANKS = ("kingdom", "phylum", "class", "order", "family", "genus")


def _split_records(root: Path, split: str) -> list[tuple[str, str, int, str]]:
    """``(path, supercategory, category id, where)`` per line of the split file."""
    path = require_file(
        root / "Inat_dataset_splits" / f"Inaturalist_{split}_set1.txt", "one image path per line (Smooth-AP splits)"
    )
    out, confine = [], PathConfiner(root)
    for line, raw in enumerate(read_text(path).split("\n"), start=1):
        rel = raw.strip()
        if not rel:
            continue
        parts = rel.split("/")
        if len(parts) != 4 or parts[0] != "train_val2018" or not parts[2].isdigit():
            raise layout_error(
                path, line, f"expected train_val2018/<supercategory>/<category id>/<file>.jpg; got {rel!r}"
            )
        where = f"{path}, line {line}"
        out.append((confine(rel, where=where), parts[1], int(parts[2]), where))
    return out


def _taxonomy(root: Path) -> dict[int, tuple[str, ...]]:
    """``{category id: (kingdom, phylum, class, order, family, genus, name)}`` from ``train2018.json``."""
    path = require_file(root / "train2018.json", "the iNaturalist 2018 categories")
    try:
        categories = loads_json(read_text(path), path, max_bytes=2**32)["categories"]  # a large annotation file
    except (ValueError, KeyError, TypeError) as err:
        raise layout_error(path, None, f"expected a JSON object with a 'categories' list ({err})") from None
    out = {}
    for i, cat in enumerate(categories):
        missing = [k for k in ("id", "name", *_RANKS) if k not in cat]
        if missing:
            raise layout_error(path, f"categories[{i}]", f"missing keys {missing}")
        out[int(cat["id"])] = tuple(str(cat[k]) for k in (*_RANKS, "name"))
    return out


def load_inat(root: str | Path, split: str, *, full: bool, transform: Callable | None = None) -> FileImageDataset:
    """iNaturalist-2018 open-set ``split`` (``"train"`` / ``"test"``): labels ``(N, 2)``, or ``(N, 7)`` with ``full``,
    fine → coarse, contiguous over both splits. ``ValueError``: a missing or malformed file, a category absent from
    ``train2018.json``, a missing image, a species under two super-categories."""
    root = Path(root)
    rows = {s: _split_records(root, s) for s in INAT_SPLITS}
    records: dict[str, list[Record]] = {}
    if not full:
        for s, part in rows.items():
            records[s] = [(p, (cid, sup), where) for p, sup, cid, where in part]
        names = INAT_BASE_LABEL_NAMES
    else:
        taxonomy = _taxonomy(root)
        for s, part in rows.items():
            records[s] = []
            for p, _, cid, where in part:
                if cid not in taxonomy:
                    raise ValueError(f"{where}: category id {cid} is not in {root / 'train2018.json'}")
                lineage = taxonomy[cid][:-1]  # kingdom ... genus
                keys = (cid, *(lineage[: len(_RANKS) - k] for k in range(len(_RANKS))))
                records[s].append((p, keys, where))
        names = INAT_FULL_LABEL_NAMES
    return file_split(records, split, names, root, benchmark="inat_full" if full else "inat_base", transform=transform)
