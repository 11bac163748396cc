"""A module in evaluation mode for a block of code, every submodule's mode restored after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["eval_mode"]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model.eval()`` for the ``with`` block; afterwards (also after an exception) each submodule is back in the
    mode it was in. Restoring with ``model.train(was_training)`` would set every submodule to the parent's mode: a
    BatchNorm frozen in a training model (``RetrievalModel.freeze_batch_norm``) would start updating its statistics."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
