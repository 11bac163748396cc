"""Rank surrogates and memory-efficient rank kernels (SupRank, Ramzi et al., TPAMI 2025; Smooth-AP, Brown et al.,
ECCV 2020; HAPPIER, Ramzi et al., ECCV 2022).

* :mod:`~pml_suprank.ranking.steps` — the step functions ``H``, ``σ_τ``, SupRank's ``H⁻`` (Eq. 4) and HAPPIER's
  ``H_s^>``, each with value and explicit derivative;
* :mod:`~pml_suprank.ranking.window` — the one chunked window kernel (a custom autograd function that recomputes its
  blocks in backward) and the layouts of the flat and hierarchical paths; :data:`CHUNK_SIZE`, the one chunk size;
* :mod:`~pml_suprank.ranking.flat` — the flat kernels (SupAP / ROADMAP, Smooth-AP, Sup-R@k): sorted thresholds
  for the Heaviside and linear branches, sigmoid windows for the rest;
* :mod:`~pml_suprank.ranking.levels` and :mod:`~pml_suprank.ranking.hierarchical` — the hierarchical kernels
  (Sup-H-AP / HAPPIER, Sup-NDCG) over score-sorted level sets;
* :mod:`~pml_suprank.ranking.dense` — the dense kernels of the flat losses (``(b, N, N)`` differences blocked over
  queries under a memory budget, no host synchronisation) and the ``kernel="auto"`` cost model;
* :mod:`~pml_suprank.ranking.dense_hierarchical` — the dense kernels of the hierarchical losses;
* :mod:`~pml_suprank.ranking.tail` — the separable series of the sigmoid's far branches.

All functions are pure and take the device and dtype from their inputs.
"""

from __future__ import annotations

from .dense import (
    DENSE_MEMORY_BUDGET,
    KERNELS,
    KernelCosts,
    choose_kernel,
    dense_block_size,
    dense_query_ap,
    dense_query_ranks,
    dense_smooth_ap_grad,
    dense_smooth_ap_ranks,
    dense_suprank_grad,
    dense_suprank_ranks,
    kernel_costs,
    masked_query_mean,
    predicted_costs,
)
from .dense_hierarchical import (
    dense_hierarchical_query_ranks,
    dense_hierarchical_ranks,
    dense_sup_hap_scores,
    dense_sup_ndcg_scores,
)
from .flat import (
    ACCELERATOR_CHUNK_SIZE,
    PairGroups,
    count_above,
    default_chunk_elements,
    group_pairs,
    group_positions,
    heaviside_positive_count,
    pairwise_step_sum,
    positive_pair_groups,
    sigmoid_rank_sums,
    sigmoid_window_sum,
    suprank_negative_sum,
)
from .hierarchical import hierarchical_ranks, sup_hap_scores, sup_ndcg_scores
from .levels import SortedLevels, sort_levels
from .steps import (
    HeavisideStep,
    HRankParams,
    PairMask,
    SigmoidStep,
    Step,
    SupRankStep,
    default_offset,
    heaviside,
    suprank_step,
    tau_sigmoid,
)
from .window import CHUNK_SIZE, window_sum

__all__ = [
    "ACCELERATOR_CHUNK_SIZE",
    "CHUNK_SIZE",
    "DENSE_MEMORY_BUDGET",
    "KERNELS",
    "HRankParams",
    "HeavisideStep",
    "KernelCosts",
    "PairGroups",
    "SigmoidStep",
    "SortedLevels",
    "SupRankStep",
    "choose_kernel",
    "count_above",
    "default_chunk_elements",
    "default_offset",
    "dense_block_size",
    "dense_hierarchical_query_ranks",
    "dense_hierarchical_ranks",
    "dense_query_ap",
    "dense_query_ranks",
    "dense_smooth_ap_grad",
    "dense_smooth_ap_ranks",
    "dense_sup_hap_scores",
    "dense_sup_ndcg_scores",
    "dense_suprank_grad",
    "dense_suprank_ranks",
    "group_pairs",
    "group_positions",
    "heaviside",
    "heaviside_positive_count",
    "hierarchical_ranks",
    "kernel_costs",
    "masked_query_mean",
    "pairwise_step_sum",
    "positive_pair_groups",
    "predicted_costs",
    "sigmoid_rank_sums",
    "sigmoid_window_sum",
    "sort_levels",
    "sup_hap_scores",
    "sup_ndcg_scores",
    "suprank_negative_sum",
    "suprank_step",
    "tau_sigmoid",
    "window_sum",
]
