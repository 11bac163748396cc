"""Rank surrogates and memory-efficient rank kernels (SupRank, Ramzi et al., TPAMI 2025; Smooth-AP, Brown et al.,
ECCV 2020; HAPPIER, Ramzi et al., ECCV 2022).

* :mod:`~pml_suprank.ranking.steps` — the step functions ``H``, ``σ_τ``, SupRank's ``H⁻`` (Eq. 4) and HAPPIER's
  ``H_s^>``, each with value and explicit derivative;
* :mod:`~pml_suprank.ranking.window` — the one chunked window kernel (a custom autograd function that recomputes its
  blocks in backward) and the layouts of the flat and hierarchical paths; :data:`CHUNK_SIZE`, the one chunk size;
* :mod:`~pml_suprank.ranking.flat` — the flat kernels (SupAP / ROADMAP, Smooth-AP, Sup-R@k): sorted thresholds
  for the Heaviside and linear branches, sigmoid windows for the rest;
* :mod:`~pml_suprank.ranking.levels` and :mod:`~pml_suprank.ranking.hierarchical` — the hierarchical kernels
  (Sup-H-AP / HAPPIER, Sup-NDCG): closed forms over the score-sorted level sets of each query's positives, the H⁻
  sums by the flat kernel over one masked row per level, one host read per call;
* :mod:`~pml_suprank.ranking.query_blocks` — blocks of queries under a byte budget per device (per-query scores
  keep each block's Jacobian; per-item outputs recompute blocks in backward);
* :mod:`~pml_suprank.ranking.dense` — the dense kernels of the flat losses (``(b, N, N)`` differences blocked over
  queries under a memory budget, no host synchronisation) and the ``kernel="auto"`` cost model;
* :mod:`~pml_suprank.ranking.dense_hierarchical` — the dense kernels of the hierarchical losses.

All functions are pure and take the device and dtype from their inputs.

The package lists what a user of the losses calls: the kernel choice (:func:`choose_kernel`, its cost model
:func:`kernel_costs` / :func:`predicted_costs`), the chunk sizes and the step functions. The kernels themselves
(``dense_query_ranks``, ``sigmoid_rank_sums``, ``hierarchical_ranks``, ...) are the **expert API**: import them from
their modules above (``from pml_suprank.ranking.flat import sigmoid_rank_sums``); they are documented there and
may change with the losses that use them.
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
