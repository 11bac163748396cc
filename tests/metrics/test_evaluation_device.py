"""Where and by whom the evaluator ranks: ``evaluate(device=...)`` gives the metrics of the CPU on every device
(counts identical, floats to 1e-9) without changing the evaluator, and ``distributed=True`` without a process group
is the one-process evaluation. The 2-process split is checked in tests/metrics/test_retrieval_metric.py."""

from __future__ import annotations

import math

import pytest
import torch

from pml_suprank.metrics import RetrievalEvaluator


def _data(n=90, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)
    fine = torch.randint(0, 9, (n,), generator=g)
    return emb, torch.stack([fine, fine // 3], 1)


def _assert_close(got: dict, want: dict, tol: float) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, int):
            assert got[key] == value, key
        else:
            assert math.isclose(got[key], value, abs_tol=tol) or (math.isnan(got[key]) and math.isnan(value)), key


@pytest.mark.parametrize("chunk_size", [None, 7])
def test_per_call_device_gives_the_cpu_metrics(device, chunk_size):
    emb, labels = _data()
    evaluator = RetrievalEvaluator(k_values=(1, 5), chunk_size=chunk_size)
    cpu = evaluator.evaluate(emb, labels)
    got = evaluator.evaluate(emb, labels, device=device)
    _assert_close(got, cpu, 1e-9)
    assert evaluator.device is None  # the call's device does not stick
    gallery = evaluator.evaluate(emb[:30], labels[:30], emb[30:], labels[30:], device=device)
    _assert_close(gallery, evaluator.evaluate(emb[:30], labels[:30], emb[30:], labels[30:]), 1e-9)


def test_per_call_device_reaches_the_ranking():
    emb, labels = _data(n=20)
    seen = []

    class Recording(RetrievalEvaluator):
        def _per_query(self, *args):
            seen.append(self.device)
            return super()._per_query(*args)

    Recording(device="cpu").evaluate(emb, labels)
    Recording().evaluate(emb, labels, device=torch.device("cpu"))
    Recording().evaluate(emb, labels)
    assert seen == [torch.device("cpu"), torch.device("cpu"), None]
    with pytest.raises(ValueError, match="device"):
        RetrievalEvaluator().evaluate(emb, labels, device="no-such-device")


def test_distributed_without_a_process_group_is_one_process():
    emb, labels = _data()
    evaluator = RetrievalEvaluator(k_values=(1, 5))
    want = evaluator.evaluate(emb, labels, return_per_query=True)
    got = evaluator.evaluate(emb, labels, return_per_query=True, distributed=True)
    for key in want["per_query"]:
        torch.testing.assert_close(got["per_query"][key], want["per_query"][key], rtol=0, atol=0, equal_nan=True)
    with pytest.raises(TypeError, match="distributed must be a bool"):
        evaluator.evaluate(emb, labels, distributed="yes")


def test_a_process_group_that_is_not_one_is_refused_by_name():
    from pml_suprank.search import RetrievalIndex

    x, y = torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 3
    with pytest.raises(TypeError, match="process_group must be None or a torch.distributed process group; got int"):
        RetrievalEvaluator().evaluate(x, y, process_group=3)
    with pytest.raises(TypeError, match="process_group .* got str"):
        RetrievalIndex(x).search(x, 2, distributed=True, process_group="world")


@pytest.mark.parametrize("counting", ["auto", "dense"])
def test_a_gallery_over_the_memory_budget_is_streamed_in_blocks_with_the_same_metrics(monkeypatch, counting):
    from pml_suprank.metrics import eval_blocks

    emb, labels = _data(n=300, d=16)
    emb[5] = emb[7]  # exact ties across blocks
    evaluator = RetrievalEvaluator(k_values=(1, 5), counting=counting)
    args = [(emb, labels), (emb[:100], labels[:100], emb[100:], labels[100:])]
    whole = [evaluator.evaluate(*a, return_per_query=True, device="cpu") for a in args]
    blocks = []
    scores = eval_blocks.GalleryBlocks._scores

    def recorded(self, rows):
        out = scores(self, rows)
        blocks.append(out.shape)
        return out

    monkeypatch.setattr(eval_blocks.GalleryBlocks, "_scores", recorded)
    monkeypatch.setattr(eval_blocks, "CPU_CHUNK_BYTES", 2**12)  # a device too small for one whole row block
    assert eval_blocks.block_shape(300, 60, torch.device("cpu"), 2) == (16, 16)
    streamed = [evaluator.evaluate(*a, return_per_query=True, device="cpu") for a in args]
    assert blocks and max(c for _, c in blocks) == 16 and max(r for r, _ in blocks) == 16
    for got, want in zip(streamed, whole):
        _assert_close({k: v for k, v in got.items() if k != "per_query"},
                      {k: v for k, v in want.items() if k != "per_query"}, 1e-12)  # fmt: skip
        for key, value in want["per_query"].items():
            torch.testing.assert_close(got["per_query"][key], value, rtol=0, atol=1e-12, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_host_gallery_larger_than_the_cuda_budget_stays_on_the_host(monkeypatch):
    from pml_suprank.metrics import eval_blocks

    g = torch.Generator().manual_seed(0)
    emb = torch.randint(-4, 5, (20_000, 64), generator=g).float()  # exact dot products on every device
    fine = torch.randint(0, 1000, (20_000,), generator=g)
    labels = torch.stack([fine, fine // 10], 1)
    evaluator = RetrievalEvaluator(k_values=(1, 10))
    want = evaluator.evaluate(emb[:2000], labels[:2000], emb, labels, ref_includes_query=True)
    monkeypatch.setattr(eval_blocks, "device_budget", lambda device: 2**21)  # 2 MiB of a 5 MB gallery
    torch.cuda.reset_peak_memory_stats()
    got = evaluator.evaluate(emb[:2000], labels[:2000], emb, labels, ref_includes_query=True, device="cuda")
    assert torch.cuda.max_memory_allocated() < emb.numel() * 4  # the gallery never was on the device whole
    _assert_close(got, want, 1e-9)
