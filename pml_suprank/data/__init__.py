"""Datasets for retrieval training and evaluation (the ``recipes`` extra) under one contract
(:mod:`~pml_suprank.data.retrieval_dataset`): :func:`load_retrieval_dataset` (Hub ids, image folders, parquet), the
synthetic sets, the papers' benchmarks (:func:`load_benchmark`), :func:`build_transforms` and
:func:`cached_embeddings`.

Example:
    >>> from pml_suprank import data
    >>> ds = data.SyntheticShapes("train", num_per_class=4, image_size=32)
    >>> ds.label_names
    ['fine_label', 'coarse_label']
"""

from . import benchmarks
from .benchmarks import BENCHMARKS, benchmark_label_names, load_benchmark
from .embedding_cache import cached_embeddings, cached_features
from .folders import FolderLayout, class_split, class_split_side, image_folder_layout
from .hf_sources import check_image_paths
from .loading import (
    HFRetrievalDataset,
    build_transforms,
    check_disjoint_classes,
    collate,
    load_retrieval_dataset,
    open_set_classes,
)
from .paths import PathConfiner, is_inside
from .retrieval_dataset import RetrievalDatasetBase, check_label_sets, decode_image, pad_label_sets, pil_to_tensor
from .synthetic_multishapes import SYNTHETIC_DATASETS, SyntheticMultiShapes, synthetic_dataset
from .synthetic_shapes import COLOURS, FAMILIES, SyntheticNoise, SyntheticShapes
from .transforms import CROP_MODES

__all__ = [
    "BENCHMARKS",
    "HFRetrievalDataset",
    "RetrievalDatasetBase",
    "SyntheticMultiShapes",
    "SyntheticNoise",
    "SyntheticShapes",
    "benchmark_label_names",
    "benchmarks",
    "build_transforms",
    "cached_embeddings",
    "cached_features",
    "collate",
    "load_benchmark",
    "load_retrieval_dataset",
    "synthetic_dataset",
]
