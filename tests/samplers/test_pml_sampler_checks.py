"""PML's two checks of its ``MPerClassSampler`` (its test suite, ``tests/samplers``), restated in our words and run on
ours: every ``batch_size`` consecutive indices of the stream are ``batch_size / m`` classes with ``m`` images each,
with and without ``batch_size``, through a restarted iterator and through ``DataLoader(sampler=..., batch_size=B)``;
the argument combinations PML refuses (an ``AssertionError`` there) are ``ValueError`` here, all others are accepted.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pml_suprank.samplers import MPerClassSampler


def _random_labels(num_classes: int, n: int = 2000, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, num_classes, (n,), generator=torch.Generator().manual_seed(seed))


def _structure(batch_labels: torch.Tensor) -> tuple[int, set[int]]:
    """(number of distinct classes, set of per-class counts) of one batch."""
    _, counts = torch.unique(batch_labels, return_counts=True)
    return len(counts), set(counts.tolist())


def _endless(sampler: MPerClassSampler):
    """Indices of ``sampler``, starting a new pass whenever one ends (PML's test loop restarts it the same way)."""
    while True:
        yield from sampler


def test_without_batch_size_every_window_of_the_stream_is_m_per_class():
    m, num_classes, length, window = 5, 100, 9999, 100
    labels = _random_labels(num_classes, n=10000)
    sampler = MPerClassSampler(labels, m, length_before_new_iter=length)
    one_pass = m * num_classes
    assert len(sampler) == one_pass * (length // one_pass)
    stream = iter(sampler)
    for _ in range(10):
        batch = [next(stream) for _ in range(window)]
        assert _structure(labels[batch]) == (window // m, {m})


GRID = list(itertools.product([4, 50, 100], [1, 5, 17, 50], [2, 10, 55], [100, 999]))


@pytest.mark.parametrize(("batch_size", "m", "num_classes", "length"), GRID)
def test_with_batch_size_refused_exactly_where_pml_refuses_else_m_per_class(batch_size, m, num_classes, length):
    labels = _random_labels(num_classes)
    pml_refuses = length < batch_size or m * num_classes < batch_size or batch_size % m != 0
    if pml_refuses:
        with pytest.raises(ValueError):
            MPerClassSampler(labels, m, batch_size, length)
        return
    sampler = MPerClassSampler(labels, m, batch_size, length)
    assert len(sampler) == length - length % batch_size
    expected = (batch_size // m, {m})
    stream = _endless(sampler)
    for _ in range(30):  # windows across the end of an epoch too
        batch = [next(stream) for _ in range(batch_size)]
        assert _structure(labels[batch]) == expected
    loader = DataLoader(TensorDataset(labels), batch_size=batch_size, sampler=sampler, drop_last=False)
    sizes = []
    for (batch_labels,) in loader:
        assert _structure(batch_labels) == expected
        sizes.append(len(batch_labels))
    assert sizes == [batch_size] * (length // batch_size)
