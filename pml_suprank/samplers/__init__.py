"""Miner-free samplers for rank losses, seeded per epoch, resumable and sharded: :class:`MPerClassSampler`,
:class:`MPerClassBatchSampler`, :class:`HierarchicalSampler` (super-classes, as PML's), :class:`MultiLabelSampler`.

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
