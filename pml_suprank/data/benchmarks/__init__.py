"""The papers' retrieval benchmarks read from their archives as their owners distribute them:
``load_benchmark(name, root, split, transform=None)`` (one module per benchmark family, the shared readers in
``_native``, the name → reader table in ``registry``); a malformed archive raises ``ValueError`` naming file and line.
"""

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
