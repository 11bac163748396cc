"""Miner-free samplers for rank losses: :class:`MPerClassSampler` (PML's flat index stream), and
:class:`MPerClassBatchSampler`, :class:`HierarchicalSampler` (super-classes, as PML's) and :class:`MultiLabelSampler`
(``DataLoader(batch_sampler=...)``). Every epoch is drawn from ``np.random.default_rng((seed, epoch))``, with
``set_epoch``, exact mid-epoch resume (``state_dict``) and sharding (``num_replicas``: under ``accelerator.prepare``,
which shards, use ``num_replicas=1`` and call ``set_epoch``).

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
