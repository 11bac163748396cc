"""The package's collectives over ``torch.distributed`` (torch only, so that every layer may use them): one gather
(rows may differ between processes), with or without gradient, the gather of a whole training batch, and a process's
share of a range of items. Without an initialised process group (or with one process) each reduces to the local
tensor. Used by the losses (``DistributedRankLoss``), :class:`~pml_suprank.memory.RankingMemory`, the training loop
and the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["GlobalBatch", "all_gather", "all_gather_with_grad", "gather_batch", "shard_range"]


def is_distributed(group: Any = None) -> bool:
    """True when ``torch.distributed`` is initialised with more than one process in ``group`` (``TypeError`` when
    ``group`` is neither ``None`` nor a process group)."""
    if group is not None and not (
        torch.distributed.is_available() and isinstance(group, torch.distributed.ProcessGroup)
    ):
        raise TypeError(f"process_group must be None or a torch.distributed process group; got {type(group).__name__}")
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size(group) > 1
    )


def get_world_size(group: Any = None) -> int:
    """Number of processes in ``group`` (1 without an initialised process group)."""
    return torch.distributed.get_world_size(group) if is_distributed(group) else 1


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (0 without an initialised process group)."""
    return torch.distributed.get_rank(group) if is_distributed(group) else 0


def comm_device(group: Any = None, preferred: torch.device | None = None) -> torch.device:
    """The device tensors must be on to travel through ``group``: the CPU for gloo, else ``preferred`` when it is
    not the CPU, else the current CUDA device (nccl)."""
    if torch.distributed.get_backend(group) == "gloo":
        return torch.device("cpu")
    if preferred is not None and preferred.type != "cpu":
        return preferred
    return torch.device("cuda", torch.cuda.current_device())


def gather_sizes(n: int, device: torch.device, group: Any = None) -> list[int]:
    """``[n_0, ..., n_{W-1}]``: the number of rows of every process (one collective)."""
    return _all_gather_equal(torch.tensor([n], dtype=torch.long, device=device), group).tolist()


def _all_gather_equal(tensor: Tensor, group: Any) -> Tensor:
    """``torch.distributed.all_gather`` of equally shaped tensors, concatenated in rank order."""
    parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts)


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    if x.shape[0] == rows:
        return x.contiguous()
    pad = x.new_zeros((rows - x.shape[0], *x.shape[1:]))
    return torch.cat([x, pad]).contiguous()


class _AllGatherWithGrad(torch.autograd.Function):
    """Forward: ``all_gather`` of equally shaped tensors. Backward: this slice's gradient summed over all processes
    (the semantics of ``torch.distributed.nn.functional.all_gather``, implemented with one ``all_reduce`` so that it
    works on every backend and does not depend on that deprecated module)."""

    @staticmethod
    def forward(ctx, tensor: Tensor, group: Any) -> Tensor:
        ctx.group = group
        ctx.rank = torch.distributed.get_rank(group)
        ctx.rows = tensor.shape[0]
        return _all_gather_equal(tensor, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, op=torch.distributed.ReduceOp.SUM, group=ctx.group)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows], None


def gather_rows(tensor: Tensor, sizes: list[int], group: Any = None, *, with_grad: bool = False) -> Tensor:
    """The gather itself: ``tensor`` ``(sizes[rank], ...)`` of every process concatenated in rank order ``(Σ sizes,
    ...)``, each padded to ``max(sizes)`` rows on the wire; ``with_grad`` keeps the autograd graph (backward: the
    sum over processes). Collective: every process of ``group`` calls it with the same ``sizes``."""
    rows = max(sizes)
    if with_grad:
        gathered = _AllGatherWithGrad.apply(_pad_rows(tensor, rows), group)
    else:
        gathered = _all_gather_equal(_pad_rows(tensor.detach(), rows), group)
    return torch.cat([gathered[r * rows : r * rows + n] for r, n in enumerate(sizes)])


def check_tensor(name: str, tensor: Any) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(tensor).__name__}")


def all_gather(tensor: Tensor, group: Any = None, *, with_grad: bool = False) -> Tensor:
    """``tensor`` ``(n_r, ...)`` of every process concatenated in rank order, ``(Σ_r n_r, ...)`` (the number of rows
    may differ between processes); ``tensor`` itself when not distributed. Without ``with_grad`` the result is
    detached (labels, indices, memory entries, per-query metrics); with it, it keeps the autograd graph and backward
    gives each process's slice the *sum* of the gradients of all processes (as
    ``torch.distributed.nn.functional.all_gather``)."""
    check_tensor("tensor", tensor)
    if not is_distributed(group):
        return tensor if with_grad else tensor.detach()
    return gather_rows(tensor, gather_sizes(tensor.shape[0], tensor.device, group), group, with_grad=with_grad)


def all_gather_with_grad(tensor: Tensor, group: Any = None) -> Tensor:
    """:func:`all_gather` with ``with_grad=True``."""
    return all_gather(tensor, group, with_grad=True)


def shard_range(n: int, group: Any = None) -> tuple[int, int]:
    """``(start, end)``: this process's contiguous share of ``n`` items (rank ``r`` of ``W`` gets
    ``[⌊n·r/W⌋, ⌊n·(r+1)/W⌋)``; the shares cover ``range(n)`` once, in rank order); ``(0, n)`` when not
    distributed."""
    world, rank = get_world_size(group), get_rank(group)
    return n * rank // world, n * (rank + 1) // world


def pad_label_sets(labels: Tensor, width: int) -> Tensor:
    """Multi-label sets ``(N,)`` or ``(N, M)`` as ``(N, width)``, the new columns filled with ``-1`` (padding);
    ``ValueError`` naming both sizes when ``labels`` has more than ``width`` columns."""
    labels = labels.unsqueeze(1) if labels.dim() == 1 else labels
    if labels.shape[1] > width:
        raise ValueError(
            f"labels has {labels.shape[1]} label columns, more than the {width} columns they must be padded to"
        )
    if labels.shape[1] == width:
        return labels
    return torch.cat([labels, labels.new_full((labels.shape[0], width - labels.shape[1]), -1)], dim=1)


def max_label_width(labels: Tensor, group: Any = None) -> int:
    """The largest number of label columns over the processes of ``group`` (1-D labels count as 1; collective)."""
    width = torch.tensor([1 if labels.dim() == 1 else labels.shape[1]], dtype=torch.long, device=labels.device)
    torch.distributed.all_reduce(width, op=torch.distributed.ReduceOp.MAX, group=group)
    return int(width)


@dataclass
class GlobalBatch:
    """The batch of all processes, as :func:`gather_batch` returns it.

    Attributes:
        embeddings: ``(B_global, D)``, connected to every process's graph (:func:`all_gather_with_grad`).
        labels: ``(B_global,)`` or ``(B_global, L)`` (multi-label: ``(B_global, max_r M_r)``), no gradient.
        indices: ``(B_global,)`` dataset indices, or ``None`` when none were given.
        local: ``(B_local,)`` long, the rows of this process's batch in the global one (on the embeddings' device).
    """

    embeddings: Tensor
    labels: Tensor
    indices: Tensor | None
    local: Tensor


def gather_batch(
    embeddings: Tensor, labels: Tensor, indices: Tensor | None = None, group: Any = None, *, multilabel: bool = False
) -> GlobalBatch:
    """Gather this process's batch ``embeddings`` ``(B_r, D)``, ``labels`` ``(B_r,)`` / ``(B_r, L)`` and optional
    ``indices`` ``(B_r,)`` from every process: embeddings with gradient, labels and indices without (one exchange of
    the per-process sizes serves all the gathers); the batch as is without a process group. ``multilabel``: the
    labels are ``(B_r, M_r)`` sets padded with ``-1``, padded to the largest width over the processes first."""
    check_tensor("embeddings", embeddings)
    check_tensor("labels", labels)
    device = embeddings.device
    if not is_distributed(group):
        return GlobalBatch(embeddings, labels, indices, torch.arange(embeddings.shape[0], device=device))
    if multilabel:
        labels = pad_label_sets(labels, max_label_width(labels, group))
    sizes = gather_sizes(embeddings.shape[0], device, group)
    offset = sum(sizes[: torch.distributed.get_rank(group)])
    return GlobalBatch(
        embeddings=gather_rows(embeddings, sizes, group, with_grad=True),
        labels=gather_rows(labels, sizes, group),
        indices=None if indices is None else gather_rows(indices, sizes, group),
        local=offset + torch.arange(embeddings.shape[0], device=device),
    )
