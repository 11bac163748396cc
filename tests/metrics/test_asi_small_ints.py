"""ASI from ranks against its definition, including truncated rankings whose gallery counts exceed the slots (as
the k-NN backend produces) and counts beyond the int16 range of the prefix sums."""

import math

import torch

from pml_suprank.metrics.from_ranks import asi_from_ranks
from pml_suprank.metrics.ranks import RetrievalRanks, retrieval_ranks


def _asi_by_definition(ranks: RetrievalRanks) -> list[float]:
    """``(1/N⁺) Σ_{n<=min(N⁺, P)} Σ_l min(c_l(n), c*_l(n)) / n`` with Python integers, one query at a time."""
    L = ranks.num_levels
    out = []
    for lv, pos, cnt in zip(ranks.levels.tolist(), ranks.positions.tolist(), ranks.counts.tolist()):
        n_plus = sum(cnt[1:])
        if n_plus == 0:
            out.append(math.nan)
            continue
        total = 0.0
        for n in range(1, min(n_plus, len(lv)) + 1):
            inter = 0
            for lvl in range(1, L + 1):
                c = sum(1 for a, p in zip(lv, pos) if a == lvl and 0 < p <= n)
                above = sum(cnt[lvl + 1 :])
                inter += min(c, min(max(n - above, 0), cnt[lvl]))
            total += inter / n
        out.append(total / n_plus)
    return out


def _close(got: torch.Tensor, want: list[float]) -> bool:
    return all((math.isnan(w) and math.isnan(g)) or abs(g - w) <= 1e-12 for g, w in zip(got.tolist(), want))


def test_asi_matches_definition_on_full_rankings():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(6, 40, generator=g)
    scores[0, :10] = 0.5  # ties
    levels = torch.randint(0, 4, (6, 40), generator=g)
    levels[5] = 0  # a query without relevant items
    ranks = retrieval_ranks(scores, levels, num_levels=3)
    assert _close(asi_from_ranks(ranks), _asi_by_definition(ranks))


def test_asi_on_truncated_rankings_with_large_gallery_counts():
    # top-5 slots of each query (k-NN style), gallery counts far above the slots and above the int16 range
    levels = torch.tensor([[3, 0, 1, 2, 0], [1, 1, 0, 0, 3], [0, 0, 0, 0, 0]])
    positions = torch.where(levels > 0, torch.arange(1, 6).expand(3, 5), 0)
    order = torch.sort((levels == 0).to(torch.int8), dim=1, stable=True).indices  # relevant slots first
    levels, positions = levels.gather(1, order), positions.gather(1, order)
    counts = torch.tensor([[10, 40000, 3, 1], [7, 2, 0, 50000], [4, 0, 1, 2]])
    ranks = RetrievalRanks(levels, positions, counts, 3)
    got = asi_from_ranks(ranks)
    assert _close(got, _asi_by_definition(ranks))
    assert torch.isfinite(got).all()
