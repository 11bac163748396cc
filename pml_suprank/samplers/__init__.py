"""Miner-free samplers for rank losses, seeded per epoch, resumable and sharded over processes.

Modules:
    class_samplers: :class:`MPerClassSampler` (PML's flat index stream for ``DataLoader(sampler=...,
        batch_size=B)``: m images of B/m classes per batch), :class:`MPerClassBatchSampler` (the same batches for
        ``DataLoader(batch_sampler=...)``) and :class:`HierarchicalSampler` (batches drawn from pairs of
        super-classes, a batch sampler as PML's).
    multilabel: :class:`MultiLabelSampler` (m items per sampled label, for multi-label datasets).
    base: the shared sharded batch sampler (epochs, ``state_dict``, per-rank slices).

Example:
    >>> from pml_suprank import samplers
    >>> batches = samplers.MPerClassBatchSampler([0, 0, 1, 1, 2, 2, 3, 3], m=2, batch_size=4, seed=0)
    >>> list(map(len, batches))
    [4, 4]
    >>> stream = samplers.MPerClassSampler([0, 0, 1, 1, 2, 2, 3, 3], m=2, batch_size=4, length_before_new_iter=8)
    >>> len(list(stream))
    8
"""

from .base import SmallClassPolicy
from .class_samplers import HierarchicalSampler, MPerClassBatchSampler, MPerClassSampler
from .multilabel import MultiLabelSampler

__all__ = ["HierarchicalSampler", "MPerClassBatchSampler", "MPerClassSampler", "MultiLabelSampler"]
