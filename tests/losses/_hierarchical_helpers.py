"""Helpers shared by the hierarchical loss tests: golden-case runner, a 3-level label tree, random batches."""

from __future__ import annotations

import torch
from conftest import load_golden
from pytorch_metric_learning.distances import DotProductSimilarity

SOP = dict(tau=0.01, rho=100.0, delta=0.05, start=0.5, offset=1.44)
TOL = {torch.float64: 1e-7, torch.float32: 1e-5}
TABLE = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 2, 1], [5, 3, 1]])


def raw_dot():
    """The reference ranking losses use raw dot products of the (already normalised) embeddings."""
    return DotProductSimilarity(normalize_embeddings=False)


def run_case(case_id, make_loss, dtype, fine_only=False):
    """Run ``make_loss(labels_2d)`` on a golden case; assert loss and gradient within TOL[dtype]."""
    golden = load_golden("ranking_golden")
    case = next(c for c in golden["loss_cases"] if c["id"] == case_id)
    inp = golden["inputs"][case_id.split("/")[0]]
    res = case["results"]["float64" if dtype == torch.float64 else "float32"]
    emb = torch.tensor(inp["embeddings"], dtype=dtype, requires_grad=True)
    labels = torch.tensor(inp["labels"])
    kwargs = {}
    if "ref_embeddings" in inp:
        kwargs = dict(
            ref_emb=torch.tensor(inp["ref_embeddings"], dtype=dtype), ref_labels=torch.tensor(inp["ref_labels"])
        )
    loss_fn = make_loss(labels).to(dtype)
    for module in loss_fn.modules():
        if hasattr(module, "proxies") and "proxies" in inp:
            module.proxies.data = torch.tensor(inp["proxies"], dtype=dtype)
    if fine_only:
        labels = labels[:, 0]
        if kwargs:
            kwargs["ref_labels"] = kwargs["ref_labels"][:, 0]
    loss = loss_fn(emb, labels, **kwargs)
    loss.backward()
    assert abs(loss.item() - res["loss"]) <= TOL[dtype], (loss.item(), res["loss"])
    torch.testing.assert_close(emb.grad, torch.tensor(res["grad_embeddings"], dtype=dtype), rtol=0, atol=TOL[dtype])


def batch(seed, n=24, d=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=1)
    fine = torch.randint(0, len(TABLE), (n,), generator=g)
    return emb, fine


class NoReduce(torch.nn.Module):
    """A reducer returning the per-query losses (PML reducers reduce; this one keeps them for inspection)."""

    def forward(self, loss_dict, embeddings, labels):
        (entry,) = loss_dict.values()
        return entry["losses"]
