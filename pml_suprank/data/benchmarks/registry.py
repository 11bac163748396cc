"""The benchmark registry: one :class:`BenchmarkSpec` per name and :func:`load_benchmark`, the dispatcher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ._native import NativeImageDataset
from .cifar100 import CIFAR100_LABEL_NAMES, CIFAR100_SPLITS, load_cifar100
from .cub import CUB_LABEL_NAMES, CUB_SPLITS, load_cub
from .dyml import dyml_label_names, dyml_splits, load_dyml
from .gldv2 import GLDV2_LABEL_NAMES, GLDV2_SPLITS, load_gldv2
from .inat import INAT_BASE_LABEL_NAMES, INAT_FULL_LABEL_NAMES, INAT_SPLITS, load_inat
from .omniglot import OMNIGLOT_LABEL_NAMES, OMNIGLOT_SPLITS, load_omniglot
from .roxford import REVISITED_DATASETS, REVISITED_LABEL_NAMES, REVISITED_SPLITS, load_revisited
from .sop import SOP_LABEL_NAMES, SOP_SPLITS, load_sop

__all__ = ["BENCHMARKS", "BenchmarkSpec", "benchmark_label_names", "load_benchmark"]


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark: ``splits``, ``label_names(split)`` (fine → coarse), ``loader(root, split, transform)``, a
    one-line ``layout`` of ``root``, default ``train_split`` / ``test_split`` (``None``: per query / gallery pair)."""

    name: str
    splits: tuple[str, ...]
    label_names: Callable[[str], tuple[str, ...]]
    loader: Callable[..., NativeImageDataset]
    layout: str
    train_split: str = "train"
    test_split: str | None = "test"


_INAT = "Inat_dataset_splits/Inaturalist_{train,test}_set1.txt + train_val2018/"
_DYML = "train/label.csv + train/imgs/, bmk_{fine,middle,coarse}/{query,gallery}.csv + {query,gallery}/"
_LAYOUTS = {
    "sop": "Stanford_Online_Products/ with Ebay_{train,test}.txt",
    "cub": "folder with CUB_200_2011/images/",
    "inat_base": _INAT,
    "inat_full": f"{_INAT} + train2018.json",
    "dyml_vehicle": _DYML,
    "dyml_animal": _DYML,
    "dyml_product": f"{_DYML}, mini-bmk_all_in_one/label.csv + imgs/",
    "cifar100": "cifar-100-python/{train,test} pickles, or a Hub id such as uoft-cs/cifar100",
    "omniglot": "folder with images_background*.zip (or the extracted folders)",
    "gldv2_hier": "GLDv2 folder with train_clean.csv, index_image_to_landmark.csv, retrieval_solution_v2.1.csv, "
    "{train,index}_label_to_subcategory_with_clusters.csv + train/, index/, test/",
    **{name: f"{name}/ with gnd_{name}.pkl (imlist, qimlist, gnd) + jpg/" for name in REVISITED_DATASETS},
}


def _entry(name: str, splits: tuple, names: Any, loader: Callable, train: str = "train", test: str | None = "test"):
    label_names = names if callable(names) else lambda split: names
    return BenchmarkSpec(name, splits, label_names, loader, _LAYOUTS[name], train, test)


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        _entry("sop", SOP_SPLITS, SOP_LABEL_NAMES, load_sop),
        _entry("cub", CUB_SPLITS, CUB_LABEL_NAMES, load_cub),
        _entry("inat_base", INAT_SPLITS, INAT_BASE_LABEL_NAMES, partial(load_inat, full=False)),
        _entry("inat_full", INAT_SPLITS, INAT_FULL_LABEL_NAMES, partial(load_inat, full=True)),
        _entry("dyml_vehicle", dyml_splits(), dyml_label_names, partial(load_dyml, name="dyml_vehicle"), test=None),
        _entry("dyml_animal", dyml_splits(), dyml_label_names, partial(load_dyml, name="dyml_animal"), test=None),
        _entry("dyml_product", dyml_splits(True), dyml_label_names, partial(load_dyml, name="dyml_product")),
        _entry("cifar100", CIFAR100_SPLITS, CIFAR100_LABEL_NAMES, load_cifar100, "open_train", "open_test"),
        _entry("omniglot", OMNIGLOT_SPLITS, OMNIGLOT_LABEL_NAMES, load_omniglot),
        _entry("gldv2_hier", GLDV2_SPLITS, GLDV2_LABEL_NAMES, load_gldv2, test=None),
        *(
            _entry(name, REVISITED_SPLITS, REVISITED_LABEL_NAMES, partial(load_revisited, name=name), "gallery", None)
            for name in REVISITED_DATASETS
        ),
    )
}


def _spec(name: str, split: str) -> BenchmarkSpec:
    if not isinstance(name, str) or name not in BENCHMARKS:
        raise ValueError(f"name must be one of {sorted(BENCHMARKS)}; got {name!r}")
    if split not in BENCHMARKS[name].splits:
        raise ValueError(f"split must be one of {list(BENCHMARKS[name].splits)} for {name}; got {split!r}")
    return BENCHMARKS[name]


def benchmark_label_names(name: str, split: str) -> tuple[str, ...]:
    """The label column names (fine → coarse) of ``split`` of benchmark ``name``."""
    return _spec(name, split).label_names(split)


def load_benchmark(name: str, root: str | Path, split: str, transform: Callable | None = None) -> NativeImageDataset:
    """Benchmark ``name`` (:data:`BENCHMARKS`), split ``split``, read from ``root``, its extracted archive (each
    spec's ``layout``; ``cifar100`` also a Hub id): ``ds.labels`` ``(N, L)`` (column 0 finest, contiguous ids, a
    tree), images decoded lazily. ``ValueError``: unknown name or split, a malformed archive (naming file and line).
    """
    spec = _spec(name, split)
    if not isinstance(root, (str, Path)):
        raise TypeError(f"root must be a path (str or Path); got {type(root).__name__}")
    if name != "cifar100" and not Path(root).is_dir():
        raise ValueError(f"root {str(root)!r} of benchmark {name} is not a folder; expected {spec.layout}")
    return spec.loader(root, split, transform=transform)
