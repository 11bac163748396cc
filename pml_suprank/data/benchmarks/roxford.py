"""Revisited Oxford and Paris (Radenović et al., CVPR 2018): ``roxford5k`` and ``rparis6k``, the landmark test sets
of the Easy / Medium / Hard protocol (:func:`pml_suprank.metrics.landmark.revisited_map`).

Layout under ``root``: ``gnd_<name>.pkl`` (``imlist``, ``qimlist``, per query ``easy`` / ``hard`` / ``junk`` database
indices and its ``bbx``; read by :func:`~pml_suprank.data.benchmarks.cifar100.load_restricted_pickle`) and
``jpg/<name>.jpg``. Splits: ``query`` (cropped to ``bbx``; ground truth in ``ds.gnd``) and ``gallery`` (``imlist``
order). One level, ``landmark`` (the name without its trailing ``_<number>``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..._validation import check_choice
from ..paths import PathConfiner
from ..retrieval_dataset import decode_image
from ._native import FileImageDataset, NativeImageDataset, Record, file_split, layout_error
from .cifar100 import load_restricted_pickle

__all__ = [
    "REVISITED_DATASETS",
    "REVISITED_LABEL_NAMES",
    "REVISITED_SPLITS",
    "RevisitedQueryDataset",
    "load_revisited",
    "read_revisited_gnd",
]

REVISITED_DATASETS = ("roxford5k", "rparis6k")
REVISITED_LABEL_NAMES = ("landmark",)
REVISITED_SPLITS = ("query", "gallery")
_NAME = re.compile(r"^(?P<landmark>.+)_\d+$")
_GND_KEYS = ("easy", "hard", "junk")


def _names(content: dict, key: str, path: Path) -> list[str]:
    names = content[key]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise layout_error(path, key, f"expected a list of image names (str); got {type(names).__name__}")
    return list(names)


def _indices(value: Any, path: Path, where: str, num_items: int) -> np.ndarray:
    array = np.asarray(value if value is not None else [])
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise layout_error(path, where, f"expected integer database indices; got dtype {array.dtype}")
    array = array.astype(np.int64).reshape(-1)
    if array.size and (array.min() < 0 or array.max() >= num_items):
        raise layout_error(
            path, where, f"indices must lie in [0, {num_items}) (imlist); got [{array.min()}, {array.max()}]"
        )
    return array


def _bbx(value: Any, path: Path, where: str) -> tuple[float, float, float, float]:
    try:
        box = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        box = np.zeros(0)
    if box.size != 4 or not np.isfinite(box).all() or box[2] <= box[0] or box[3] <= box[1]:
        raise layout_error(path, where, f"bbx must be [x1, y1, x2, y2] with x1 < x2 and y1 < y2; got {value!r}")
    return (float(box[0]), float(box[1]), float(box[2]), float(box[3]))


def read_revisited_gnd(path: str | Path) -> dict[str, Any]:
    """The checked ``{"imlist": [str], "qimlist": [str], "gnd": [{"easy", "hard", "junk": int64 arrays, "bbx": 4
    floats}]}`` of a ``gnd_<dataset>.pkl``. ``ValueError`` naming the file and entry: missing or unreadable, missing
    keys, an index outside ``imlist``, a bad ``bbx``."""
    path = Path(path)
    content = load_restricted_pickle(path, "revisited ground-truth pickle", encoding="latin1")
    if not isinstance(content, dict):
        raise layout_error(path, None, f"expected a dict with imlist, qimlist, gnd; got {type(content).__name__}")
    missing = [k for k in ("imlist", "qimlist", "gnd") if k not in content]
    if missing:
        raise layout_error(path, None, f"missing keys {missing}; got {sorted(map(str, content))}")
    imlist, qimlist = _names(content, "imlist", path), _names(content, "qimlist", path)
    gnd_list = content["gnd"]
    if not isinstance(gnd_list, (list, tuple)) or len(gnd_list) != len(qimlist):
        size = len(gnd_list) if isinstance(gnd_list, (list, tuple)) else type(gnd_list).__name__
        raise layout_error(path, "gnd", f"expected one dict per query ({len(qimlist)} in qimlist); got {size}")
    gnd = []
    for q, entry in enumerate(gnd_list):
        if not isinstance(entry, dict) or not {"easy", "hard", "bbx"} <= set(entry):
            got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise layout_error(path, f"gnd[{q}]", f"expected a dict with easy, hard, junk, bbx; got {got}")
        checked = {k: _indices(entry.get(k), path, f"gnd[{q}][{k!r}]", len(imlist)) for k in _GND_KEYS}
        gnd.append({**checked, "bbx": _bbx(entry["bbx"], path, f"gnd[{q}]['bbx']")})
    return {"imlist": imlist, "qimlist": qimlist, "gnd": gnd}


class RevisitedQueryDataset(FileImageDataset):
    """The query images of a revisited dataset cropped to their ``bbx``; ``gnd[i]`` is the ground truth of item
    ``i``."""

    def __init__(
        self, labels: Any, label_names: Sequence[str], paths: Sequence[str], root: Path, *, gnd: list, **kwargs
    ):
        super().__init__(labels, label_names, paths, root, **kwargs)
        if len(gnd) != len(self):
            raise ValueError(f"gnd must give one entry per query ({len(self)}); got {len(gnd)}")
        self.gnd = gnd

    def get_image(self, index: int) -> Any:
        """The query region ``bbx`` of item ``index`` as a PIL RGB image (coordinates rounded as PIL does)."""
        index = self._check_index(index)
        return decode_image(self.paths[index], self.describe_item(index)).crop(self.gnd[index]["bbx"])

    image_record = NativeImageDataset.image_record  # the cropped query encoded as PNG (lossless)


def _records(names: list[str], root: Path, path: Path, key: str) -> list[Record]:
    out, confine = [], PathConfiner(root)
    for i, name in enumerate(names):
        match = _NAME.match(name)
        if match is None:
            raise layout_error(path, f"{key}[{i}]", f"image name {name!r} does not end in _<number> (landmark_number)")
        where = f"{path}, {key}[{i}]"
        out.append((confine("jpg", f"{name}.jpg", where=where), (match["landmark"],), where))
    return out


def load_revisited(
    root: str | Path, split: str, *, name: str = "roxford5k", transform: Callable | None = None
) -> FileImageDataset:
    """Revisited Oxford / Paris (``name``) ``split`` (``"query"`` or ``"gallery"``) of ``root``. ``ValueError``: a
    missing or malformed ground-truth pickle, an image name without a trailing number, a missing image."""
    check_choice("name", name, REVISITED_DATASETS)
    root = Path(root)
    path = root / f"gnd_{name}.pkl"
    content = read_revisited_gnd(path)
    records = {
        "query": _records(content["qimlist"], root, path, "qimlist"),
        "gallery": _records(content["imlist"], root, path, "imlist"),
    }
    query = {"cls": RevisitedQueryDataset, "gnd": content["gnd"]} if split == "query" else {}
    return file_split(records, split, REVISITED_LABEL_NAMES, root, benchmark=name, transform=transform, **query)
