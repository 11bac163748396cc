"""RetrievalMetric equals RetrievalEvaluator.evaluate on the concatenated data: in one process (any batching, with
and without dataset indices, after reset) and across 2 gloo processes (tests/metrics/_retrieval_metric_worker.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import free_port

from pml_suprank.metrics import RetrievalEvaluator, RetrievalMetric

WORKER = Path(__file__).parent / "_retrieval_metric_worker.py"
ROOT = Path(__file__).resolve().parents[2]


def _data(n=30, seed=0, two_levels=True):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randint(-1, 2, (n, 4), generator=g).float()  # ties on purpose
    fine = torch.randint(0, 5, (n,), generator=g)
    return emb, (torch.stack([fine, fine // 2], 1) if two_levels else fine)


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = float(a[key]), float(b[key])
        assert (math.isnan(x) and math.isnan(y)) or x == y, (key, x, y)


@pytest.mark.parametrize("batch", [1, 7, 30])
@pytest.mark.parametrize("two_levels", [False, True])
def test_streaming_equals_one_shot(batch, two_levels):
    emb, labels = _data(two_levels=two_levels)
    metric = RetrievalMetric(k_values=(1, 5))
    for s in range(0, 30, batch):
        metric.update(emb[s : s + batch], labels[s : s + batch])
    assert len(metric) == 30
    _assert_same(metric.compute(), RetrievalEvaluator(k_values=(1, 5)).evaluate(emb, labels))


def test_hand_computed_average_precision():
    # 1-D: items 0, 1 of class 0 and item 2 of class 1; scores q0: item1 = 0.8 > item2 = 0.6 -> AP 1
    # q1: item0 = 0.8 > item2 = 0.0 -> AP 1; q2 has no positive (excluded and counted)
    emb = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.6, -0.8]])
    metric = RetrievalMetric(k_values=(1,))
    metric.update(emb[:2], torch.tensor([0, 0]))
    metric.update(emb[2:], torch.tensor([1]))
    out = metric.compute()
    assert out["ap"] == 1.0 and out["num_queries_without_positives"] == 1
    # now make item 2 outrank the positive for q0: AP of q0 = 1/2
    metric.reset()
    metric.update(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]]), torch.tensor([0, 0, 1]))
    assert metric.compute()["ap"] == pytest.approx((0.5 + 0.5) / 2)


def test_indices_drop_duplicates_and_order_by_index():
    emb, labels = _data()
    metric = RetrievalMetric(k_values=(1,))
    order = torch.randperm(30, generator=torch.Generator().manual_seed(1))
    metric.update(emb[order[:20]], labels[order[:20]], indices=order[:20])
    metric.update(emb[order[20:]], labels[order[20:]], indices=order[20:])
    metric.update(emb[:3], labels[:3], indices=torch.arange(3))  # padding copies
    _assert_same(metric.compute(), RetrievalEvaluator(k_values=(1,)).evaluate(emb, labels))


def test_evaluator_passthrough_and_per_query():
    emb, labels = _data()
    evaluator = RetrievalEvaluator(k_values=(2,), metrics=("ap",))
    metric = RetrievalMetric(evaluator)
    metric.update(emb, labels)
    out = metric.compute(return_per_query=True)
    ref = evaluator.evaluate(emb, labels, return_per_query=True)
    torch.testing.assert_close(out["per_query"]["ap"], ref["per_query"]["ap"], equal_nan=True, rtol=0, atol=0)


def test_errors():
    metric = RetrievalMetric()
    with pytest.raises(ValueError, match=r"compute\(\) called before any update\(\)"):
        metric.compute()
    metric.update(torch.randn(4, 3), torch.arange(4))
    with pytest.raises(ValueError, match="embeddings must have width 3"):
        metric.update(torch.randn(4, 2), torch.arange(4))
    with pytest.raises(ValueError, match=r"labels must have shape \(B,\) like the earlier updates; got \(4, 2\)"):
        metric.update(torch.randn(4, 3), torch.zeros(4, 2, dtype=torch.long))
    two_levels = RetrievalMetric()
    two_levels.update(torch.randn(4, 3), torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must have shape \(B, 2\) like the earlier updates; got \(4,\)"):
        two_levels.update(torch.randn(4, 3), torch.arange(4))
    with pytest.raises(ValueError, match="indices must be given in every update or in none"):
        metric.update(torch.randn(4, 3), torch.arange(4), indices=torch.arange(4))
    with pytest.raises(ValueError, match="embeddings contains NaN"):
        metric.update(torch.full((2, 3), float("nan")), torch.arange(2))
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        metric.update(torch.randn(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="either evaluator or evaluator kwargs"):
        RetrievalMetric(RetrievalEvaluator(), k_values=(1,))
    with pytest.raises(ValueError, match="k_values must be positive ints"):
        RetrievalMetric(k_values=(0,))
    fresh = RetrievalMetric()
    with pytest.raises(TypeError, match="indices must be an integer Tensor"):
        fresh.update(torch.randn(2, 3), torch.arange(2), indices=torch.zeros(2))


def test_metric_on_each_device(device):
    emb, labels = _data()
    metric = RetrievalMetric(k_values=(1, 5))
    metric.update(emb[:11].to(device), labels[:11].to(device))
    metric.update(emb[11:].to(device), labels[11:].to(device))
    _assert_same(metric.compute(), RetrievalEvaluator(k_values=(1, 5)).evaluate(emb.to(device), labels.to(device)))


@pytest.mark.slow
def test_two_gloo_processes_equal_the_one_shot_evaluator(tmp_path):
    out = tmp_path / "metric.json"
    port = free_port()
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    procs = []
    for rank in range(2):
        cmd = [sys.executable, str(WORKER), "--out", str(out), "--rank", str(rank), "--world-size", "2"]
        procs.append(subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, cwd=ROOT, env={**_base_env(), **env}))  # fmt: skip
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
    got = ranks[0]

    sys.path.insert(0, str(WORKER.parent))
    try:
        from _retrieval_metric_worker import global_data, split_cases
    finally:
        sys.path.remove(str(WORKER.parent))
    emb, labels = global_data()
    # the evaluator's query split: both processes return the one-process result (counts equal, floats to 1e-12,
    # per query too), and the two processes ranked disjoint shares that cover every query once
    for name, (init, call, kwargs) in split_cases(emb, labels).items():
        one = RetrievalEvaluator(k_values=(1, 4), **init).evaluate(*call, return_per_query=True, **kwargs)
        per_query = one.pop("per_query")
        for r in range(2):
            summary, rows = ranks[r]["split"][name]["summary"], ranks[r]["split"][name]["per_query"]
            assert summary.keys() == one.keys() and rows.keys() == per_query.keys(), name
            for key, value in one.items():
                if isinstance(value, int):
                    assert summary[key] == value, (name, key)
                else:
                    assert summary[key] == pytest.approx(value, abs=1e-12, nan_ok=True), (name, key)
            for key, values in per_query.items():
                torch.testing.assert_close(torch.tensor(rows[key], dtype=torch.float64), values, rtol=0, atol=1e-12,
                                           equal_nan=True, msg=f"{name} {key}")  # fmt: skip
        if not init.get("multilabel") and name != "one_query":
            assert ranks[0]["ranked_rows"][name] + ranks[1]["ranked_rows"][name] == len(call[0]), name
            assert min(ranks[0]["ranked_rows"][name], ranks[1]["ranked_rows"][name]) > 0, name
    for r in range(2):
        assert "reference has 10 rows for 40 queries" in ranks[r]["refused"], ranks[r]["refused"]
    from pml_suprank.search import RetrievalIndex

    scores, indices = RetrievalIndex(emb.float()).search(emb.float(), 5)
    for r in range(2):
        assert ranks[r]["split"]["search"] == {"scores": scores.tolist(), "indices": indices.tolist()}
    evaluator = RetrievalEvaluator(k_values=(1, 4))
    _assert_same(got["plain"], evaluator.evaluate(emb, labels))
    _assert_same(got["padded"], evaluator.evaluate(emb, labels))
    _assert_same(got["one_empty"], evaluator.evaluate(emb[:30], labels[:30]))
    _assert_same(got["local"], evaluator.evaluate(emb[:23], labels[:23]))
    assert got["local_items"] == 23


def _base_env() -> dict:
    import os

    return dict(os.environ)  # noqa: TID251 - subprocess environment of the test
