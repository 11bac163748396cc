"""Naive per-query reference implementations (full sort per query, straight from the definitions) for tests."""

from __future__ import annotations

import math

import numpy as np


def pessimistic_order(scores: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Score descending, then level ascending, then index ascending."""
    return np.lexsort((np.arange(len(scores)), levels, -scores))


def naive_query_metrics(scores, levels, L, k_values=(1, 2, 4), relevance=None, alpha=1.0, weights=None):
    """All metrics of one query from its kept gallery (1-D arrays). NaN where undefined."""
    o = pessimistic_order(scores, levels)
    lv = levels[o]
    n = np.arange(1, len(lv) + 1)
    out = {}
    for m in range(1, L + 1):
        pos = lv >= m
        R = int(pos.sum())
        cum = np.cumsum(pos)
        prec = pos * cum / n
        nan = float("nan")
        out[f"ap{m}"] = prec.sum() / R if R else nan
        out[f"mapr{m}"] = prec[:R].sum() / R if R else nan
        out[f"rprec{m}"] = pos[:R].sum() / R if R else nan
        for k in k_values:
            out[f"r@{k}_{m}"] = float(pos[:k].any()) if R else nan
            out[f"p@{k}_{m}"] = pos[:k].sum() / k if R else nan
            out[f"tr@{k}_{m}"] = pos[:k].sum() / min(R, k) if R else nan
            out[f"map@{k}_{m}"] = prec[:k].sum() / min(R, k) if R else nan
    counts = np.bincount(levels, minlength=L + 1)
    if relevance is None:
        relevance = np.array([0.0] + [((l / L) ** alpha) / counts[l] if counts[l] else 0.0 for l in range(1, L + 1)])
    rel = np.where(lv > 0, relevance[lv], 0.0)
    # H-AP, Eq. 18-19, with the pessimistic order in place of the Heaviside
    num = 0.0
    for i in np.nonzero(lv > 0)[0]:
        h = sum(min(rel[i], rel[j]) for j in range(i + 1) if lv[j] > 0)
        num += h / (i + 1)
    den = rel.sum()
    out["hap"] = num / den if den > 0 else float("nan")
    # NDCG
    gain = 2.0**lv - 1
    dcg = (gain / np.log2(1 + n)).sum()
    ideal = np.sort(lv)[::-1]
    idcg = ((2.0**ideal - 1) / np.log2(1 + n)).sum()
    out["ndcg"] = dcg / idcg if idcg > 0 else float("nan")
    # ASI
    n_plus = int((lv > 0).sum())
    if n_plus:
        tot = 0.0
        for t in range(1, n_plus + 1):
            inter = 0
            for l in range(1, L + 1):
                inter += min(int((lv[:t] == l).sum()), int((ideal[:t] == l).sum()))
            tot += inter / t
        out["asi"] = tot / n_plus
    else:
        out["asi"] = float("nan")
    w = np.full(L, 1.0 / L) if weights is None else np.asarray(weights, dtype=float)
    aps = np.array([out[f"ap{m}"] for m in range(1, L + 1)])
    ok = ~np.isnan(aps)
    out["swap"] = (w[ok] * aps[ok]).sum() / w[ok].sum() if ok.any() and w[ok].sum() > 0 else float("nan")
    return out


def naive_metrics(scores, levels, mask, L, **kw):
    """Per-query dicts for a (Q, N) problem."""
    res = []
    for q in range(scores.shape[0]):
        keep = np.ones(scores.shape[1], bool) if mask is None else mask[q]
        res.append(naive_query_metrics(scores[q][keep], levels[q][keep], L, **kw))
    return res


def column(res, key):
    return np.array([r[key] for r in res], dtype=float)


def isclose(a, b, tol=1e-9):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return a.shape == b.shape and bool(np.all((np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= tol)))


__all__ = ["column", "isclose", "math", "naive_metrics", "naive_query_metrics", "pessimistic_order"]
