"""Tests of pml_suprank/memory.py (RankingMemory): golden XBM case, semantics, resume, full memory, bad input."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from conftest import load_golden
from pytorch_metric_learning.distances import DotProductSimilarity
from pytorch_metric_learning.losses import ContrastiveLoss, CrossBatchMemory

from pml_suprank import losses
from pml_suprank.memory import RankingMemory

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _batch(b, d=8, classes=4, seed=0, levels=None, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=1)
    fine = torch.arange(b) % classes
    if levels is None:
        return emb, fine
    return emb, torch.stack([fine, fine // 2], 1)


def _flat_loss(include_self=False):
    return losses.SupAPLoss(include_self=include_self)


# ------------------------------------------------------------------------------------------------ golden
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_golden_batch_plus_memory(dtype):
    """D_b8_mem32_L2/SupAP_sop_batch_plus_memory: (L(ref=batch) + L(ref=memory)) / 2, XBM enqueue-then-get."""
    golden = load_golden("ranking_golden")
    case = next(c for c in golden["loss_cases"] if c["id"] == "D_b8_mem32_L2/SupAP_sop_batch_plus_memory")
    inp = golden["inputs"][case["input"]]
    res = case["results"]["float64" if dtype == torch.float64 else "float32"]
    emb = torch.tensor(inp["embeddings"], dtype=dtype, requires_grad=True)
    labels = torch.tensor(inp["labels"])[:, 0]
    older = torch.tensor(inp["ref_embeddings"], dtype=dtype)[:24]
    older_labels = torch.tensor(inp["ref_labels"])[:24, 0]
    kw = case["constructor_kwargs"]["SupAP"]
    loss_fn = losses.SupAPLoss(
        tau=kw["tau"],
        rho=kw["rho"],
        delta=kw["delta"],
        start=kw["start"],
        offset=kw["offset"],
        include_self=True,
        distance=DotProductSimilarity(normalize_embeddings=False),  # the reference uses raw dot products
    )
    memory = RankingMemory(loss_fn, embedding_size=8, memory_size=32, dtype=dtype)
    memory.enqueue(older, older_labels)
    loss = memory(emb, labels)
    loss.backward()
    assert abs(loss.item() - res["loss"]) <= TOL[dtype]
    assert (emb.grad - torch.tensor(res["grad_embeddings"], dtype=dtype)).abs().max() <= TOL[dtype]
    # the memory now holds the reference's ref set: 24 older items, then a detached copy of the queries
    torch.testing.assert_close(memory.embeddings, torch.tensor(inp["ref_embeddings"], dtype=dtype), rtol=0, atol=0)
    assert memory.num_filled == 32 and int(memory.ptr) == 0


# ------------------------------------------------------------------------------------------------ semantics
@pytest.mark.parametrize("weights", [(1.0, 1.0), (3.0, 1.0), (0.0, 2.0)])
def test_combination_and_enqueue_then_get(weights):
    old, old_labels = _batch(12, seed=1)
    emb, labels = _batch(8, seed=2)
    emb.requires_grad_(True)
    loss_fn = losses.SupAPLoss(include_self=True)
    memory = RankingMemory(loss_fn, 8, 64, batch_weight=weights[0], memory_weight=weights[1], dtype=torch.float64)
    memory.enqueue(old, old_labels)
    got = memory(emb, labels)
    ref = torch.cat([old, emb.detach()])
    expected = (
        weights[0] * loss_fn(emb, labels)
        + weights[1] * loss_fn(emb, labels, None, ref, torch.cat([old_labels, labels]))
    ) / sum(weights)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    assert set(memory.last_losses) == ({"batch", "memory"} if weights[0] else {"memory"})


def test_query_copy_removed_without_include_self():
    """include_self=False: each query's own copy is removed from its memory reference set, nothing else."""
    old, old_labels = _batch(12, seed=3)
    emb, labels = _batch(8, seed=4)
    loss_fn = _flat_loss(include_self=False)
    memory = RankingMemory(loss_fn, 8, 20, batch_weight=0.0, dtype=torch.float64)
    memory.enqueue(old, old_labels)
    got = memory(emb, labels)
    ref, ref_labels = torch.cat([old, emb]), torch.cat([old_labels, labels])
    per_query = []
    for q in range(8):
        keep = torch.arange(20) != 12 + q
        per_query.append(loss_fn(emb[q : q + 1], labels[q : q + 1], None, ref[keep], ref_labels[keep]))
    torch.testing.assert_close(got, torch.stack(per_query).mean(), rtol=0, atol=1e-12)
    with_self = losses.SupAPLoss(include_self=True)(emb, labels, None, ref, ref_labels)
    assert not torch.isclose(got, with_self)


def test_matches_pml_cross_batch_memory_for_a_pair_loss():
    """Memory term only + ContrastiveLoss == PML's CrossBatchMemory step by step (same self-pair removal)."""
    ours = RankingMemory(ContrastiveLoss(), 8, 24, batch_weight=0.0)
    pml = CrossBatchMemory(ContrastiveLoss(), 8, memory_size=24)
    for step in range(5):
        emb, labels = _batch(8, seed=10 + step, dtype=torch.float32)
        torch.testing.assert_close(ours(emb, labels), pml(emb, labels), rtol=1e-6, atol=1e-7)


def test_warmup_uses_batch_loss_and_does_not_fill():
    loss_fn = _flat_loss()
    memory = RankingMemory(loss_fn, 8, 32, warmup_steps=2, dtype=torch.float64)
    for step in range(2):
        emb, labels = _batch(8, seed=step)
        assert not memory.is_active
        torch.testing.assert_close(memory(emb, labels), loss_fn(emb, labels), rtol=0, atol=0)
        assert memory.num_filled == 0
    assert memory.is_active
    emb, labels = _batch(8, seed=5)
    out = memory(emb, labels)
    assert memory.num_filled == 8
    # the memory holds only the batch's copy, minus each query's own: the memory term equals the in-batch loss
    assert set(memory.last_losses) == {"batch", "memory"}
    torch.testing.assert_close(out, loss_fn(emb, labels), rtol=0, atol=1e-12)
    out = memory(*_batch(8, seed=6))
    terms = memory.last_losses
    assert memory.num_filled == 16 and abs(float(terms["memory"] - terms["batch"])) > 1e-6


def test_eval_mode_reads_without_writing():
    memory = RankingMemory(_flat_loss(), 8, 32, dtype=torch.float64)
    memory(*_batch(8, seed=0))
    before = memory.state_dict()
    memory.eval()
    out = memory(*_batch(8, seed=1))
    assert torch.isfinite(out)
    after = memory.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_fifo_wraps_around_and_keeps_the_tail_of_a_large_batch():
    memory = RankingMemory(_flat_loss(), 8, 10, dtype=torch.float64)
    batches = [_batch(4, seed=s) for s in range(3)]
    for emb, labels in batches:
        memory.enqueue(emb, labels)
    assert int(memory.ptr) == 2 and memory.num_filled == 10
    torch.testing.assert_close(memory.embeddings[:2], batches[2][0][2:], rtol=0, atol=0)
    torch.testing.assert_close(memory.embeddings[2:4], batches[0][0][2:], rtol=0, atol=0)
    torch.testing.assert_close(memory.embeddings[8:10], batches[2][0][:2], rtol=0, atol=0)
    big, big_labels = _batch(13, seed=9)
    slots = memory.enqueue(big, big_labels)
    assert (slots[:3] == -1).all() and int(memory.ptr) == (2 + 13) % 10
    assert sorted(slots[3:].tolist()) == list(range(10))
    torch.testing.assert_close(memory.embeddings[slots[3:]], big[3:], rtol=0, atol=0)


def test_memory_larger_than_the_dataset():
    """A queue larger than the dataset holds several (stale) copies of the same images; all of them are used."""
    data, labels = _batch(12, seed=0)
    memory = RankingMemory(_flat_loss(), 8, 40, dtype=torch.float64)
    for epoch in range(4):
        for start in (0, 6):
            emb = F.normalize(data[start : start + 6] + 0.01 * epoch, dim=1).requires_grad_(True)
            out = memory(emb, labels[start : start + 6])
            out.backward()
            assert torch.isfinite(out) and torch.isfinite(emb.grad).all()
    assert memory.num_filled == 40 and int(memory.ptr) == 48 % 40
    ref, ref_labels = memory.get()
    assert ref.shape == (40, 8) and torch.bincount(ref_labels).tolist() == [10, 10, 10, 10]


def test_full_memory_by_index():
    """mode='index': one slot per dataset index holding its latest embedding; the query's own slot is excluded."""
    n = 16
    data, labels = _batch(n, seed=0)
    loss_fn = _flat_loss()
    memory = RankingMemory(loss_fn, 8, n, mode="index", batch_weight=0.0, dtype=torch.float64)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    for k in range(0, n, 4):
        idx = order[k : k + 4]
        memory(data[idx], labels[idx], idx)
    assert memory.num_filled == n
    torch.testing.assert_close(memory.embeddings, data, rtol=0, atol=0)
    # a new view of images 0..3 replaces their slots, and each query does not see its own slot
    idx = torch.arange(4)
    new = F.normalize(data[idx] + 0.3, dim=1)
    got = memory(new, labels[idx], idx)
    torch.testing.assert_close(memory.embeddings[idx], new, rtol=0, atol=0)
    ref = memory.embeddings.clone()
    per_query = []
    for q in range(4):
        keep = torch.arange(n) != q
        per_query.append(loss_fn(new[q : q + 1], labels[q : q + 1], None, ref[keep], labels[keep]))
    torch.testing.assert_close(got, torch.stack(per_query).mean(), rtol=0, atol=1e-12)


def test_partially_filled_index_memory_maps_slots_to_rows():
    n = 20
    data, labels = _batch(n, seed=1)
    loss_fn = _flat_loss()
    memory = RankingMemory(loss_fn, 8, n, mode="index", batch_weight=0.0, dtype=torch.float64)
    memory.enqueue(
        data[[1, 5, 9, 13, 17, 2, 6]], labels[[1, 5, 9, 13, 17, 2, 6]], torch.tensor([1, 5, 9, 13, 17, 2, 6])
    )
    idx = torch.tensor([11, 3, 7, 15])
    got = memory(data[idx], labels[idx], idx)
    filled = torch.tensor(sorted([1, 5, 9, 13, 17, 2, 6, 11, 3, 7, 15]))
    per_query = []
    for i in idx.tolist():
        keep = filled[filled != i]
        per_query.append(loss_fn(data[i : i + 1], labels[i : i + 1], None, data[keep], labels[keep]))
    torch.testing.assert_close(got, torch.stack(per_query).mean(), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------ state
@pytest.mark.parametrize("mode", ["fifo", "index"])
@pytest.mark.parametrize("levels", [None, 2])
def test_state_dict_round_trip_is_bit_identical(mode, levels):
    def make():
        loss_fn = losses.SupAPLoss() if levels is None else losses.SupHAPLoss()
        return RankingMemory(loss_fn, 8, 20, warmup_steps=1, mode=mode)

    def steps(memory, seeds):
        out = []
        for s in seeds:
            emb, labels = _batch(8, seed=s, levels=levels, dtype=torch.float32)
            emb.requires_grad_(True)
            idx = torch.arange(8) + (s % 3) * 6  # overlapping dataset indices across steps
            loss = memory(emb, labels, idx)
            loss.backward()
            out.append((loss.detach(), emb.grad))
        return out

    a = make()
    steps(a, [0, 1, 2])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = make()
    b.load_state_dict(torch.load(buf))
    assert int(b.ptr) == int(a.ptr) and int(b.step) == int(a.step) and torch.equal(b.filled, a.filled)
    for (la, ga), (lb, gb) in zip(steps(a, [3, 4, 5]), steps(b, [3, 4, 5]), strict=True):
        assert torch.equal(la, lb) and torch.equal(ga, gb)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_two_dimensional_labels_are_stored_as_m_by_l():
    memory = RankingMemory(losses.SupAPLoss(), 8, 16, label_levels=2)
    assert memory.labels.shape == (16, 2)
    lazy = RankingMemory(losses.SupAPLoss(), 8, 16)
    emb, labels = _batch(4, levels=2, dtype=torch.float32)
    lazy.enqueue(emb, labels)
    assert lazy.labels.shape == (16, 2) and torch.equal(lazy.labels[:4], labels)
    with pytest.raises(ValueError, match="like the labels already in the memory"):
        lazy.enqueue(emb, labels[:, 0])


# ------------------------------------------------------------------------------------------------ every rank loss
RANK_LOSSES = {
    "SmoothAPLoss": lambda: losses.SmoothAPLoss(),
    "SupAPLoss": lambda: losses.SupAPLoss(),
    "SupAPLoss_include_self": lambda: losses.SupAPLoss(include_self=True),
    "ROADMAPLoss": lambda: losses.ROADMAPLoss(),
    "ROADMAPLoss_proxy": lambda: losses.ROADMAPLoss(decomposability="proxy", num_classes=4, embedding_size=8),
    "SupRecallLoss": lambda: losses.SupRecallLoss(),
    "RODRecallLoss": lambda: losses.RODRecallLoss(),
    "CalibrationLoss": lambda: losses.CalibrationLoss(),
    "SupHAPLoss": lambda: losses.SupHAPLoss(),
    "HAPPIERLoss": lambda: losses.HAPPIERLoss(num_classes=4, embedding_size=8),
    "SupNDCGLoss": lambda: losses.SupNDCGLoss(),
    "RODNDCGLoss": lambda: losses.RODNDCGLoss(num_classes=4, embedding_size=8),
}
HIERARCHICAL = {"SupHAPLoss", "HAPPIERLoss", "SupNDCGLoss", "RODNDCGLoss"}


@pytest.mark.parametrize("name", sorted(RANK_LOSSES))
def test_works_with_every_rank_loss(name):
    loss_fn = RANK_LOSSES[name]().double()
    levels = 2 if name.split("_")[0] in HIERARCHICAL else None
    memory = RankingMemory(loss_fn, 8, 24, dtype=torch.float64)
    for step in range(4):
        emb, labels = _batch(8, seed=step, levels=levels)
        emb.requires_grad_(True)
        out = memory(emb, labels)
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(emb.grad).all() and emb.grad.abs().sum() > 0
    if levels:
        assert memory.labels.shape == (24, 2)
    # the memory term is the loss against the memory with each query's own copy removed (or kept if include_self)
    old_emb, old_labels = memory.get()
    old_emb, old_labels = old_emb.clone(), old_labels.clone()
    memory.batch_weight = 0.0
    emb, labels = _batch(8, seed=99, levels=levels)
    got = memory(emb, labels)
    slots = (torch.arange(8) + 8) % 24  # ptr was 8 after 4 steps of 8 in 24 slots
    ref, ref_labels = old_emb.clone(), old_labels.clone()
    ref[slots], ref_labels[slots] = emb, labels
    from pml_suprank.losses.distributed_rank_loss import pairs_without_self

    pairs = None if getattr(loss_fn, "include_self", False) else pairs_without_self(labels, ref_labels, slots)
    torch.testing.assert_close(got, loss_fn(emb, labels, pairs, ref, ref_labels), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_input():
    with pytest.raises(TypeError, match="loss must be an nn.Module"):
        RankingMemory("SupAP", 8, 16)
    with pytest.raises(ValueError, match="memory_size must be an int >= 1"):
        RankingMemory(_flat_loss(), 8, 0)
    with pytest.raises(ValueError, match="mode must be one of"):
        RankingMemory(_flat_loss(), 8, 16, mode="lifo")
    with pytest.raises(ValueError, match="memory_weight must be > 0"):
        RankingMemory(_flat_loss(), 8, 16, memory_weight=0.0)
    memory = RankingMemory(_flat_loss(), 8, 16)
    emb, labels = _batch(4, d=6, dtype=torch.float32)
    with pytest.raises(ValueError, match="embedding_size=8"):
        memory(emb, labels)
    emb, labels = _batch(4, dtype=torch.float32)
    with pytest.raises(ValueError, match="labels must have shape"):
        memory(emb, labels[:3])
    index_memory = RankingMemory(_flat_loss(), 8, 16, mode="index")
    with pytest.raises(ValueError, match="needs indices"):
        index_memory(emb, labels)
    with pytest.raises(ValueError, match="indices must lie in"):
        index_memory(emb, labels, torch.tensor([0, 1, 2, 16]))
    with pytest.raises(TypeError, match="integer dtype"):
        index_memory(emb, labels, torch.tensor([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="state_dict"):
        RankingMemory(_flat_loss(), 8, 16).load_state_dict({**memory.state_dict(), "labels": torch.zeros(5)})


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_low_precision_embeddings_use_a_float32_memory(low):
    memory = RankingMemory(losses.SupAPLoss(), 8, 32)
    for step in range(3):
        emb, labels = _batch(8, seed=step, dtype=torch.float32)
        emb = emb.to(low).requires_grad_(True)
        out = memory(emb, labels)
        out.backward()
        assert out.dtype == torch.float32 and torch.isfinite(out) and torch.isfinite(emb.grad.float()).all()
    assert memory.embeddings.dtype == torch.float32
    torch.testing.assert_close(memory.embeddings[16:24], emb.detach().float(), rtol=0, atol=0)


def test_index_memory_duplicate_indices_last_row_wins():
    memory = RankingMemory(_flat_loss(), 8, 10, mode="index", dtype=torch.float64)
    emb, labels = _batch(4, seed=0)
    memory.enqueue(emb, labels, torch.tensor([3, 5, 3, 7]))
    torch.testing.assert_close(memory.embeddings[3], emb[2], rtol=0, atol=0)
    torch.testing.assert_close(memory.embeddings[5], emb[1], rtol=0, atol=0)
    assert memory.filled.nonzero().flatten().tolist() == [3, 5, 7] and int(memory.labels[3]) == int(labels[2])


@pytest.mark.parametrize("mode", ["fifo", "index"])
def test_get_first_ranks_against_the_memory_before_the_batch(mode):
    old, old_labels = _batch(12, seed=1)
    emb, labels = _batch(6, seed=2)
    emb.requires_grad_(True)
    loss_fn = _flat_loss()
    memory = RankingMemory(loss_fn, 8, 16, mode=mode, batch_weight=0.0, get_first=True, dtype=torch.float64)
    memory.enqueue(old, old_labels, torch.arange(12))
    idx = torch.tensor([0, 1, 2, 12, 13, 14])  # in index mode, images 0-2 already have an (older) slot
    got = memory(emb, labels, idx)
    if mode == "fifo":
        expected = loss_fn(emb, labels, None, old, old_labels)  # no copy of the queries: nothing removed
    else:
        per_query = []
        for q, i in enumerate(idx.tolist()):
            keep = torch.arange(12) != i  # the query's own older slot is excluded
            per_query.append(loss_fn(emb[q : q + 1], labels[q : q + 1], None, old[keep], old_labels[keep]))
        expected = torch.stack(per_query).mean()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    got.backward()  # the batch was written after the loss: the saved references are a copy
    assert torch.isfinite(emb.grad).all()
    assert memory.num_filled == (16 if mode == "fifo" else 15)
    slots = torch.tensor([12, 13, 14, 15, 0, 1]) if mode == "fifo" else idx  # the queue wraps around
    torch.testing.assert_close(memory.embeddings[slots], emb.detach(), rtol=0, atol=0)


def test_device_is_checked():
    with pytest.raises(ValueError, match="device must be a valid torch device string"):
        RankingMemory(losses.SupAPLoss(), embedding_size=4, memory_size=8, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device='cuda' but CUDA is not available"):
            RankingMemory(losses.SupAPLoss(), embedding_size=4, memory_size=8, device="cuda")
    assert RankingMemory(losses.SupAPLoss(), embedding_size=4, memory_size=8, device="cpu").ptr.device.type == "cpu"


def _xbm_call(rows, labels, width=8, enqueue_mask=None):
    return lambda memory: memory(torch.randn(rows, width), labels, enqueue_mask=enqueue_mask)


@pytest.mark.parametrize(
    ("build", "call", "match"),
    [
        ((8, 16), _xbm_call(8, torch.arange(8) % 4, width=5), r"embeddings must have shape \(B, embedding_size=8\)"),
        ((8, 16), _xbm_call(0, torch.arange(0)), "embeddings must contain at least one row"),
        ((8, 16), _xbm_call(8, torch.arange(3)), r"labels must have shape \(N,\)"),
        ((8, 16), _xbm_call(20, torch.arange(20) % 4), "at most memory_size=16 rows; got 20"),
        ((8, 16), _xbm_call(8, torch.arange(8)[:, None]), "stores one label per slot"),
        ((8, 16), _xbm_call(4, torch.arange(4), enqueue_mask=torch.ones(3, dtype=torch.bool)), "enqueue_mask must"),
        ((0, 16), None, "embedding_size must be an int >= 1; got 0"),
        ((8, 0), None, "memory_size must be an int >= 1; got 0"),
    ],
)  # fmt: skip
def test_pml_style_cross_batch_memory_refuses_bad_input_by_name(build, call, match):
    """pml_suprank.memory.CrossBatchMemory: ValueError naming the argument, not PML's IndexError/RuntimeError/assert."""
    from pml_suprank.memory import CrossBatchMemory as OurCrossBatchMemory

    if call is None:
        with pytest.raises(ValueError, match=match):
            OurCrossBatchMemory(_flat_loss(), *build)
        return
    memory = OurCrossBatchMemory(_flat_loss(), *build)
    with pytest.raises(ValueError, match=match):
        call(memory)


def test_pml_style_cross_batch_memory_refuses_a_proxy_loss_with_value_error():
    from pml_suprank.memory import CrossBatchMemory as OurCrossBatchMemory

    with pytest.raises(ValueError, match="got ClusterLoss"):
        OurCrossBatchMemory(losses.ClusterLoss(4, 8), 8, 16)
