"""The benchmark registry: one :class:`BenchmarkSpec` per name and :func:`load_benchmark`, the dispatcher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ._native import NativeImageDataset
from .cifar100 import CIFAR100_LABEL_NAMES, CIFAR100_SPLITS, load_cifar100
from .cub import CUB_LABEL_NAMES, CUB_SPLITS, load_cub
from .dyml import dyml_label_names, dyml_splits, load_dyml
from .gldv2 import GLDV2_LABEL_NAMES, GLDV2_SPLITS, load_gldv2
from .inat import INAT_BASE_LABEL_NAMES, INAT_FULL_LABEL_NAMES, INAT_SPLITS, load_inat
from .omniglot import OMNIGLOT_LABEL_NAMES, OMNIGLOT_SPLITS, load_omniglot
from .roxford import REVISITED_LABEL_NAMES, REVISITED_SPLITS, load_revisited
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


def _fixed(names: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    return lambda split: names


def _dyml(name: str) -> BenchmarkSpec:
    product = name == "dyml_product"
    layout = "train/label.csv + train/imgs/, bmk_{fine,middle,coarse}/{query,gallery}.csv + {query,gallery}/"
    return BenchmarkSpec(
        name,
        dyml_splits(product),
        dyml_label_names,
        partial(load_dyml, name=name),
        layout + (", mini-bmk_all_in_one/label.csv + imgs/" if product else ""),
        test_split="test" if product else None,
    )


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "sop": BenchmarkSpec(
        "sop", SOP_SPLITS, _fixed(SOP_LABEL_NAMES), load_sop, "Stanford_Online_Products/ with Ebay_{train,test}.txt"
    ),
    "cub": BenchmarkSpec("cub", CUB_SPLITS, _fixed(CUB_LABEL_NAMES), load_cub, "folder with CUB_200_2011/images/"),
    "inat_base": BenchmarkSpec(
        "inat_base",
        INAT_SPLITS,
        _fixed(INAT_BASE_LABEL_NAMES),
        partial(load_inat, full=False),
        "Inat_dataset_splits/Inaturalist_{train,test}_set1.txt + train_val2018/",
    ),
    "inat_full": BenchmarkSpec(
        "inat_full",
        INAT_SPLITS,
        _fixed(INAT_FULL_LABEL_NAMES),
        partial(load_inat, full=True),
        "Inat_dataset_splits/Inaturalist_{train,test}_set1.txt + train_val2018/ + train2018.json",
    ),
    "dyml_vehicle": _dyml("dyml_vehicle"),
    "dyml_animal": _dyml("dyml_animal"),
    "dyml_product": _dyml("dyml_product"),
    "cifar100": BenchmarkSpec(
        "cifar100",
        CIFAR100_SPLITS,
        _fixed(CIFAR100_LABEL_NAMES),
        load_cifar100,
        "cifar-100-python/{train,test} pickles, or a Hub id such as uoft-cs/cifar100",
        train_split="open_train",
        test_split="open_test",
    ),
    "omniglot": BenchmarkSpec(
        "omniglot",
        OMNIGLOT_SPLITS,
        _fixed(OMNIGLOT_LABEL_NAMES),
        load_omniglot,
        "folder with images_background*.zip (or the extracted folders)",
    ),
}


def _revisited(name: str) -> BenchmarkSpec:
    return BenchmarkSpec(
        name,
        REVISITED_SPLITS,
        _fixed(REVISITED_LABEL_NAMES),
        partial(load_revisited, name=name),
        f"{name}/ with gnd_{name}.pkl (imlist, qimlist, gnd) + jpg/",
        train_split="gallery",
        test_split=None,
    )


BENCHMARKS["gldv2_hier"] = BenchmarkSpec(
    "gldv2_hier",
    GLDV2_SPLITS,
    _fixed(GLDV2_LABEL_NAMES),
    load_gldv2,
    "GLDv2 folder with train_clean.csv, index_image_to_landmark.csv, retrieval_solution_v2.1.csv, "
    "{train,index}_label_to_subcategory_with_clusters.csv + train/, index/, test/",
    test_split=None,
)
BENCHMARKS["roxford5k"] = _revisited("roxford5k")
BENCHMARKS["rparis6k"] = _revisited("rparis6k")


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
