"""The flat sorted kernels' block size per device: larger blocks on accelerators (fewer launches), same values and
gradients whatever the block size, and the operator count (the CPU proxy of launches) falling with the block count."""

from __future__ import annotations

import pytest
import torch
from _helpers import profiled_ops

from pml_suprank.ranking import ACCELERATOR_CHUNK_SIZE, CHUNK_SIZE, SupRankStep, default_chunk_elements
from pml_suprank.ranking.flat import positive_pair_groups, sigmoid_rank_sums, suprank_negative_sum


def test_default_block_size_per_device_type():
    assert default_chunk_elements("cpu") == CHUNK_SIZE
    assert default_chunk_elements(torch.device("cuda", 0)) == ACCELERATOR_CHUNK_SIZE
    assert default_chunk_elements("mps") == ACCELERATOR_CHUNK_SIZE
    assert ACCELERATOR_CHUNK_SIZE == 4 * CHUNK_SIZE


STEP = SupRankStep(offset=1.4933)  # a numeric offset: the step itself reads nothing


def _problem(batch=12, refs=300, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, refs, generator=g, dtype=torch.float64) * 0.05
    labels, ref_labels = torch.arange(batch) % classes, torch.randint(0, classes, (refs,), generator=g)
    positives = labels[:, None] == ref_labels[None]
    valid = torch.ones_like(positives)
    valid[:, :7] = False
    return scores, positives & valid, valid


def _suprank(scores, positives, valid, chunk):
    q, i, groups = positive_pair_groups(positives)
    x = scores.clone().requires_grad_(True)
    out = suprank_negative_sum(x, q, i, valid & ~positives, STEP, chunk_elements=chunk, groups=groups)
    (out * torch.linspace(0.5, 1.5, len(out), dtype=out.dtype)).sum().backward()
    return out.detach(), x.grad


def _smooth(scores, positives, valid, chunk):
    q, i, groups = positive_pair_groups(positives)
    x = scores.clone().requires_grad_(True)
    pos, full = sigmoid_rank_sums(x, q, i, valid, 0.01, chunk_elements=chunk, groups=groups)
    (pos / (1 + full)).sum().backward()
    return torch.stack([pos, full]).detach(), x.grad


@pytest.mark.parametrize("kernel", [_suprank, _smooth])
def test_values_and_gradients_do_not_depend_on_the_block_size(kernel):
    scores, positives, valid = _problem()
    reference = kernel(scores, positives, valid, None)  # the CPU default
    for chunk in (1, 500, CHUNK_SIZE, ACCELERATOR_CHUNK_SIZE):
        value, grad = kernel(scores, positives, valid, chunk)
        torch.testing.assert_close(value, reference[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(grad, reference[1], rtol=0, atol=1e-12)


def test_larger_blocks_mean_fewer_operators_and_no_extra_host_read():
    scores, positives, valid = _problem(batch=32, refs=2000, classes=64)  # ~31 positives per query
    counts = {}
    for chunk in (2_000, 400_000, 4_000_000):  # one query per block, ~6, all 32 in one
        top, syncs = profiled_ops(lambda chunk=chunk: _suprank(scores, positives, valid, chunk), host_reads=True)
        counts[chunk] = len(top)
        assert len(syncs) == 1, syncs  # the one read of the pairs' sizes, whatever the block size
    assert counts[2_000] > counts[400_000] > counts[4_000_000], counts
