"""Decomposability gap (SupRank Eq. 6)."""

from __future__ import annotations

import pytest
import torch

from pml_suprank.metrics import RetrievalEvaluator, decomposability_gap


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    fine = torch.randint(0, 8, (n,), generator=g)
    emb = torch.randn(n, 6, generator=g) + torch.nn.functional.one_hot(fine % 6, 6).float()
    return torch.nn.functional.normalize(emb, dim=1), torch.stack([fine, fine // 4], 1)


def test_single_batch_has_zero_gap():
    emb, labels = _data()
    out = decomposability_gap(emb, labels, batch_size=len(emb), metric="h_ap")
    assert out["gap"] == pytest.approx(0.0, abs=1e-12) and out["num_batches"] == 1


def test_matches_a_manual_computation_and_is_seeded():
    emb, labels = _data(seed=1)
    out = decomposability_gap(emb, labels, 16, "ap", generator=torch.Generator().manual_seed(3))
    perm = torch.randperm(len(emb), generator=torch.Generator().manual_seed(3))
    ev = RetrievalEvaluator()
    vals = [ev.evaluate(emb[perm[i : i + 16]], labels[perm[i : i + 16]])["ap"] for i in range(0, 64, 16)]
    vals = [v for v in vals if v == v]
    assert out["batch_mean"] == pytest.approx(sum(vals) / len(vals), abs=1e-12)
    assert out["gap"] == pytest.approx(out["batch_mean"] - ev.evaluate(emb, labels)["ap"], abs=1e-12)
    again = decomposability_gap(emb, labels, 16, "ap", generator=torch.Generator().manual_seed(3))
    assert again == out
    # small batches see fewer negatives: the batch AP is optimistic on this data
    assert out["gap"] > 0


def test_errors():
    emb, labels = _data()
    with pytest.raises(ValueError, match="batch_size"):
        decomposability_gap(emb, labels, 1)
    with pytest.raises(ValueError, match="unknown metric"):
        decomposability_gap(emb, labels, 8, metric="auc")
    with pytest.raises(ValueError, match="num_repeats"):
        decomposability_gap(emb, labels, 8, num_repeats=0)
