"""RetrievalTorchMetric: a torchmetrics.Metric giving exactly RetrievalEvaluator's numbers on the concatenated data,
usable in a MetricCollection, with padding copies (repeated indices) kept once."""

from __future__ import annotations

import pytest
import torch

torchmetrics = pytest.importorskip("torchmetrics")

from pml_suprank.metrics import RetrievalEvaluator  # noqa: E402
from pml_suprank.metrics.torchmetric import RetrievalTorchMetric  # noqa: E402


def _data(n=36, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, 6, generator=g), dim=1)
    labels = torch.stack([torch.arange(n) % 6, torch.arange(n) % 6 // 3], 1)
    return emb, labels


def test_streamed_batches_give_the_evaluators_numbers():
    emb, labels = _data()
    metric = RetrievalTorchMetric(k_values=(1, 5))
    assert isinstance(metric, torchmetrics.Metric)
    for start in range(0, 36, 10):
        metric.update(emb[start : start + 10], labels[start : start + 10])
    got = metric.compute()
    want = RetrievalEvaluator(k_values=(1, 5)).evaluate(emb, labels)
    assert set(got) == set(want)
    for key, value in want.items():
        assert float(got[key]) == pytest.approx(float(value), rel=1e-12), key
    metric.reset()
    with pytest.raises(ValueError, match="before any update"):
        metric.compute()


def test_repeated_indices_are_kept_once_and_collections_work():
    emb, labels = _data()
    padded = RetrievalTorchMetric(metrics=["ap", "h_ap"])
    padded.update(emb, labels, torch.arange(36))
    padded.update(emb[:4], labels[:4], torch.arange(4))  # a sampler's padding: the same items again
    want = RetrievalEvaluator(metrics=["ap", "h_ap"]).evaluate(emb, labels)
    assert float(padded.compute()["ap"]) == pytest.approx(want["ap"], rel=1e-12)
    collection = torchmetrics.MetricCollection({"retrieval": RetrievalTorchMetric(metrics=["ap"])})
    collection.update(emb, labels)
    assert float(collection.compute()["ap"]) == pytest.approx(want["ap"], rel=1e-12)  # a dict result is flattened


def test_bad_updates_name_the_argument():
    emb, labels = _data()
    metric = RetrievalTorchMetric()
    metric.update(emb[:6], labels[:6])
    with pytest.raises(ValueError, match="embeddings must have width 6"):
        metric.update(torch.randn(3, 5), labels[:3])
    with pytest.raises(ValueError, match="indices must be given in every update or in none"):
        metric.update(emb[:3], labels[:3], torch.arange(3))
    with pytest.raises(ValueError, match="embeddings"):
        metric.update(torch.full((2, 6), float("nan")), labels[:2])
    with pytest.raises(TypeError, match="evaluator must be a RetrievalEvaluator"):
        RetrievalTorchMetric(evaluator="ap")
