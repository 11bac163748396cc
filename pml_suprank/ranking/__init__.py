"""Rank surrogates and memory-efficient rank kernels (SupRank, Ramzi et al., TPAMI 2025; Smooth-AP, Brown et al.,
ECCV 2020; HAPPIER, Ramzi et al., ECCV 2022).

* :mod:`~pml_suprank.ranking.steps` — ``H``, ``σ_τ``, SupRank's ``H⁻`` (Eq. 4), HAPPIER's ``H_s^>``;
* :mod:`~pml_suprank.ranking.window` — the one chunked sigmoid window kernel; :data:`CHUNK_SIZE`;
* :mod:`~pml_suprank.ranking.flat` — the sorted flat kernels (SupAP / ROADMAP, Smooth-AP, Sup-R@k);
* :mod:`~pml_suprank.ranking.levels`, :mod:`~pml_suprank.ranking.hierarchical` — the sorted hierarchical kernels
  (Sup-H-AP / HAPPIER, Sup-NDCG), one host read per call; :mod:`~pml_suprank.ranking.query_blocks` — their blocks;
* :mod:`~pml_suprank.ranking.dense`, :mod:`~pml_suprank.ranking.dense_hierarchical` — the dense ``(b, N, N)``
  kernels (no host synchronisation) and the ``kernel="auto"`` cost model.

The package lists the kernel choice, the chunk sizes and the step objects; the kernels are the **expert API**,
imported from their modules (``from pml_suprank.ranking.flat import sigmoid_rank_sums``) and may change with the
losses. All functions are pure and take the device and dtype from their inputs.
"""

from __future__ import annotations

from . import dense, dense_hierarchical, flat, hierarchical, levels, query_blocks, steps, window
from .dense import KERNELS, KernelCosts, choose_kernel, kernel_costs, predicted_costs
from .flat import ACCELERATOR_CHUNK_SIZE, default_chunk_elements
from .steps import HeavisideStep, SigmoidStep, SupRankStep
from .window import CHUNK_SIZE

__all__ = [
    "ACCELERATOR_CHUNK_SIZE",
    "CHUNK_SIZE",
    "KERNELS",
    "HeavisideStep",
    "KernelCosts",
    "SigmoidStep",
    "SupRankStep",
    "choose_kernel",
    "default_chunk_elements",
    "kernel_costs",
    "predicted_costs",
]
