"""The papers' retrieval benchmarks read from their archives exactly as their owners distribute them.

``load_benchmark(name, root, split, transform=None)`` returns a dataset with the package's retrieval contract
(``ds.labels`` ``(N, L)`` LongTensor, column 0 finest, a tree; ``ds[i] = {"image", "labels", "index"}``; lazy
PIL decoding). One module per benchmark family (``sop``, ``cub``, ``inat``, ``dyml``, ``cifar100``, ``omniglot``,
``gldv2`` for H-GLDv2, ``roxford`` for the revisited Oxford / Paris test sets), the shared readers in ``_native``
and the name → reader table in ``registry``. A malformed archive raises ``ValueError`` naming the file and the line.
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
