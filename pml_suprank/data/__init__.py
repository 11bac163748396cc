"""Datasets for retrieval training and evaluation (the ``recipes`` extra).

One contract for every dataset (:mod:`pml_suprank.data.retrieval_dataset`): ``ds[i] = {"image": FloatTensor
(3, H, W), "labels": LongTensor (L,), "index": i}``, ``ds.labels`` ``(N, L)`` with column 0 the finest.

Modules:
    loading: :func:`load_retrieval_dataset` (Hugging Face ids, folders, parquet), open-set splits.
    transforms: :func:`build_transforms`, timm's training / evaluation transforms from a backbone's data config.
    hf_sources: where the ``datasets`` splits come from.
    folders: your own image folders (:func:`image_folder_layout`, the seeded :func:`class_split`).
    label_columns: multi-label (list-valued) label columns.
    retrieval_dataset: :class:`RetrievalDatasetBase` and the label-set helpers.
    embedding_cache: :func:`cached_embeddings`, a model's outputs on a dataset embedded once (``--embedding_cache``).
    paths: :func:`confined_path`, the check that keeps paths read from a dataset's files inside its folder.
    synthetic_shapes / synthetic_multishapes: the built-in offline datasets.
    benchmarks: the papers' benchmarks read from their archives (:func:`load_benchmark`).

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
from .paths import PathConfiner, confined_path, is_inside
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
