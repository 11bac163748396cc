"""Tests of pml_suprank.samplers.MultiLabelSampler (m items per sampled label, every item has positives)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pml_suprank.samplers import MultiLabelSampler


def _labels(n: int = 200, num_labels: int = 20, width: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_labels, (n, width), generator=g)
    pad = torch.rand(n, width, generator=g) < 0.5
    pad[:, 0] = False
    return labels.masked_fill(pad, -1)


def _sets(labels: torch.Tensor) -> list[set[int]]:
    return [{v for v in row if v >= 0} for row in labels.tolist()]


def test_batches_have_groups_of_m_sharing_a_distinct_label():
    labels = _labels()
    sets = _sets(labels)
    sampler = MultiLabelSampler(labels, m=4, batch_size=32, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler) > 0
    for batch in batches:
        assert len(batch) == 32
        assert len(set(batch)) == 32  # enough items per label here: no index repeated in a batch
        group_labels = []
        for start in range(0, 32, 4):
            shared = set.intersection(*(sets[i] for i in batch[start : start + 4]))
            assert shared, "a group must share a label"
            group_labels.append(shared)
        # the G labels of a batch are distinct: a system of distinct representatives exists (checked greedily)
        chosen: set[int] = set()
        for options in sorted(group_labels, key=len):
            free = options - chosen
            assert free
            chosen.add(min(free))
        for pos, i in enumerate(batch):  # every item has a positive elsewhere in the batch
            assert any(sets[i] & sets[j] for q, j in enumerate(batch) if q != pos)


def test_epoch_length_and_label_coverage():
    labels = _labels(seed=2)
    sets = _sets(labels)
    sizes = {c: sum(c in s for s in sets) for c in range(20)}
    m, bs = 4, 16
    sampler = MultiLabelSampler(labels, m=m, batch_size=bs, seed=0)
    expected = math.ceil(sum(math.ceil(n / m) for n in sizes.values()) / (bs // m))
    assert len(sampler) == expected
    assert len(sampler.batches()) == expected


def test_deterministic_epochs_and_resume():
    labels = _labels(seed=3)
    a = MultiLabelSampler(labels, m=2, batch_size=8, seed=5)
    b = MultiLabelSampler(labels.numpy(), m=2, batch_size=8, seed=5)
    assert list(a) == list(b)
    a.set_epoch(1)
    assert a.batches() != b.batches()
    b.set_epoch(1)
    it = iter(b)
    first = [next(it) for _ in range(3)]
    state = b.state_dict()
    c = MultiLabelSampler(labels, m=2, batch_size=8, seed=5)
    c.load_state_dict(state)
    assert first + list(c) == a.batches()
    with pytest.raises(ValueError, match="different configuration.*m=2 vs 4"):
        MultiLabelSampler(labels, m=4, batch_size=8, seed=5).load_state_dict(state)


def test_distributed_slices_are_disjoint_whole_groups():
    labels = _labels(n=300, num_labels=30, seed=4)
    r0 = MultiLabelSampler(labels, m=3, batch_size=12, seed=0, num_replicas=2, rank=0)
    r1 = MultiLabelSampler(labels, m=3, batch_size=12, seed=0, num_replicas=2, rank=1)
    assert len(r0) == len(r1)
    sets = _sets(labels)
    for b0, b1 in zip(r0, r1):
        assert len(b0) == len(b1) == 12 and not set(b0) & set(b1)
        for batch in (b0, b1):
            for start in range(0, 12, 3):
                assert set.intersection(*(sets[i] for i in batch[start : start + 3]))


def test_one_label_per_item_and_small_labels():
    labels = torch.tensor([0] * 6 + [1] * 6 + [2] * 5 + [3])  # label 3 has a single item
    skip = MultiLabelSampler(labels, m=2, batch_size=4, small_classes="skip")
    assert skip.classes.tolist() == [0, 1, 2]
    assert all(labels[i] != 3 for batch in skip for i in batch)
    replace = MultiLabelSampler(labels, m=2, batch_size=4)
    assert replace.classes.tolist() == [0, 1, 2, 3]
    for batch in replace:
        for start in (0, 2):
            assert labels[batch[start]] == labels[batch[start + 1]]


def test_repeated_and_padded_labels_count_once():
    labels = np.array([[0, 0, -1], [0, 1, 1], [1, -1, -1], [1, 0, -1], [2, 2, 2], [2, -1, -1]])
    sampler = MultiLabelSampler(labels, m=2, batch_size=4)
    assert sampler.classes.tolist() == [0, 1, 2]
    assert [m.tolist() for m in sampler._members] == [[0, 1, 3], [1, 2, 3], [4, 5]]


def test_validation():
    labels = _labels()
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        MultiLabelSampler(labels.float(), m=2, batch_size=4)
    with pytest.raises(ValueError, match="labels must have shape"):
        MultiLabelSampler(labels[:, :, None], m=2, batch_size=4)
    with pytest.raises(ValueError, match="labels must hold labels >= 0.*-3"):
        MultiLabelSampler(labels.masked_fill(labels == 5, -3), m=2, batch_size=4)
    bad = labels.clone()
    bad[7] = -1
    with pytest.raises(ValueError, match="labels row 7 has no label"):
        MultiLabelSampler(bad, m=2, batch_size=4)
    with pytest.raises(ValueError, match="m must be an int >= 2"):
        MultiLabelSampler(labels, m=1, batch_size=4)
    with pytest.raises(TypeError, match="m must be an int"):
        MultiLabelSampler(labels, m=2.0, batch_size=4)
    with pytest.raises(ValueError, match="m must be <= batch_size"):
        MultiLabelSampler(labels, m=8, batch_size=4)
    with pytest.raises(ValueError, match="batch_size must be a multiple of m"):
        MultiLabelSampler(labels, m=3, batch_size=8)
    with pytest.raises(ValueError, match="small_classes"):
        MultiLabelSampler(labels, m=2, batch_size=4, small_classes="drop")
    with pytest.raises(ValueError, match="at least 21 distinct labels.*got 20 usable labels"):
        MultiLabelSampler(labels, m=2, batch_size=42)
    with pytest.raises(ValueError, match="rank must lie in"):
        MultiLabelSampler(labels, m=2, batch_size=4, num_replicas=2, rank=2)


def test_label_with_fewer_than_m_items_some_already_drawn():
    """small_classes="replace": a label with fewer than m items, some of them already in the batch, repeats its items
    (it once raised numpy's "a cannot be empty" ValueError)."""
    labels = torch.randint(0, 12, (30, 2), generator=torch.Generator().manual_seed(6))
    sampler = MultiLabelSampler(labels, m=4, batch_size=8, seed=6)
    sets = _sets(labels)
    for batch in sampler:
        assert len(batch) == 8
        for start in range(0, 8, 4):  # each group of m shares a label
            assert set.intersection(*(sets[i] for i in batch[start : start + 4]))
