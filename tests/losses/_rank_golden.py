"""Helpers shared by the flat rank-loss tests: golden-case runner and dense (B×N×N) re-implementations."""

from __future__ import annotations

import torch
from conftest import load_golden
from pytorch_metric_learning.distances import DotProductSimilarity

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
DTYPES = [torch.float64, torch.float32]


def raw_dot():
    """The reference ranking losses use raw dot products of the (already normalised) stored embeddings."""
    return DotProductSimilarity(normalize_embeddings=False)


def golden_case(case_id: str) -> tuple[dict, dict]:
    golden = load_golden("ranking_golden")
    case = next(c for c in golden["loss_cases"] if c["id"] == case_id)
    return case, golden["inputs"][case["input"]]


def run_golden(case_id: str, make_loss, dtype, *, with_ref: bool | None = None):
    """Run ``make_loss()`` on a golden input; return (loss, grad, expected results dict)."""
    case, inp = golden_case(case_id)
    res = case["results"]["float64" if dtype == torch.float64 else "float32"]
    emb = torch.tensor(inp["embeddings"], dtype=dtype, requires_grad=True)
    labels = torch.tensor(inp["labels"])[:, 0]
    loss_fn = make_loss().to(dtype)
    for module in loss_fn.modules():
        if hasattr(module, "proxies") and "proxies" in inp:
            module.proxies.data = torch.tensor(inp["proxies"], dtype=dtype)
    use_ref = ("ref_embeddings" in inp) if with_ref is None else with_ref
    if use_ref:
        ref = torch.tensor(inp["ref_embeddings"], dtype=dtype)
        ref_labels = torch.tensor(inp["ref_labels"])[:, 0]
        loss = loss_fn(emb, labels, ref_emb=ref, ref_labels=ref_labels)
    else:
        loss = loss_fn(emb, labels)
    loss.backward()
    return loss.detach(), emb.grad, res


def assert_golden(loss, grad, res, dtype):
    tol = TOL[dtype]
    assert abs(loss.item() - res["loss"]) <= tol, (loss.item(), res["loss"])
    expected = torch.tensor(res["grad_embeddings"], dtype=dtype)
    assert (grad - expected).abs().max().item() <= tol


# ----------------------------------------------------------------------------- dense B×N×N re-implementations
def suprank_h_minus(t, tau=0.01, rho=100.0, delta=0.05, start=0.5, offset=1.4933071732521057):
    sig = torch.sigmoid(t / tau)
    return torch.where(t <= 0, sig, torch.where(t <= delta, start + sig, rho * (t - delta) + offset))


def dense_ap_terms(scores, valid, pos, pos_step, neg_step):
    """rank⁺ and rank for every (query, item) as (B, N) tensors, written directly from the definitions."""
    B, N = scores.shape
    diff = scores.unsqueeze(1) - scores.unsqueeze(2)  # diff[b, i, j] = s_bj − s_bi
    not_i = ~torch.eye(N, dtype=torch.bool).unsqueeze(0)
    pos_j = (pos.unsqueeze(1) & not_i).to(scores.dtype)
    neg_j = (valid & ~pos).unsqueeze(1).to(scores.dtype)
    rank_plus = 1 + (pos_step(diff) * pos_j).sum(-1)
    rank = rank_plus + (neg_step(diff) * neg_j).sum(-1)
    return rank_plus, rank


def dense_supap(scores, valid, pos, **step):
    rank_plus, rank = dense_ap_terms(
        scores, valid, pos, lambda d: (d >= 0).to(d.dtype), lambda d: suprank_h_minus(d, **step)
    )
    ap = (rank_plus / rank * pos).sum(1) / pos.sum(1)
    return 1 - ap  # (B,), NaN for queries without positives


def true_ap(scores, valid, pos):
    """Exact AP per query (ties broken pessimistically), over the valid reference items."""
    out = []
    for b in range(scores.shape[0]):
        s = scores[b][valid[b]]
        p = pos[b][valid[b]]
        order = torch.argsort(s + 1e-12 * (~p).to(s.dtype), descending=True, stable=True)
        hits = p[order].to(s.dtype)
        prec = torch.cumsum(hits, 0) / torch.arange(1, len(hits) + 1, dtype=s.dtype)
        out.append((prec * hits).sum() / hits.sum())
    return torch.stack(out)
