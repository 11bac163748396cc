"""Miner-free samplers for rank losses, seeded per epoch, resumable and sharded over processes:
:class:`MPerClassSampler` (PML's flat index stream), :class:`MPerClassBatchSampler` (the same batches for
``DataLoader(batch_sampler=...)``), :class:`HierarchicalSampler` (batches from pairs of super-classes, as PML's) and
:class:`MultiLabelSampler` (m items per sampled label).

Example:
    >>> from pml_suprank import samplers
    >>> stream = samplers.MPerClassSampler([0, 0, 1, 1, 2, 2, 3, 3], m=2, batch_size=4, length_before_new_iter=8)
    >>> len(list(stream))
    8
"""

from .base import SmallClassPolicy
from .class_samplers import HierarchicalSampler, MPerClassBatchSampler, MPerClassSampler
from .multilabel import MultiLabelSampler

__all__ = ["HierarchicalSampler", "MPerClassBatchSampler", "MPerClassSampler", "MultiLabelSampler"]
