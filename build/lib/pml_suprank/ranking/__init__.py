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
* :mod:`~pml_suprank.ranking.tail` — the separable series of the sigmoid's far branches.

All functions are pure and take the device and dtype from their inputs.
"""

from __future__ import annotations

from .flat import (
    count_above,
    group_positions,
    heaviside_positive_count,
    pairwise_step_sum,
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

DEFAULT_CHUNK_ELEMENTS = CHUNK_SIZE  # the former name of the flat kernels' default chunk size

__all__ = [
    "CHUNK_SIZE",
    "HRankParams",
    "HeavisideStep",
    "SigmoidStep",
    "SortedLevels",
    "SupRankStep",
    "count_above",
    "default_offset",
    "group_positions",
    "heaviside",
    "heaviside_positive_count",
    "hierarchical_ranks",
    "pairwise_step_sum",
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
