"""Launch and host-read budget of the sorted hierarchical losses against a memory: one fwd+bwd reads the device
once (the positives per query and level) whatever the number of query blocks, window chunks or references, and
its aten op count does not grow with them beyond one block's ops per block (``torch.profiler`` on the CPU; on a GPU
each op is a launch and each read a stall). ``benchmarks/bench_hierarchical_ops.py`` prints the same counts at
B = 256 against 4,096 and 60,000 items."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _helpers import profiled_ops

import pml_suprank.ranking.query_blocks as qb
from pml_suprank import losses
from pml_suprank.ranking.query_blocks import query_block_rows

NAMES = ("SupHAPLoss", "HAPPIERLoss", "SupNDCGLoss")


def _inputs(batch_size, num_refs, dim=16, seed=0):
    """As ``../shared/gpu/gpu_check.py``: random unit embeddings, 4 queries per fine class, every query with
    positives in the memory, 8 fine classes per coarse class."""
    g = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(batch_size, dim, generator=g), dim=1)
    fine = torch.arange(batch_size) // 4
    ref = F.normalize(torch.randn(num_refs, dim, generator=g), dim=1)
    ref_fine = torch.randint(0, max(num_refs // 8, batch_size // 4), (num_refs,), generator=g)
    ref_fine[:batch_size] = fine
    return emb, torch.stack([fine, fine // 8], 1), ref, torch.stack([ref_fine, ref_fine // 8], 1)


def _counts(name, batch_size, num_refs, chunk_size=None):
    emb, labels, ref, ref_labels = _inputs(batch_size, num_refs)
    kwargs = {"num_classes": int(ref_labels[:, 0].max()) + 1, "embedding_size": 16} if name == "HAPPIERLoss" else {}
    loss_fn = getattr(losses, name)(kernel="sorted", chunk_size=chunk_size, **kwargs)
    x = emb.clone().requires_grad_(True)
    top, reads = profiled_ops(
        lambda: loss_fn(x, labels, ref_emb=ref, ref_labels=ref_labels).backward(), host_reads=True
    )
    return len(top), reads


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_one_host_read_whatever_the_blocks_chunks_and_references(name, monkeypatch):
    monkeypatch.setattr(qb, "BLOCK_BYTES_CPU", 8 * 3 * 1000 * qb.BYTES_PER_ELEMENT)  # blocks of 8 queries
    assert query_block_rows(1000, 2, None, 24) == 8 and query_block_rows(2000, 2, None, 8) == 8
    one_block = _counts(name, 8, 1000)
    three_blocks = _counts(name, 24, 1000)
    many_chunks = _counts(name, 24, 1000, chunk_size=4_000)  # every window row its own chunk
    more_refs = _counts(name, 8, 2000)
    for _, reads in (one_block, three_blocks, many_chunks, more_refs):
        assert reads == ["tolist"]
    # ops: one block's per block (forward and backward once: the Jacobian is kept, nothing is recomputed)
    assert three_blocks[0] <= 3 * one_block[0] + 30
    assert more_refs[0] <= one_block[0] + 30
    assert many_chunks[0] > three_blocks[0] + 100  # the chunks are counted (the bounds above are not vacuous)
