"""Every retrieval metric computed from the positions of the relevant items, each implemented exactly once.

Each ``*_from_ranks`` function reads the prefix sums of a :class:`RankStats`; given :class:`RetrievalRanks` it builds
one, given a :class:`RankStats` (as :func:`pml_suprank.metrics.registry.metrics_from_ranks` does) it shares its sums.

Binary positives are the items at level ``>= min_level`` (default ``L``; hierarchy level ``h`` is ``L - h``).
Queries without a positive (hierarchical: any relevant item) get ``NaN``, excluded from means. float64 values.

References: Ramzi et al., SupRank (TPAMI 2025): H-AP Eqs. 18-20, NDCG Eq. 23, ASI App. C-A1, ΣwAP Sec. V-A1 and
supp. B-B3 (Property 1); HAPPIER (ECCV 2022); mAP@R and R-precision: Musgrave et al. (ECCV 2020).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from .._validation import check_level_weights, check_positive
from ..relevance import ideal_dcg, pop_relevance, property1_relevance
from .ranks import RetrievalRanks, _compiled_available

__all__ = [
    "RankStats",
    "ap_from_ranks",
    "asi_from_ranks",
    "hap_from_ranks",
    "map_at_k_from_ranks",
    "map_at_r_from_ranks",
    "ndcg_from_ranks",
    "precision_at_k_from_ranks",
    "property1_hap",
    "r_precision_from_ranks",
    "recall_at_k_from_ranks",
    "true_recall_at_k_from_ranks",
    "weighted_sum_ap_from_ranks",
]


#: the threshold of :class:`RankStats` covering the whole ranking
ALL = ("all",)


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


def _nan_where_empty(value: Tensor, n: Tensor) -> Tensor:
    return torch.where(n > 0, value, torch.full_like(value, float("nan")))


def _at(arr: Tensor, i: Tensor) -> Tensor:
    """``arr[c, i[c] - 1]`` (0 where ``i[c] == 0``): inclusive prefix sums ``(C, P)``, slot counts ``i`` ``(C, 1)``."""
    return torch.where(i > 0, arr.gather(1, (i - 1).clamp_min(0)), 0.0)[:, 0]


class RankStats:
    """Prefix sums of one :class:`RetrievalRanks` shared by every metric (computed on first use, then cached).

    With ``A_m(k)`` the items of level ``>= m`` ranked at or before slot ``k`` (:meth:`cum_ge`), the binary metrics
    read :meth:`count_at` (``A_m``) and :meth:`precision_sum_at` (``Σ rank⁺/rank``) at a threshold :data:`ALL`,
    ``("k", k)`` (top ``k``) or ``("r", m')`` (first ``R`` = #items of level ``>= m'`` positions); H-AP and NDCG read
    :meth:`level_sums` and :meth:`level_discounts` (numba on the CPU, torch prefix sums elsewhere: bitwise equal).

    Args:
        ranks: the ranked relevant items of a chunk of queries (its fields become attributes).
        k_values: the cutoffs the top-k metrics will ask for (speed only).
    """

    def __init__(self, ranks: RetrievalRanks, k_values: Iterable[int] = ()) -> None:
        lv, positions = ranks.levels, ranks.positions
        C, P = lv.shape
        if P == 0:  # one padding slot keeps every gather well defined
            lv = torch.zeros(C, 1, dtype=lv.dtype, device=lv.device)
            positions = torch.zeros_like(lv)
        self.levels, self.positions, self.counts, self.num_levels = lv, positions, ranks.counts, ranks.num_levels
        self._cache: dict[tuple, Any] = {}  # (what, argument) -> tensor
        self._level_sums = self._level_disc = self._asi_sums = None
        self._compiled = (
            lv.device.type == "cpu" and lv.dtype == positions.dtype == torch.int64 and _compiled_available()
        )
        self._named = (ALL, *(("r", m) for m in range(1, self.num_levels + 1)), *(("k", _check_k(k)) for k in k_values))

    def _memo(self, key: tuple, compute: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def valid(self) -> Tensor:
        """``(C, P)`` bool: the slot holds a relevant item (level ``>= 1``)."""
        return self.ge(1)

    @functools.cached_property
    def position(self) -> Tensor:
        """``(C, P)`` float64 positions, ``inf`` on padding (non-decreasing along the slots)."""
        return _f64(self.positions).masked_fill_(~self.valid, float("inf"))

    @functools.cached_property
    def inv_position(self) -> Tensor:
        """``(C, P)`` float64 ``1 / position``, ``0`` on padding."""
        return self.position.reciprocal()

    def count_at(self, m: int, at: tuple) -> Tensor:
        """``(C,)`` float64 ``A_m`` at the threshold ``at``: items of level ``>= m`` within it (see the class)."""
        self._check_point(m, at)
        if self._compiled:
            return self._walk(at)[0][m - 1]
        return self.cum_ge(m)[:, -1] if at == ALL else _at(self.cum_ge(m), self._upto(at))

    def precision_sum_at(self, m: int, at: tuple) -> Tensor:
        """``(C,)`` float64 ``Σ rank⁺(k) / rank(k)`` over the positives (level ``>= m``) within threshold ``at``."""
        self._check_point(m, at)
        if self._compiled:
            return self._walk(at)[1][m - 1]
        return self.cum_precision(m)[:, -1] if at == ALL else _at(self.cum_precision(m), self._upto(at))

    def _check_point(self, m: int, at: tuple) -> None:
        L = self.num_levels
        _check_min_level(m, L)
        ok = at == ALL or (
            isinstance(at, tuple)
            and len(at) == 2
            and at[0] in ("k", "r")
            and isinstance(at[1], int)
            and not isinstance(at[1], bool)
            and (at[1] >= 1 if at[0] == "k" else 1 <= at[1] <= L)
        )
        if not ok:
            raise ValueError(f"at must be ALL, ('k', k) with k >= 1 or ('r', m) with 1 <= m <= {L}; got {at!r}")

    def _upto(self, at: tuple) -> Tensor:
        """``(C, 1)`` number of slots with position ``<=`` the threshold ``("k", k)`` or ``("r", m)``."""
        t = _f64(self._threshold(at))[:, None].contiguous()
        return self._memo(("upto", at), lambda: torch.searchsorted(self.position, t, right=True))

    def _walk(self, at: tuple) -> tuple[Tensor, Tensor]:
        """``(L, C)`` counts and precision sums at ``at`` from the compiled walk (caching the named thresholds)."""
        if ("walk", at) not in self._cache:
            from ._compiled_rank_sums import rank_sums_compiled

            keys = [at, *(key for key in self._named if ("walk", key) not in self._cache and key != at)]
            thresholds = torch.stack([self._threshold(key) for key in keys], 1)
            ge_at, prec_at, level_sums, level_disc, asi = rank_sums_compiled(
                self.levels, self.positions, self.counts, thresholds, self.num_levels
            )
            for i, key in enumerate(keys):
                self._cache[("walk", key)] = (ge_at[:, :, i], prec_at[:, :, i])
            if self._level_sums is None:
                self._level_sums, self._level_disc, self._asi_sums = level_sums, level_disc, asi
        return self._cache[("walk", at)]

    def _threshold(self, at: tuple) -> Tensor:
        """``(C,)`` int64 position of the threshold ``at`` (the whole ranking: larger than every position)."""
        C = self.levels.shape[0]
        if at == ALL:
            return torch.full((C,), 2**62, dtype=torch.int64, device=self.levels.device)
        if at[0] == "k":
            return torch.full((C,), at[1], dtype=torch.int64, device=self.levels.device)
        return self.n_pos(at[1]).to(torch.int64)

    def n_pos(self, m: int) -> Tensor:
        """``(C,)`` int64 number of gallery items at level ``>= m``."""
        return self._memo(("n_pos", m), lambda: self.counts[:, m:].sum(1))

    def ge(self, m: int) -> Tensor:
        """``(C, P)`` bool: the slot holds an item of level ``>= m``."""
        return self._memo(("ge", m), lambda: self.levels >= m)

    def cum_ge(self, m: int) -> Tensor:
        """``(C, P)`` float64 ``A_m``: items of level ``>= m`` ranked at or before each slot (inclusive)."""
        # integer counts: an int32 scan then one conversion (exact, faster)
        return self._memo(("cum_ge", m), lambda: torch.cumsum(self.ge(m), 1, dtype=torch.int32).to(torch.float64))

    def cum_precision(self, m: int) -> Tensor:
        """``(C, P)`` float64 inclusive prefix sums of ``rank⁺(k) / rank(k)`` over the positives (level ``>= m``)."""
        if ("cprec", m) not in self._cache:
            prec = self.cum_ge(m) * self.inv_position  # inv_position is 0 on padding: only levels < m need masking
            if m > 1:
                prec.mul_(self.ge(m))  # exact: x·1 = x, and x·0 = 0 for the finite x here
            self._cache[("cprec", m)] = prec.cumsum_(1)
        return self._cache[("cprec", m)]

    def level_sums(self) -> Tensor:
        """``(C, L, L)`` float64 ``[c, λ - 1, l - 1] = Σ_{k: level λ} A_l(k) / rank(k)`` (slots of level ``λ``)."""
        if self._compiled:
            self._walk(ALL)
        if self._level_sums is None:
            L = self.num_levels
            inv_position = self.inv_position
            rows = []
            for lam in range(1, L + 1):
                w = inv_position * (self.levels == lam)
                rows.append(torch.stack([(self.cum_ge(m) * w).sum(1) for m in range(1, L + 1)], 1))
            self._level_sums = torch.stack(rows, 1)
        return self._level_sums

    def level_discounts(self) -> Tensor:
        """``(C, L)`` float64 ``[c, λ - 1] = Σ_{k: level λ} 1 / log2(1 + rank(k))`` (NDCG's discounts by level)."""
        if self._compiled:
            self._walk(ALL)
        if self._level_disc is None:
            disc = torch.add(self.position, 1.0).log2_().reciprocal_()  # 0 on padding (position inf)
            L = self.num_levels
            self._level_disc = torch.stack([(disc * (self.levels == lam)).sum(1) for lam in range(1, L + 1)], 1)
        return self._level_disc

    def level_slots(self) -> Tensor:
        """``(C, L)`` float64 number of slots of level exactly ``λ = 1..L``."""
        ge = torch.stack([self.count_at(m, ALL) for m in range(1, self.num_levels + 1)], 1)
        return ge - torch.cat([ge[:, 1:], torch.zeros_like(ge[:, :1])], 1)


def _stats(ranks: RetrievalRanks | RankStats) -> RankStats:
    """``ranks`` itself if it is a :class:`RankStats` (shared prefix sums), else a new one."""
    return ranks if isinstance(ranks, RankStats) else RankStats(ranks)


def _binary(ranks: RetrievalRanks | RankStats, min_level: int | None) -> tuple[RankStats, int, Tensor]:
    """``(stats, m, #positives (C,))`` of a binary metric with positives at level ``>= min_level`` (default ``L``)."""
    st = _stats(ranks)
    m = _check_min_level(min_level, st.num_levels)
    return st, m, st.n_pos(m)


def ap_from_ranks(ranks: RetrievalRanks | RankStats, min_level: int | None = None) -> Tensor:
    """AP ``(Q,)`` ``= (1/|Ω⁺|) Σ_{k∈Ω⁺} rank⁺(k) / rank(k)``, positives at level ``>= min_level`` (default ``L``)."""
    st, m, n = _binary(ranks, min_level)
    return _nan_where_empty(st.precision_sum_at(m, ALL) / _f64(n).clamp_min(1), n)


def map_at_r_from_ranks(ranks: RetrievalRanks | RankStats, min_level: int | None = None) -> Tensor:
    """mAP@R ``(Q,)`` (Musgrave et al.): precisions at the positives within the first ``R = |Ω⁺|`` positions / ``R``."""
    st, m, n = _binary(ranks, min_level)
    return _nan_where_empty(st.precision_sum_at(m, ("r", m)) / _f64(n).clamp_min(1), n)


def r_precision_from_ranks(ranks: RetrievalRanks | RankStats, min_level: int | None = None) -> Tensor:
    """R-precision ``(Q,)``: positives within the first ``R = |Ω⁺|`` positions, divided by ``R``."""
    st, m, n = _binary(ranks, min_level)
    return _nan_where_empty(st.count_at(m, ("r", m)) / _f64(n).clamp_min(1), n)


def recall_at_k_from_ranks(ranks: RetrievalRanks | RankStats, k: int, min_level: int | None = None) -> Tensor:
    """R@k as used in image retrieval ``(Q,)``: 1 if a positive is among the top ``k`` (hit rate)."""
    st, m, n = _binary(ranks, min_level)
    return _nan_where_empty((st.count_at(m, ("k", _check_k(k))) > 0).double(), n)


def precision_at_k_from_ranks(ranks: RetrievalRanks | RankStats, k: int, min_level: int | None = None) -> Tensor:
    """P@k ``(Q,)``: positives in the top ``k`` divided by ``k``."""
    st, m, n = _binary(ranks, min_level)
    return _nan_where_empty(st.count_at(m, ("k", _check_k(k))) / k, n)


def true_recall_at_k_from_ranks(ranks: RetrievalRanks | RankStats, k: int, min_level: int | None = None) -> Tensor:
    """True recall@k ``(Q,)``: positives in the top ``k`` divided by ``min(|Ω⁺|, k)``."""
    st, m, n = _binary(ranks, min_level)
    return _nan_where_empty(st.count_at(m, ("k", _check_k(k))) / _f64(n).clamp(1, k), n)


def map_at_k_from_ranks(ranks: RetrievalRanks | RankStats, k: int, min_level: int | None = None) -> Tensor:
    """mAP@k ``(Q,)``: precisions at the positives within the top ``k``, divided by ``min(|Ω⁺|, k)``."""
    st, m, n = _binary(ranks, min_level)
    return _nan_where_empty(st.precision_sum_at(m, ("k", _check_k(k))) / _f64(n).clamp(1, k), n)


def hap_from_ranks(ranks: RetrievalRanks | RankStats, relevance: Tensor | None = None, alpha: float = 1.0) -> Tensor:
    """H-AP ``(Q,)`` (SupRank Eqs. 18-19) from a relevance table ``rel(l)``.

    ``H-rank⁺(k) = Σ_l c_l(k)·min(rel(k), rel(l))`` with ``c_l(k)`` the items of level exactly ``l`` ranked at or
    before ``k`` (the pessimistic order replaces the Heaviside of Eq. 18), ``H-AP = Σ_k H-rank⁺(k) / rank(k) /
    Σ_k rel(k)`` over the relevant items ``k``; summed by parts per level from the ``(C, L, L)`` tables of
    :meth:`RankStats.level_sums`. Levels are identified by their integer level, never by float equality of relevances.

    Args:
        ranks: from :func:`~pml_suprank.metrics.ranks.retrieval_ranks` (or their :class:`RankStats`).
        relevance: ``(Q, L + 1)`` or ``(L + 1,)`` table ``rel(l)`` (column 0 ignored); default: the pop relevance
            ``(l / L)^α / |Ω^(l)|`` of Eq. 20 counted on the gallery searched (the items a mask keeps; pass a table
            for another convention, e.g. the reference code's counts, which include the query itself).
        alpha: ``α`` of Eq. 20 (used only for the default table).
    """
    st = _stats(ranks)
    if relevance is None:
        table = pop_relevance(st.counts, alpha=check_positive("alpha", alpha, strict=False), dtype=torch.float64)
    else:
        table = _check_relevance_table(relevance, st)
    table = torch.cat([torch.zeros_like(table[:, :1]), table[:, 1:]], 1)  # rel(0) = 0
    pair_min = torch.minimum(table[:, :, None], table[:, None, :])  # [c, λ, l] = min(rel(λ), rel(l))
    steps = pair_min[:, 1:, 1:] - torch.cat([torch.zeros_like(pair_min[:, 1:, :1]), pair_min[:, 1:, 1:-1]], 2)
    num = (steps * st.level_sums()).sum((1, 2))
    den = (table[:, 1:] * st.level_slots()).sum(1)
    return _nan_where_empty(num / torch.where(den > 0, den, torch.ones_like(den)), den)


def ndcg_from_ranks(ranks: RetrievalRanks | RankStats) -> Tensor:
    """NDCG ``(Q,)`` (SupRank Eq. 23): gains ``2^l − 1``, discounts ``1 / log2(1 + p)``, ideal DCG of the same
    gallery; NaN without relevant items (:meth:`RankStats.level_discounts`)."""
    st = _stats(ranks)
    L = st.num_levels
    device = st.levels.device
    gains = 2.0 ** torch.arange(L + 1, device=device, dtype=torch.float64) - 1.0
    dcg = (st.level_discounts() * gains[1:]).sum(1)
    # relevant levels only (the negatives' gain is 0): at most P = levels.shape[1] items, a size known on the host
    idcg = ideal_dcg(st.counts[:, 1:], gains[1:], num_items=st.levels.shape[1])
    return _nan_where_empty(dcg / torch.where(idcg > 0, idcg, torch.ones_like(idcg)), st.n_pos(1))


def asi_from_ranks(ranks: RetrievalRanks | RankStats) -> Tensor:
    """Average Set Intersection ``(Q,)`` (SupRank App. C-A1); NaN without relevant items.

    ``ASI = (1/N⁺) Σ_{n=1}^{N⁺} Σ_l min(c_l(n), c*_l(n)) / n`` with ``c_l(n)`` the level-``l`` items in the top
    ``n`` of the ranking and ``c*_l(n)`` in the ideal one (int16/int32 prefix sums over position -> level).
    """
    st = _stats(ranks)
    L = st.num_levels
    lv, positions, counts = st.levels, st.positions, st.counts
    C, P = lv.shape
    device = lv.device
    n_plus = st.n_pos(1)
    if st._compiled:  # CPU: summed by the compiled walk of the other metrics
        st._walk(ALL)
        return _nan_where_empty(st._asi_sums / n_plus.clamp_min(1), n_plus)
    inside = st.valid & (positions <= n_plus[:, None])  # only positions <= N⁺ <= P matter
    # level of the relevant item at each position 1..P (positions are distinct; column P collects the rest)
    level_at = torch.zeros(C, P + 1, dtype=torch.int8, device=device)
    level_at.scatter_(1, (positions - 1).masked_fill_(~inside, P), lv.to(torch.int8).mul_(inside))
    level_at = level_at[:, :P]
    # exact small integers (every count is at most n <= P, so gallery counts above P act as P): int16 when P allows
    idt = torch.int16 if P < 2**15 else torch.int32
    n = torch.arange(1, P + 1, device=device, dtype=idt)
    total = None
    above = torch.zeros_like(n_plus)  # relevant items of higher level (ranked first in the ideal order)
    prev = None
    for lvl in range(L, 0, -1):
        cum_ge = (level_at >= lvl).cumsum(1, dtype=idt)  # items of level >= lvl within the first n
        n_l = counts[:, lvl]
        if prev is None:  # lvl == L: total shares cum_ge's memory (prev is only read before total changes)
            total = cum_ge
        else:
            c = torch.sub(cum_ge, prev)
            c_star = (n[None, :] - above.clamp_max(P)[:, None].to(idt)).clamp_min_(0)
            total += torch.minimum(c, torch.minimum(c_star, n_l.clamp_max(P)[:, None].to(idt), out=c_star), out=c)
        prev = cum_ge
        above = above + n_l
    inside_n = n[None, :] <= n_plus.clamp_max(P)[:, None].to(idt)  # positions <= N⁺ only
    ratio = _f64(total.mul_(inside_n)).div_(_f64(n)[None, :])
    return _nan_where_empty(ratio.sum(1) / n_plus.clamp_min(1), n_plus)


def weighted_sum_ap_from_ranks(
    ranks: RetrievalRanks | RankStats, weights: Tensor | list[float] | None = None
) -> Tensor:
    """ΣwAP ``(Q,)`` ``= Σ_l w_l·AP^(l) / Σ_l w_l`` over the levels ``l`` with positives for the query (SupRank
    Sec. V-A1, supp. B-B3); ``AP^(l)``: positives at level ``>= l``; ``weights`` ``w_1..w_L`` (default uniform).
    Equals H-AP with the Property-1 relevance (:func:`pml_suprank.relevance.property1_relevance`)."""
    st = _stats(ranks)
    L = st.num_levels
    C = st.levels.shape[0]
    if weights is None:
        weights = torch.full((L,), 1.0 / L, dtype=torch.float64, device=st.levels.device)
    else:
        weights = torch.tensor(check_level_weights("weights", weights, L), dtype=torch.float64, device=st.levels.device)
    num = torch.zeros(C, dtype=torch.float64, device=st.levels.device)
    den = torch.zeros_like(num)
    for m in range(1, L + 1):
        n = st.n_pos(m)
        has = n > 0
        num += torch.where(
            has, weights[m - 1] * st.precision_sum_at(m, ALL) / _f64(n).clamp_min(1), torch.zeros_like(num)
        )
        den += torch.where(has, weights[m - 1], torch.zeros_like(den))
    return _nan_where_empty(num / torch.where(den > 0, den, torch.ones_like(den)), den)


def _check_min_level(min_level: int | None, num_levels: int) -> int:
    if min_level is None:
        return num_levels
    if isinstance(min_level, bool) or not isinstance(min_level, int) or not 1 <= min_level <= num_levels:
        raise ValueError(f"min_level must be an int in [1, num_levels={num_levels}]; got {min_level!r}")
    return min_level


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int; got {k!r}")
    return k


def _check_relevance_table(relevance: Tensor, ranks: RetrievalRanks | RankStats) -> Tensor:
    Q = ranks.counts.shape[0]
    L = ranks.num_levels
    if not isinstance(relevance, Tensor) or not relevance.is_floating_point():
        raise TypeError(f"relevance must be a floating-point torch.Tensor of shape (Q, L + 1); got {relevance!r}")
    if relevance.dim() == 1:
        relevance = relevance.expand(Q, -1)
    if relevance.shape != (Q, L + 1):
        raise ValueError(f"relevance must have shape (Q, L + 1) = {(Q, L + 1)}; got shape {tuple(relevance.shape)}")
    if not bool(torch.isfinite(relevance).all()) or bool((relevance < 0).any()):
        raise ValueError("relevance must be finite and non-negative")
    return _f64(relevance).to(ranks.levels.device)


def property1_hap(ranks: RetrievalRanks | RankStats, weights: Tensor | list[float]) -> Tensor:
    """H-AP with the Property-1 relevance of ``weights`` (equals :func:`weighted_sum_ap_from_ranks`)."""
    return hap_from_ranks(ranks, relevance=property1_relevance(ranks.counts, weights, dtype=torch.float64))
