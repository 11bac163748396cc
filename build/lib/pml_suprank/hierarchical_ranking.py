"""Hierarchical rank kernels (Sup-H-AP / HAPPIER, Sup-NDCG): moved to :mod:`pml_suprank.ranking.hierarchical`.

This module path is kept and re-exports the same names (``ideal_dcg`` lives in :mod:`pml_suprank.relevance`).
"""

from __future__ import annotations

from .ranking import hierarchical as _hierarchical
from .ranking.hierarchical import (  # noqa: F401  (re-exports)
    HRankParams,
    hierarchical_ranks,
    ideal_dcg,
    sup_hap_scores,
    sup_ndcg_scores,
)
from .ranking.window import CHUNK_SIZE as _CHUNK  # noqa: F401  (imported by pml_suprank.losses._hierarchical)

__all__ = list(_hierarchical.__all__)
