"""Tests of pml_suprank.samplers (MPerClassBatchSampler, HierarchicalSampler): class structure, coverage, determinism,
resume, sharding, accelerate."""

from __future__ import annotations

import itertools
from collections import Counter
from math import comb

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pml_suprank.samplers import HierarchicalSampler, MPerClassBatchSampler


def _labels(sizes, seed=0):
    """Shuffled 1-D labels with class c having sizes[c] items."""
    lab = np.repeat(np.arange(len(sizes)), sizes)
    return np.random.default_rng(seed).permutation(lab)


def _h_labels(num_super=4, classes_per_super=6, per_class=5, seed=0):
    fine = np.repeat(np.arange(num_super * classes_per_super), per_class)
    coarse = fine // classes_per_super
    perm = np.random.default_rng(seed).permutation(fine.size)
    return np.stack([fine, coarse], 1)[perm]


def _check_m_per_class(batch, labels, m, batch_size):
    assert len(batch) == batch_size
    counts = Counter(labels[batch].tolist())
    assert len(counts) == batch_size // m
    assert set(counts.values()) == {m}
    # groups of m consecutive indices belong to one class
    assert all(len(set(labels[batch[i : i + m]].tolist())) == 1 for i in range(0, batch_size, m))


# ------------------------------------------------------------------------------------------------ MPerClassBatchSampler
def test_m_per_class_structure_no_duplicates_and_coverage():
    labels = _labels([8, 5, 4, 7, 9, 4, 6, 12, 4, 5])  # every class has >= m images
    s = MPerClassBatchSampler(labels, m=4, batch_size=16, seed=3)
    batches = list(s)
    assert len(batches) == len(s) > 0
    for b in batches:
        _check_m_per_class(b, labels, 4, 16)
        assert len(set(b)) == len(b), "no duplicate index inside a batch"
    seen = set(itertools.chain.from_iterable(batches))
    assert seen == set(range(labels.size)), "every image appears at least once per epoch"


def test_m_per_class_usable_as_dataloader_batch_sampler():
    labels = _labels([6] * 6)
    ds = TensorDataset(torch.arange(labels.size), torch.as_tensor(labels))
    s = MPerClassBatchSampler(torch.as_tensor(labels), m=3, batch_size=6, seed=0)
    out = [(x.tolist(), y.tolist()) for x, y in DataLoader(ds, batch_sampler=s)]
    assert len(out) == len(s)
    assert [x for x, _ in out] == list(s)
    for _, y in out:
        assert sorted(Counter(y).values()) == [3, 3]


def test_m_per_class_deterministic_and_epochs_differ():
    labels = _labels([7, 9, 5, 8, 6, 10, 4, 5])
    a = MPerClassBatchSampler(labels, m=2, batch_size=8, seed=5)
    b = MPerClassBatchSampler(labels.tolist(), m=2, batch_size=8, seed=5)
    assert list(a) == list(b)
    assert list(a) == list(a), "same epoch, same stream (no hidden RNG state)"
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert len(list(a)) == len(first), "epoch length is deterministic"
    c = MPerClassBatchSampler(labels, m=2, batch_size=8, seed=6)
    assert list(c) != first


def test_m_per_class_does_not_touch_global_rng():
    np.random.seed(0)
    torch.manual_seed(0)
    ref_np, ref_t = np.random.rand(), torch.rand(1)
    np.random.seed(0)
    torch.manual_seed(0)
    list(MPerClassBatchSampler(_labels([5] * 8), m=2, batch_size=8))
    assert np.random.rand() == ref_np and torch.equal(torch.rand(1), ref_t)


@pytest.mark.parametrize("position", [0, 3, 7])
def test_m_per_class_exact_resume(position):
    labels = _labels([9, 7, 8, 6, 10, 5, 7, 9, 8])
    s = MPerClassBatchSampler(labels, m=3, batch_size=9, seed=11)
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(position)]
    state = s.state_dict()
    tail = list(it)
    assert state["epoch"] == 2 and state["position"] == position
    r = MPerClassBatchSampler(labels, m=3, batch_size=9, seed=11)
    r.load_state_dict(state)
    r.set_epoch(2)  # the usual loop call keeps the restored position
    assert list(r) == tail
    assert head + tail == list(r), "the next pass over the same epoch starts from its beginning"
    r.set_epoch(3)
    s.set_epoch(3)
    assert list(r) == list(s)


def test_state_dict_rejects_other_configuration():
    labels = _labels([6] * 6)
    state = MPerClassBatchSampler(labels, m=3, batch_size=6, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        MPerClassBatchSampler(labels, m=3, batch_size=6, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="epoch"):
        MPerClassBatchSampler(labels, m=3, batch_size=6, seed=1).load_state_dict({"position": 0})
    with pytest.raises(ValueError, match="position"):
        MPerClassBatchSampler(labels, m=3, batch_size=6, seed=1).load_state_dict({**state, "position": 10**6})


def test_small_class_policies():
    sizes = [6, 6, 6, 6, 2, 1]  # classes 4 and 5 have fewer than m = 3 images
    labels = _labels(sizes)
    rep = MPerClassBatchSampler(labels, m=3, batch_size=6, seed=0, small_classes="replace")
    seen = set()
    for b in rep:
        _check_m_per_class(b, labels, 3, 6)
        for i in range(0, 6, 3):
            g = b[i : i + 3]
            if len(set(g)) < 3:  # duplicates only in groups of small classes
                assert labels[g[0]] in (4, 5)
        seen.update(b)
    assert seen == set(range(labels.size))
    skip = MPerClassBatchSampler(labels, m=3, batch_size=6, seed=0, small_classes="skip")
    for b in skip:
        _check_m_per_class(b, labels, 3, 6)
        assert len(set(b)) == 6
        assert not set(labels[b].tolist()) & {4, 5}
    with pytest.raises(ValueError, match="small_classes"):
        MPerClassBatchSampler(labels, m=3, batch_size=6, small_classes="pad")


def test_m_per_class_imbalanced_classes_stay_distinct_in_a_batch():
    labels = _labels([60, 3, 3, 4, 3, 5, 3, 3])  # one class holds most groups: it is capped to one group per batch
    s = MPerClassBatchSampler(labels, m=3, batch_size=12, seed=0)
    for epoch in range(3):
        s.set_epoch(epoch)
        for b in s:
            _check_m_per_class(b, labels, 3, 12)
    assert len(s) == len(MPerClassBatchSampler(labels, m=3, batch_size=12, seed=9))


def test_m_per_class_drop_last_partitions_the_dataset():
    labels = _labels([4] * 10)  # 10 groups, 3 per batch -> 3 batches, one group left out
    s = MPerClassBatchSampler(labels, m=4, batch_size=12, drop_last=True)
    assert len(s) == 3
    flat = list(itertools.chain.from_iterable(s))
    assert len(flat) == len(set(flat)) == 36


@pytest.mark.parametrize("replicas", [2, 4])
def test_m_per_class_disjoint_equal_shards(replicas):
    labels = _labels([4] * 24, seed=1)  # 24 classes of 4: an exact partition with drop_last
    shards = [
        MPerClassBatchSampler(labels, m=4, batch_size=8, seed=7, num_replicas=replicas, rank=r, drop_last=True)
        for r in range(replicas)
    ]
    streams = [list(s) for s in shards]
    assert len({len(x) for x in streams}) == 1 and len(streams[0]) == len(shards[0])
    for step in zip(*streams, strict=True):
        glob = list(itertools.chain.from_iterable(step))
        assert len(set(glob)) == len(glob), "ranks get disjoint indices"
        _check_m_per_class(glob, labels, 4, 8 * replicas)  # the GLOBAL batch keeps the class structure
        for b in step:
            _check_m_per_class(b, labels, 4, 8)
    flat = list(itertools.chain.from_iterable(itertools.chain.from_iterable(streams)))
    assert len(flat) == len(set(flat)) == 24 * 4 // (8 * replicas) * 8 * replicas
    # without drop_last every image is seen once the shards are put together
    padded = [MPerClassBatchSampler(labels, m=4, batch_size=8, num_replicas=replicas, rank=r) for r in range(replicas)]
    cover = set(itertools.chain.from_iterable(itertools.chain.from_iterable(list(s) for s in padded)))
    assert cover == set(range(labels.size))


def test_m_per_class_bad_input():
    labels = _labels([5] * 6)
    with pytest.raises(ValueError, match="m must be <= batch_size"):
        MPerClassBatchSampler(labels, m=8, batch_size=4)
    with pytest.raises(ValueError, match="multiple of m"):
        MPerClassBatchSampler(labels, m=3, batch_size=8)
    with pytest.raises(ValueError, match="at least 2 classes"):
        MPerClassBatchSampler(np.zeros(20, dtype=int), m=2, batch_size=4)  # PML: m * classes >= batch_size
    with pytest.raises(ValueError, match="at least 4 classes"):
        MPerClassBatchSampler(labels[labels < 3], m=2, batch_size=8)
    with pytest.raises(TypeError, match="labels"):
        MPerClassBatchSampler(np.linspace(0, 1, 10), m=2, batch_size=4)
    with pytest.raises(TypeError, match="m must be an int"):
        MPerClassBatchSampler(labels, m=2.0, batch_size=4)
    with pytest.raises(ValueError, match="rank"):
        MPerClassBatchSampler(labels, m=2, batch_size=4, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="seed"):
        MPerClassBatchSampler(labels, m=2, batch_size=4, seed=-1)


# ----------------------------------------------------------------------------------------------- HierarchicalSampler
def _check_hierarchical(batch, labels, batch_size, spc, k=2):
    assert len(batch) == batch_size
    supers = Counter(labels[batch, 1].tolist())
    assert len(supers) == k and set(supers.values()) == {batch_size // k}
    fine = Counter(labels[batch, 0].tolist())
    assert all(v % spc == 0 for v in fine.values())


def test_hierarchical_structure_length_and_determinism():
    labels = _h_labels()
    s = HierarchicalSampler(labels, batch_size=12, samples_per_class=3, batches_per_super_tuple=5, seed=1)
    assert len(s) == comb(4, 2) * 5
    batches = list(s)
    assert len(batches) == len(s)
    pairs = Counter()
    for b in batches:
        _check_hierarchical(b, labels, 12, 3)
        assert len(set(b)) == 12
        pairs[tuple(sorted(set(labels[b, 1].tolist())))] += 1
    assert set(pairs.values()) == {5} and len(pairs) == comb(4, 2)
    assert batches == list(HierarchicalSampler(labels, 12, 3, 5, seed=1))
    s.set_epoch(1)
    assert list(s) != batches
    torch_labels = torch.as_tensor(labels)
    assert list(HierarchicalSampler(torch_labels, 12, 3, 5, seed=1)) == batches


def test_hierarchical_super_class_with_few_classes_still_fills_the_batch():
    fine = np.repeat(np.arange(7), 6)
    coarse = np.array([0, 0, 1, 1, 1, 1, 1])[fine]  # super-class 0 has only 2 classes of 6 images
    labels = np.stack([fine, coarse], 1)
    s = HierarchicalSampler(labels, batch_size=16, samples_per_class=2, batches_per_super_tuple=3)
    for b in s:
        _check_hierarchical(b, labels, 16, 2)
        assert len(set(b)) == 16, "other images of the same classes are used before any duplicate"


@pytest.mark.parametrize("replicas", [2, 4])
def test_hierarchical_disjoint_equal_shards(replicas):
    labels = _h_labels(num_super=3, classes_per_super=8, per_class=6)
    shards = [HierarchicalSampler(labels, 8, 2, 3, seed=4, num_replicas=replicas, rank=r) for r in range(replicas)]
    streams = [list(s) for s in shards]
    assert {len(x) for x in streams} == {comb(3, 2) * 3}
    for step in zip(*streams, strict=True):
        glob = list(itertools.chain.from_iterable(step))
        assert len(set(glob)) == len(glob)
        _check_hierarchical(glob, labels, 8 * replicas, 2)
        for b in step:
            _check_hierarchical(b, labels, 8, 2)


def test_hierarchical_exact_resume():
    labels = _h_labels()
    s = HierarchicalSampler(labels, 8, 2, 2, seed=3)
    it = iter(s)
    for _ in range(4):
        next(it)
    state = s.state_dict()
    r = HierarchicalSampler(labels, 8, 2, 2, seed=3)
    r.load_state_dict(state)
    assert list(r) == list(it)


def test_hierarchical_bad_input():
    labels = _h_labels()
    with pytest.raises(ValueError, match="shape \\(N, L\\)"):
        HierarchicalSampler(labels[:, 0], 8, 2)
    with pytest.raises(ValueError, match="multiple of super_classes_per_batch"):
        HierarchicalSampler(labels, 10, 3)
    with pytest.raises(ValueError, match="samples_per_class must be <="):
        HierarchicalSampler(labels, 4, 8, super_classes_per_batch=1)
    with pytest.raises(ValueError, match="at least super_classes_per_batch = 2 super-classes"):
        HierarchicalSampler(np.stack([np.arange(10) // 2, np.zeros(10, int)], 1), 4, 2)
    with pytest.raises(ValueError, match="outer_label"):
        HierarchicalSampler(labels, 8, 2, outer_label=5)


# ------------------------------------------------------------------------------------------------ accelerate
@pytest.mark.parametrize("split_batches", [False, True])
def test_under_accelerate_prepare_data_loader(split_batches):
    """accelerate deals whole batches (or contiguous slices) of a num_replicas=1 sampler to the processes."""
    accel = pytest.importorskip("accelerate.data_loader")
    labels = _labels([4] * 16, seed=2)
    ds = TensorDataset(torch.arange(labels.size))
    R, per_rank = 2, 8
    bs = per_rank * R if split_batches else per_rank
    per_rank_batches = []
    for r in range(R):
        sampler = MPerClassBatchSampler(labels, m=4, batch_size=bs, seed=0, num_replicas=1)
        dl = accel.prepare_data_loader(
            DataLoader(ds, batch_sampler=sampler), num_processes=R, process_index=r, split_batches=split_batches
        )
        got = [x.tolist() for (x,) in dl]
        assert len(got) == len(dl)
        for b in got:
            _check_m_per_class(b, labels, 4, per_rank)
        per_rank_batches.append(got)
    assert len(per_rank_batches[0]) == len(per_rank_batches[1])
    for b0, b1 in zip(*per_rank_batches, strict=True):
        assert not set(b0) & set(b1)
        if split_batches:  # the global batch keeps the class structure
            _check_m_per_class(b0 + b1, labels, 4, 16)

    hl = _h_labels(num_super=3, classes_per_super=6, per_class=4)
    hds = TensorDataset(torch.arange(hl.shape[0]))
    for r in range(R):
        hs = HierarchicalSampler(hl, 16, 2, 2, num_replicas=1)
        dl = accel.prepare_data_loader(
            DataLoader(hds, batch_sampler=hs), num_processes=R, process_index=r, split_batches=True
        )
        for (x,) in dl:
            _check_hierarchical(x.tolist(), hl, 8, 2)


def test_hierarchical_skip_policy_never_samples_small_classes():
    labels = _h_labels(num_super=3, classes_per_super=5, per_class=4)
    small = np.isin(labels[:, 0], [0, 7, 12])
    first = np.zeros_like(small)
    for c in (0, 7, 12):
        first[np.flatnonzero(labels[:, 0] == c)[0]] = True
    labels = labels[~small | first]  # classes 0, 7, 12 keep a single image
    assert np.bincount(labels[:, 0])[[0, 7, 12]].tolist() == [1, 1, 1]
    rep = HierarchicalSampler(labels, 8, 2, 2, seed=0, small_classes="replace")
    skip = HierarchicalSampler(labels, 8, 2, 2, seed=0, small_classes="skip")
    assert any(set(labels[b, 0].tolist()) & {0, 7, 12} for e in range(5) for b in rep.batches(e))
    for e in range(5):
        for b in skip.batches(e):
            _check_hierarchical(b, labels, 8, 2)
            assert not set(labels[b, 0].tolist()) & {0, 7, 12} and len(set(b)) == 8
