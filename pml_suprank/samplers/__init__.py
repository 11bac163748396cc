"""Miner-free batch samplers for rank losses (``DataLoader(batch_sampler=...)``), seeded per epoch, resumable and
sharded over processes.

Modules:
    class_samplers: :class:`MPerClassSampler` (m images of B/m classes) and :class:`HierarchicalSampler`
        (batches drawn from pairs of super-classes).
    multilabel: :class:`MultiLabelSampler` (m items per sampled label, for multi-label datasets).
    base: the shared sharded batch sampler (epochs, ``state_dict``, per-rank slices).

Example:
    >>> from pml_suprank import samplers
    >>> sampler = samplers.MPerClassSampler([0, 0, 1, 1, 2, 2, 3, 3], m=2, batch_size=4, seed=0)
    >>> list(map(len, sampler))
    [4, 4]
"""

from .base import SmallClassPolicy
from .class_samplers import HierarchicalSampler, MPerClassSampler
from .multilabel import MultiLabelSampler

__all__ = ["HierarchicalSampler", "MPerClassSampler", "MultiLabelSampler"]
