"""Our samplers against PML's namesakes on the same inputs (issue 21): PML's arguments are accepted with PML's
meaning (positional order, ``samples_per_class="all"``, ``length_before_new_iter``), the batches have the same
structure and the epochs the same length; the differences are the documented ones (batch sampler, default epoch
length, ``batch_size=None``, the tree check of issue 20)."""

from __future__ import annotations

import inspect
import itertools
from collections import Counter
from math import comb

import numpy as np
import pytest
import torch
from pytorch_metric_learning import samplers as pml_samplers
from torch.utils.data import DataLoader, TensorDataset

from pml_suprank import samplers
from pml_suprank.data.retrieval_dataset import RetrievalDatasetBase


def _flat_labels(num_classes=10, per_class=6, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def _tree_labels(sizes_per_super, seed=0):
    """``(N, 3)`` labels (image id, class, super-class) from ``[[class sizes of super 0], [of super 1], ...]``."""
    rows, c = [], 0
    for s, sizes in enumerate(sizes_per_super):
        for size in sizes:
            rows += [(c, s)] * size
            c += 1
    arr = np.asarray(rows)[np.random.default_rng(seed).permutation(len(rows))]
    return np.concatenate([np.arange(len(arr))[:, None], arr], 1)


def _m_per_class_structure(batch, labels, m, batch_size):
    assert len(batch) == batch_size
    counts = Counter(labels[list(batch)].tolist())
    return len(counts), frozenset(counts.values())


def _pml_batches(sampler, batch_size):
    stream = [int(i) for i in sampler]
    return [stream[i : i + batch_size] for i in range(0, len(stream), batch_size)]


# ------------------------------------------------------------------------------------------------ signatures


@pytest.mark.parametrize("name", ["MPerClassSampler", "HierarchicalSampler"])
def test_pml_parameters_are_ours_in_the_same_order_and_the_extras_keyword_only(name):
    theirs = list(inspect.signature(getattr(pml_samplers, name)).parameters.values())
    ours = list(inspect.signature(getattr(samplers, name)).parameters.values())
    positional = [p for p in ours if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in positional] == [p.name for p in theirs]
    assert all(p.kind is p.KEYWORD_ONLY for p in ours[len(theirs) :])
    assert [p.default for p in positional] == [p.default for p in theirs]  # PML's defaults too


# ------------------------------------------------------------------------------------------------ MPerClassSampler


@pytest.mark.parametrize(("batch_size", "length"), [(16, 64), (16, 70), (8, 8), (12, 1000)])
def test_m_per_class_is_pmls_flat_stream_in_a_dataloader(batch_size, length):
    """PML's usual call, ``DataLoader(ds, sampler=MPerClassSampler(labels, m, batch_size=B), batch_size=B)``, with
    ours and theirs: the same length in indices, the same number of batches, every batch B / m classes x m images."""
    labels = _flat_labels()
    theirs = pml_samplers.MPerClassSampler(labels, 4, batch_size, length)
    ours = samplers.MPerClassSampler(labels, 4, batch_size, length)  # PML's positional order
    assert len(ours) == len(theirs) == length - length % batch_size
    stream = list(ours)
    assert len(stream) == len(ours) and all(isinstance(i, int) for i in stream)
    ds = TensorDataset(torch.as_tensor(labels))
    pml_loader = DataLoader(ds, sampler=theirs, batch_size=batch_size)
    our_loader = DataLoader(ds, sampler=ours, batch_size=batch_size)
    assert [len(y) for (y,) in pml_loader] == [len(y) for (y,) in our_loader] == [batch_size] * (length // batch_size)
    for (y,) in our_loader:
        assert sorted(Counter(y.tolist()).values()) == [4] * (batch_size // 4)
    # the batch form of the same plan, for DataLoader(batch_sampler=...)
    assert list(ours.batch_sampler) == [stream[i : i + batch_size] for i in range(0, len(stream), batch_size)]


def test_m_per_class_fourth_positional_is_length_before_new_iter_not_seed():
    labels = _flat_labels()
    assert len(samplers.MPerClassSampler(labels, 2, 8, 40)) == 40
    with pytest.raises(TypeError, match="positional"):
        samplers.MPerClassSampler(labels, 2, 8, 40, 3)  # seed, num_replicas ... are keyword-only
    a = samplers.MPerClassSampler(labels, 2, 8, 40, seed=3)
    b = samplers.MPerClassSampler(labels, 2, 8, length_before_new_iter=40, seed=3)
    assert list(a) == list(b) and list(a) != list(samplers.MPerClassSampler(labels, 2, 8, 40, seed=4))


def test_m_per_class_long_epoch_is_passes_over_the_data_and_shards():
    labels = _flat_labels(num_classes=6, per_class=4)
    batches = list(samplers.MPerClassBatchSampler(labels, 2, 4, 400, seed=1))
    assert len(batches) == 100
    one_pass = len(samplers.MPerClassBatchSampler(labels, 2, 4, seed=1))
    covered = set(itertools.chain.from_iterable(batches[:one_pass]))
    assert covered == set(range(labels.size)), "the first pass covers the dataset"
    shards = [samplers.MPerClassSampler(labels, 2, 4, 40, num_replicas=2, rank=r) for r in range(2)]
    assert [len(s) for s in shards] == [40, 40]
    streams = [list(s) for s in shards]
    for i in range(0, 40, 4):
        a, b = streams[0][i : i + 4], streams[1][i : i + 4]
        assert not set(a) & set(b) and len(set(labels[a + b].tolist())) == 4
    state = shards[0].state_dict()
    assert state["length_before_new_iter"] == 40
    with pytest.raises(ValueError, match="length_before_new_iter=40 vs 80"):
        samplers.MPerClassSampler(labels, 2, 4, 80, num_replicas=2, rank=0).load_state_dict(state)


def test_m_per_class_refuses_with_value_errors_where_pml_asserts():
    labels = _flat_labels()
    assert len(pml_samplers.MPerClassSampler(labels, 4, 16)) == len(samplers.MPerClassSampler(labels, 4, 16))
    for args, message in [
        ((4, 16, 8), r"length_before_new_iter .* must be >= batch_size = 16; got 8"),
        ((4, 18), "batch_size must be a multiple of m"),
        ((2, 24), r"at least 12 classes .*m \* number of classes must be >= batch_size"),
    ]:
        with pytest.raises(AssertionError):
            pml_samplers.MPerClassSampler(labels, *args)
        with pytest.raises(ValueError, match=message):
            samplers.MPerClassSampler(labels, *args)


def test_m_per_class_accepts_what_pml_accepts():
    """Without batch_size, a length shorter than one pass (a part of it, as PML); with batch_size, a single class."""
    labels = torch.as_tensor(_flat_labels(num_classes=10, per_class=7))
    part = samplers.MPerClassSampler(labels, 4, length_before_new_iter=39)
    assert len(part) == len(pml_samplers.MPerClassSampler(labels, 4, length_before_new_iter=39)) == 39
    stream = list(part)
    assert len(stream) == 39 and len(set(labels[stream[:36]].tolist())) == 9
    one_class = [7] * 5
    ours = samplers.MPerClassSampler(one_class, 5, 5, 10)
    assert len(pml_samplers.MPerClassSampler(one_class, 5, 5, 10)) == len(ours) == 10
    assert sorted(ours) == sorted(list(range(5)) * 2)


class _TinyImages(RetrievalDatasetBase):
    def get_image(self, index):
        from PIL import Image

        return Image.new("RGB", (2, 2), color=(int(index), 0, 0))


def test_batch_form_passed_as_sampler_fails_at_the_first_item_with_the_fix():
    labels = _flat_labels(num_classes=4, per_class=4)
    ds = _TinyImages(torch.as_tensor(labels), ["label"])
    ours = samplers.MPerClassSampler(labels, 2, 4, 16)
    assert [b["labels"].shape[0] for b in DataLoader(ds, sampler=ours, batch_size=4)] == [4] * 4
    batches = ours.batch_sampler
    assert [b["labels"].shape[0] for b in DataLoader(ds, batch_sampler=batches)] == [4] * len(batches)
    with pytest.raises(TypeError, match=r"batch sampler .* DataLoader\(sampler=\.\.\.\): pass it as DataLoader\("):
        next(iter(DataLoader(ds, sampler=batches, batch_size=4)))


# ------------------------------------------------------------------------------------------------ HierarchicalSampler


def _hierarchical_structure(batch, labels, inner, outer):
    """(per-super-class counts, per-class counts) of one batch, sorted."""
    supers = Counter(labels[batch, outer].tolist())
    classes = Counter(labels[batch, inner].tolist())
    return tuple(sorted(supers.values())), tuple(sorted(set(classes.values())))


def test_hierarchical_same_arguments_same_structure_same_length():
    labels = _tree_labels([[5] * 6, [6] * 5, [5] * 7, [7] * 4])
    args = (labels, 16, 2, 3, 2, 1, 2)  # every PML argument, positionally: inner_label=1, outer_label=2
    theirs = pml_samplers.HierarchicalSampler(*args)
    ours = samplers.HierarchicalSampler(*args)
    pml_batches, our_batches = [list(map(int, b)) for b in theirs], list(ours)
    assert len(theirs) == len(ours) == len(our_batches) == len(pml_batches) == comb(4, 2) * 3
    structures = {_hierarchical_structure(b, labels, 1, 2) for b in pml_batches + our_batches}
    assert structures == {((8, 8), (2,))}
    supers = Counter(frozenset(labels[b, 2].tolist()) for b in our_batches)
    assert supers == Counter(frozenset(labels[b, 2].tolist()) for b in pml_batches)  # 3 batches per pair
    with pytest.raises(TypeError, match="positional"):
        samplers.HierarchicalSampler(*args, 0)  # seed is keyword-only


@pytest.mark.parametrize("batch_size", [8, 12])
def test_hierarchical_samples_per_class_all_has_pml_meaning(batch_size):
    labels = _tree_labels([[2, 3, 4, 5, 9], [1, 2, 3, 6], [3, 3, 4]], seed=1)
    theirs = pml_samplers.HierarchicalSampler(labels, batch_size, "all", 4, 2, 1, 2)
    ours = samplers.HierarchicalSampler(labels, batch_size, "all", 4, 2, 1, 2, seed=2)
    assert len(theirs) == len(ours) == comb(3, 2) * 4
    sizes = Counter(labels[:, 1].tolist())
    room = batch_size // 2
    for batch in [list(map(int, b)) for b in theirs] + list(ours):
        assert len(set(batch)) == len(batch) <= batch_size
        classes = Counter(labels[batch, 1].tolist())
        assert all(n == sizes[c] for c, n in classes.items()), "every sampled class comes with all its images"
        per_super = Counter(labels[batch, 2].tolist())
        assert len(per_super) == 2 and max(per_super.values()) <= room
        for s, used in per_super.items():  # greedy: no class left out would still have fitted
            left = [sizes[c] for c in set(labels[labels[:, 2] == s, 1].tolist()) if c not in classes]
            assert all(size > room - used for size in left)
    assert 9 not in {sizes[c] for b in ours for c in labels[b, 1].tolist()}  # larger than a half: never sampled


def test_hierarchical_all_refusals():
    labels = _tree_labels([[2, 3], [5, 6]])
    with pytest.raises(ValueError, match=r"super-class 1 .* has no class of at most .* = 4 images"):
        samplers.HierarchicalSampler(labels, 8, "all", inner_label=1, outer_label=2)
    with pytest.raises(ValueError, match="cannot be sharded: use num_replicas=1"):
        samplers.HierarchicalSampler(labels, 12, "all", inner_label=1, outer_label=2, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="multiple of super_classes_per_batch = 2"):
        samplers.HierarchicalSampler(labels, 13, "all", inner_label=1, outer_label=2)
    with pytest.raises(ValueError, match=r"positive int or 'all'.* got 'some'"):
        samplers.HierarchicalSampler(labels, 12, "some", inner_label=1, outer_label=2)
    sampler = samplers.HierarchicalSampler(labels, 12, "all", 2, inner_label=1, outer_label=2, seed=5)
    first = list(sampler)
    sampler.load_state_dict({**sampler.state_dict(), "position": 1})
    assert list(sampler) == first[1:] and sampler.state_dict()["samples_per_class"] == "all"


def test_hierarchical_labels_must_form_a_tree():
    labels = _tree_labels([[4, 4, 4], [4, 4, 4]])[:, 1:]
    labels[labels[:, 0] == 3, 1] = 0  # class 3 (super-class 1) ...
    labels[np.flatnonzero(labels[:, 0] == 3)[:2], 1] = 1  # ... keeps two images under super-class 1 as well
    pml_samplers.HierarchicalSampler(labels, 8, 2)  # PML accepts it and samples class 3 under both super-classes
    with pytest.raises(ValueError, match=r"labels\[:, \[0, 1\]\] is not a tree: label 3 .* several parents \[0, 1\]"):
        samplers.HierarchicalSampler(labels, 8, 2)
    with pytest.raises(ValueError, match="not a tree"):
        samplers.HierarchicalSampler(labels, 8, "all")


@pytest.mark.parametrize("length_before_new_iter", [None, 9999, 40])
@pytest.mark.slow
def test_m_per_class_without_batch_size_is_pmls_index_stream(length_before_new_iter):
    """PML's usage: ``MPerClassSampler(labels, m, length_before_new_iter=...)`` as ``DataLoader(sampler=...)``."""
    labels = torch.as_tensor(_flat_labels(num_classes=10, per_class=7))
    kwargs = {} if length_before_new_iter is None else {"length_before_new_iter": length_before_new_iter}
    ours, theirs = samplers.MPerClassSampler(labels, 4, **kwargs), pml_samplers.MPerClassSampler(labels, 4, **kwargs)
    assert len(ours) == len(theirs) == 40 * ((length_before_new_iter or 100000) // 40)
    stream = list(ours)
    assert len(stream) == len(ours) and all(isinstance(i, int) for i in stream)
    groups = np.asarray(stream).reshape(-1, 4)
    assert all(len(set(labels[g].tolist())) == 1 for g in groups)  # m consecutive indices of one class
    for one_pass in groups.reshape(-1, 10, 4):  # every pass visits each class once
        assert sorted(labels[one_pass[:, 0]].tolist()) == list(range(10))
    loader = DataLoader(TensorDataset(torch.arange(len(labels)), labels), sampler=ours, batch_size=20)
    for _, batch_labels in loader:
        assert sorted(Counter(batch_labels.tolist()).values()) == [4] * 5  # 5 classes x 4 images, as PML's
    assert list(ours) == stream  # same epoch, same stream
    ours.set_epoch(1)
    assert list(ours) != stream


def test_m_per_class_without_batch_size_refuses_sharding():
    labels = _flat_labels(num_classes=10, per_class=7)
    with pytest.raises(ValueError, match="num_replicas must be 1 with batch_size=None"):
        samplers.MPerClassSampler(labels, 4, num_replicas=2, rank=0)
