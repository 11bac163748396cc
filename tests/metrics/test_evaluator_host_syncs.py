"""RetrievalEvaluator keeps its row blocks on the device: the host-synchronising aten ops of ``evaluate()`` (counted
with torch.profiler on the CPU) do not grow with the number of row blocks."""

from __future__ import annotations

import pytest
import torch
from _helpers import profiled_ops

from pml_suprank.metrics import RetrievalEvaluator
from pml_suprank.metrics import ranks as R
from pml_suprank.metrics.registry import SINGLE_LABEL_GROUPS

# every metric group, NDCG included (its discounts are computed per slot and its ideal-DCG table has the padded
# width of the block, a size known on the host)
BLOCK_FREE_GROUPS = tuple(SINGLE_LABEL_GROUPS)


def _sync_count(evaluator: RetrievalEvaluator, emb: torch.Tensor, labels: torch.Tensor) -> int:
    # after a warm-up (lazy initialisations, numba compilation); outermost sync ops (item -> _local_scalar_dense once)
    return len(profiled_ops(lambda: evaluator.evaluate(emb, labels))[1])


def _data(n: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(n, 16, generator=g), dim=1)
    fine = torch.randint(0, 24, (n,), generator=g)
    return emb, torch.stack([fine, fine % 4], 1)


def _sync_free_countings() -> list:
    compiled = pytest.param("compiled", marks=pytest.mark.skipif(not R._compiled_available(), reason="no numba"))
    return ["dense", compiled]


@pytest.mark.parametrize("counting", _sync_free_countings())
@pytest.mark.slow
def test_host_syncs_do_not_grow_with_the_number_of_row_blocks(counting):
    emb, labels = _data()
    counts = {
        blocks: _sync_count(
            RetrievalEvaluator(
                k_values=(1, 10), chunk_size=len(emb) // blocks, counting=counting, metrics=BLOCK_FREE_GROUPS
            ),
            emb,
            labels,
        )
        for blocks in (1, 8)
    }
    assert counts[1] == counts[8], counts
    assert counts[1] > 0  # the per-call input checks and the host-side summary are counted
