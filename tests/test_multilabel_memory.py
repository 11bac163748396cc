"""Multi-label (``(B, M)`` fine-label sets padded with ``-1``) through the cross-batch memories and the distributed
wrapper: ``RankingMemory``, ``memory.CrossBatchMemory``, ``DistributedRankLoss`` / ``gather_batch`` (2-process gloo
run in tests/_distributed_worker.py ``--multilabel``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _helpers import launch_workers

from pml_suprank import losses
from pml_suprank.collectives import gather_batch, pad_label_sets
from pml_suprank.losses import DistributedRankLoss
from pml_suprank.losses.distributed_rank_loss import is_multilabel_loss, pairs_without_self
from pml_suprank.memory import CrossBatchMemory, RankingMemory

WORKER = Path(__file__).parent / "_distributed_worker.py"
TABLE = torch.tensor([[0, 0], [1, 0], [2, 1], [3, 1]])
D = 8


def _loss():
    return losses.SupHAPLoss(hierarchy=TABLE, relevance="multilabel")


def _batch(step: int, n: int = 8, width: int = 2):
    g = torch.Generator().manual_seed(10 + step)
    emb = F.normalize(torch.randn(n, D, generator=g, dtype=torch.float64), dim=1).requires_grad_(True)
    sets = torch.randint(0, 4, (n, width), generator=g)
    sets[torch.rand(n, width, generator=g) < 0.4] = -1
    sets[:, 0] = (torch.arange(n) + step) % 4
    return emb, sets


def test_multilabel_mode_is_the_loss_attribute_not_the_shape():
    assert is_multilabel_loss(_loss())
    happier = losses.HAPPIERLoss(num_classes=4, embedding_size=D, hierarchy=TABLE, relevance="multilabel")
    assert is_multilabel_loss(happier)
    assert not is_multilabel_loss(losses.SupHAPLoss(hierarchy=TABLE))
    assert not is_multilabel_loss(losses.SupAPLoss())
    # a hierarchical memory keeps refusing 2-D labels of another width (levels are never padded)
    mem = RankingMemory(losses.SupHAPLoss(), D, 16, dtype=torch.float64)
    emb, _ = _batch(0)
    fine = torch.arange(8) % 4
    mem(emb, torch.stack([fine, fine // 2], 1))
    with pytest.raises(ValueError, match=r"labels must have shape \(B, 2\)"):
        mem(emb, torch.stack([fine, fine // 2, fine * 0], 1))


def test_pad_label_sets():
    assert torch.equal(pad_label_sets(torch.tensor([1, 2]), 3), torch.tensor([[1, -1, -1], [2, -1, -1]]))
    same = torch.tensor([[1, 2]])
    assert pad_label_sets(same, 2) is same
    with pytest.raises(ValueError, match="labels has 2 label columns, more than the 1 columns"):
        pad_label_sets(same, 1)


def test_memory_of_one_batch_equals_in_batch_loss():
    emb, labels = _batch(0)
    expected = _loss()(emb, labels)
    mem = RankingMemory(_loss(), D, 8, dtype=torch.float64)
    mem(emb, labels)
    torch.testing.assert_close(mem.last_losses["memory"], expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(mem.last_losses["batch"], expected.detach(), rtol=0, atol=0)
    xbm = CrossBatchMemory(_loss(), D, memory_size=8)
    torch.testing.assert_close(xbm(emb, labels), expected, rtol=0, atol=1e-12)


def _manual_memory_losses(widths, size):
    """The memory term of each step computed by hand: all batches so far, padded, last ``size`` rows."""
    out, past_emb, past_labels = [], [], []
    for step, width in enumerate(widths):
        emb, labels = _batch(step, width=width)
        past_emb.append(emb.detach())
        past_labels.append(labels)
        w = max(x.shape[1] for x in past_labels)
        ref = torch.cat(past_emb)[-size:]
        ref_labels = torch.cat([pad_label_sets(x, w) for x in past_labels])[-size:]
        self_index = torch.arange(ref.shape[0] - emb.shape[0], ref.shape[0])
        q_labels = pad_label_sets(labels, w)
        pairs = pairs_without_self(q_labels, ref_labels, self_index)
        out.append(_loss()(emb, q_labels, pairs, ref, ref_labels).detach())
    return out, ref_labels


@pytest.mark.parametrize("wrapper", ["ranking_memory", "cross_batch_memory"])
def test_fifo_memory_over_three_steps_equals_manual_concatenation(wrapper):
    widths, size = (2, 3, 1), 20  # the memory grows to width 3, then pads a width-1 batch; step 3 wraps around
    expected, last_ref_labels = _manual_memory_losses(widths, size)
    if wrapper == "ranking_memory":
        mem = RankingMemory(_loss(), D, size, dtype=torch.float64)
    else:
        mem = CrossBatchMemory(_loss(), D, memory_size=size)
    for step, width in enumerate(widths):
        emb, labels = _batch(step, width=width)
        value = mem(emb, labels)
        got = mem.last_losses["memory"] if wrapper == "ranking_memory" else value.detach()
        torch.testing.assert_close(got, expected[step], rtol=0, atol=1e-12)
    stored = mem.labels if wrapper == "ranking_memory" else mem.label_memory
    assert stored.shape == (size, 3)
    # ring order: rows 16..19 then 0..3 hold the last 4 + 0 rows of step 2 and 3; compare as multisets of rows
    assert sorted(map(tuple, stored.tolist())) == sorted(map(tuple, last_ref_labels.tolist()))


def test_narrower_batches_are_padded_and_wider_grow_the_memory():
    mem = RankingMemory(_loss(), D, 16, dtype=torch.float64)
    _, wide = _batch(0, width=3)
    _, narrow = _batch(1, width=1)
    mem.enqueue(torch.zeros(8, D), narrow)
    assert mem.labels.shape == (16, 1)
    mem.enqueue(torch.zeros(8, D), wide)  # grows: the stored width-1 sets get -1 columns
    assert mem.labels.shape == (16, 3)
    assert torch.equal(mem.labels[:8], pad_label_sets(narrow, 3))
    assert torch.equal(mem.labels[8:], wide)
    mem.enqueue(torch.zeros(8, D), narrow[:, 0])  # 1-D fine labels = sets of one label
    assert torch.equal(mem.labels[:8], pad_label_sets(narrow, 3))
    fresh_memory = RankingMemory(_loss(), D, 16, dtype=torch.float64)
    fresh_memory.load_state_dict(mem.state_dict())  # the (16, 3) sets and the queue position are restored
    assert torch.equal(fresh_memory.labels, mem.labels) and int(fresh_memory.ptr) == int(mem.ptr)
    # CrossBatchMemory pads the same way
    xbm = CrossBatchMemory(_loss(), D, memory_size=16)
    xbm(*_batch(0, width=3))
    emb, labels = _batch(1, width=1)
    xbm(emb, labels)
    assert torch.equal(xbm.label_memory[8:], pad_label_sets(labels, 3))
    state = xbm.state_dict()
    fresh = CrossBatchMemory(_loss(), D, memory_size=16)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.label_memory, xbm.label_memory)


def test_fixed_width_memory_refuses_wider_sets():
    mem = RankingMemory(_loss(), D, 16, label_levels=2, dtype=torch.float64)
    emb, labels = _batch(0, width=3)
    with pytest.raises(ValueError, match=r"labels has 3 label columns.*label_levels=2"):
        mem(emb, labels)
    mem(*_batch(0, width=1))  # narrower: padded
    assert mem.labels.shape == (16, 2) and bool((mem.labels[:8, 1] == -1).all())


def test_distributed_wrappers_without_process_group():
    emb, labels = _batch(0)
    loss_fn = _loss()
    torch.testing.assert_close(DistributedRankLoss(loss_fn)(emb, labels), loss_fn(emb, labels), rtol=0, atol=0)
    batch = gather_batch(emb, labels, multilabel=True)
    assert batch.labels is labels


def _launch(out: Path) -> tuple[list[int], list[str]]:
    return launch_workers(out, 2, ["--multilabel"])


@pytest.mark.slow
@pytest.mark.distributed
def test_two_process_gloo_multilabel_equals_single_process(tmp_path):
    """Sup-H-AP / HAPPIER multi-label with label sets of width 2 on rank 0 and 3 on rank 1: DistributedRankLoss and
    RankingMemory equal the single process on the concatenated (padded) batch (loss, DDP gradient, memory)."""
    out = tmp_path / "result.json"
    for _attempt in range(2):  # gloo start-up occasionally aborts on a loaded machine
        codes, logs = _launch(out)
        if codes == [0, 0] and out.exists():
            break
    assert codes == [0, 0] and out.exists(), "\n".join(logs)[-4000:]
    results = json.loads(out.read_text())
    assert results.pop("gather_batch_multilabel") == 0.0
    errors = {k: v["error"] for k, v in results.items() if "error" in v}
    assert not errors, errors
    for name in ("SupHAP_multilabel", "HAPPIER_multilabel"):
        for key in ("local_queries/8-8", "local_queries/6-10", "all/6-10", "memory/8-8"):
            assert f"{name}/{key}" in results
    worst = {k: max(v.values()) for k, v in results.items()}
    assert max(worst.values()) <= 1e-6, {k: v for k, v in worst.items() if v > 1e-6}


def test_every_multilabel_loss_is_recognised_and_runs_in_the_memory():
    from pml_suprank import losses
    from pml_suprank.memory import RankingMemory

    hierarchy = torch.tensor([[0, 0], [1, 0], [2, 1], [3, 1]])
    multi = [
        losses.SupHAPLoss(hierarchy=hierarchy, relevance="multilabel"),
        losses.SupNDCGLoss(hierarchy=hierarchy, relevance="multilabel"),
        losses.SupAPLoss(multilabel="per_label"),
        losses.ROADMAPLoss(multilabel="per_label"),
    ]
    assert all(is_multilabel_loss(loss) for loss in multi)
    assert not any(is_multilabel_loss(loss) for loss in (losses.SupAPLoss(), losses.ROADMAPLoss(), losses.SupHAPLoss()))
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([[0, 2], [1, -1], [3, -1], [0, 1], [2, 3], [1, 2], [0, -1], [3, 2]])
    for loss in multi:
        memory = RankingMemory(loss, embedding_size=8, memory_size=16)
        for _ in range(2):
            emb = torch.nn.functional.normalize(torch.randn(8, 8, generator=g), dim=-1).requires_grad_()
            value = memory(emb, labels[:, :1] if isinstance(loss, losses.SupAPLoss) and _ == 0 else labels)
            assert torch.isfinite(value)
            value.backward()
        # PML's wrapper too: a narrower first batch, then wider sets grow its label memory
        xbm = CrossBatchMemory(loss, embedding_size=8, memory_size=16)
        for width in (1, 2):
            emb = torch.nn.functional.normalize(torch.randn(8, 8, generator=g), dim=-1).requires_grad_()
            value = xbm(emb, labels[:, :width])
            assert torch.isfinite(value)
            value.backward()
        assert xbm.label_memory.shape == (16, 2), type(loss).__name__
