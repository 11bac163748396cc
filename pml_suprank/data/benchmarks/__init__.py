"""The papers' retrieval benchmarks read from their archives as distributed: ``load_benchmark(name, root, split,
transform=None)`` (one module per family, shared readers in ``_native``, the name → reader table in ``registry``)."""

from ._native import ArrayImageDataset, FileImageDataset, NativeImageDataset, ZipImageDataset
from .registry import BENCHMARKS, BenchmarkSpec, benchmark_label_names, load_benchmark

__all__ = [
    "BENCHMARKS",
    "ArrayImageDataset",
    "BenchmarkSpec",
    "FileImageDataset",
    "NativeImageDataset",
    "ZipImageDataset",
    "benchmark_label_names",
    "load_benchmark",
]
