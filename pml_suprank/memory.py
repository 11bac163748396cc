"""Cross-batch memories (XBM, Wang et al., CVPR 2020) for rank losses: :class:`RankingMemory` (resumable,
distributed-aware) and :class:`CrossBatchMemory` (PML's class extended to this package's rank losses).

A memory of past (detached) embeddings enlarges the reference set of a non-decomposable rank loss at almost no cost
(SupRank TPAMI 2025, Sec. 5 / Tab. III). ``RankingMemory`` follows the SupRank reference XBM: enqueue, then get
(or ``get_first=True``), each query's copy removed from its reference set unless the loss has ``include_self=True``;
the loss is ``(batch_weight · L(batch, ref = batch) + memory_weight · L(batch, ref = memory)) / (batch_weight +
memory_weight)``, only the in-batch term (and no enqueue) for the first ``warmup_steps`` calls. Its state is buffers
only (``state_dict`` resumes bit-identically; ``eval()`` reads without writing). Distributed, the global batch is
enqueued (:func:`pml_suprank.collectives.gather_batch`) and both terms are normalised over all processes
(:func:`pml_suprank.losses.reference_loss`), equal to the single-process run.

Labels are ``(B,)`` or hierarchical ``(B, L)``; a multi-label loss
(:func:`~pml_suprank.losses.distributed_rank_loss.is_multilabel_loss`, never the labels' shape) takes ``(B, W)``
sets padded with ``-1``, the memory growing to the widest batch unless ``label_levels`` fixed ``W``.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from pytorch_metric_learning.losses import CrossBatchMemory as _PMLCrossBatchMemory
from torch import Tensor, nn

from ._validation import (
    check_bool,
    check_choice,
    check_device,
    check_embeddings,
    check_labels,
    check_positive,
    check_positive_int,
)
from .collectives import GlobalBatch, gather_batch, is_distributed, pad_label_sets
from .losses.distributed_rank_loss import is_multilabel_loss, pairs_without_self, reference_loss

__all__ = ["CrossBatchMemory", "RankingMemory"]

MemoryMode = Literal["fifo", "index"]


class RankingMemory(nn.Module):
    """Cross-batch memory of detached embeddings and labels for any rank (or PML pair) loss.

    Args:
        loss: called as ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)`` (any pml_suprank loss, or a
            PML loss accepting ``ref_emb``).
        embedding_size, memory_size: ``D`` and the number of slots ``M`` (``mode="index"``: the dataset size).
        warmup_steps: training calls during which only the in-batch loss is used and nothing is enqueued.
        mode: ``"fifo"`` (ring buffer; a batch larger than the memory keeps its last rows) or ``"index"`` (one
            slot per dataset index holding its latest embedding; ``forward`` needs ``indices``).
        batch_weight, memory_weight: weights of the in-batch loss (``0``: memory term only) and of the memory term.
        label_levels: ``None`` (from the first batch) or ``L`` for ``(M, L)`` labels (``1`` → 1-D); with a
            multi-label loss, the fixed width ``W`` of the label sets (``None``: grows to the widest batch).
        get_first: compute the memory term *before* the batch is written (the reference XBM's ``get_first``); in
            ``"index"`` mode the query's own older slot is then excluded.
        distributed, group: gather across the processes of ``group`` (``None``: with > 1 process).
        device, dtype: of the buffers; the embeddings are stored in ``dtype`` (float32, as the reference's XBM).
    """

    def __init__(
        self,
        loss: nn.Module,
        embedding_size: int,
        memory_size: int,
        warmup_steps: int = 0,
        *,
        mode: MemoryMode = "fifo",
        batch_weight: float = 1.0,
        memory_weight: float = 1.0,
        label_levels: int | None = None,
        get_first: bool = False,
        distributed: bool | None = None,
        group: Any = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if not isinstance(loss, nn.Module):
            raise TypeError(f"loss must be an nn.Module loss (e.g. pml_suprank.losses.SupAPLoss()); got {loss!r}")
        self.loss = loss
        self.embedding_size = check_positive_int("embedding_size", embedding_size, minimum=1)
        self.memory_size = check_positive_int("memory_size", memory_size, minimum=1)
        self.warmup_steps = check_positive_int("warmup_steps", warmup_steps, minimum=0)
        self.mode = check_choice("mode", mode, get_args(MemoryMode))
        self.batch_weight = check_positive("batch_weight", batch_weight, strict=False)
        self.memory_weight = check_positive("memory_weight", memory_weight)
        check_positive_int("label_levels", label_levels, allow_none=True)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype; got {dtype!r}")
        self.get_first = check_bool("get_first", get_first)
        device = check_device("device", device)
        self.distributed = distributed
        self.group = group
        label_shape = (self.memory_size,) if not label_levels or label_levels == 1 else (self.memory_size, label_levels)
        self._label_levels_fixed = label_levels is not None
        self.register_buffer(
            "embeddings", torch.zeros(self.memory_size, self.embedding_size, device=device, dtype=dtype)
        )
        self.register_buffer("labels", torch.zeros(label_shape, dtype=torch.long, device=device))
        self.register_buffer("filled", torch.zeros(self.memory_size, dtype=torch.bool, device=device))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer("step", torch.zeros((), dtype=torch.long, device=device))
        self.last_losses: dict[str, Tensor] = {}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _fit_label_buffer(self, "labels", state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def reset(self) -> None:
        """Empty the memory and restart the step counter (warm-up included)."""
        self.filled.zero_()
        self.ptr.zero_()
        self.step.zero_()

    @property
    def num_filled(self) -> int:
        """Number of slots holding an embedding."""
        return int(self.filled.sum())

    @property
    def is_active(self) -> bool:
        """True once the warm-up is over (the memory term is used and the memory is written)."""
        return int(self.step) >= self.warmup_steps

    def extra_repr(self) -> str:
        return (
            f"embedding_size={self.embedding_size}, memory_size={self.memory_size}, mode={self.mode!r}, "
            f"warmup_steps={self.warmup_steps}, batch_weight={self.batch_weight}, memory_weight={self.memory_weight}"
        )

    def _check_batch(self, embeddings: Tensor, labels: Tensor, indices: Tensor | None) -> tuple[Tensor, Tensor | None]:
        _check_width(embeddings, self.embedding_size)
        check_labels("labels", labels, embeddings.shape[0])
        want = tuple(self.labels.shape[1:])
        if self.multilabel:  # widths are reconciled by _fit_label_width (after the distributed gather)
            labels = labels.unsqueeze(1) if labels.dim() == 1 else labels
        elif tuple(labels.shape[1:]) != want:
            if self._label_levels_fixed or bool(self.filled.any()):
                raise ValueError(
                    f"labels must have shape (B,{' ' + str(want[0]) if want else ''}) like the labels already in the "
                    f"memory; got shape {tuple(labels.shape)}"
                )
            self.labels = self.labels.new_zeros((self.memory_size, *labels.shape[1:]))
        if indices is None:
            if self.mode == "index":
                raise ValueError("mode='index' (one slot per dataset index) needs indices (B,) of the batch; got None")
            return labels.to(self.labels.device), None
        indices = check_labels("indices", indices, embeddings.shape[0], allow_2d=False).to(self.filled.device)
        if (
            self.mode == "index"
            and indices.numel()
            and not 0 <= int(indices.min()) <= int(indices.max()) < self.memory_size
        ):
            raise ValueError(
                f"indices must lie in [0, memory_size - 1] = [0, {self.memory_size - 1}] with mode='index'; got "
                f"values in [{int(indices.min())}, {int(indices.max())}]"
            )
        return labels.to(self.labels.device), indices.long()

    @property
    def multilabel(self) -> bool:
        """True when the wrapped loss takes multi-label label sets (:func:`is_multilabel_loss`)."""
        return is_multilabel_loss(self.loss)

    def _fit_label_width(self, labels: Tensor) -> Tensor:
        """Multi-label mode: pad ``labels`` ``(B, W_b)`` or grow the ``(M, W)`` buffer so both have one width."""
        if not self.multilabel:
            return labels
        buffer = self.labels if self.labels.dim() == 2 else self.labels[:, None]  # 1-D: sets of one label
        width, incoming = buffer.shape[1], labels.shape[1]
        if incoming > width and self._label_levels_fixed:
            raise ValueError(
                f"labels has {incoming} label columns but the memory stores label sets of width "
                f"label_levels={width}; pad the sets to at most {width} columns or build the memory with "
                f"label_levels >= {incoming}"
            )
        if incoming > width and not bool(self.filled.any()):
            buffer = buffer.new_full((self.memory_size, incoming), -1)
        self.labels = pad_label_sets(buffer, max(width, incoming))
        return pad_label_sets(labels, self.labels.shape[1])

    @torch.no_grad()
    def enqueue(self, embeddings: Tensor, labels: Tensor, indices: Tensor | None = None) -> Tensor:
        """Write a (detached) batch ``embeddings`` ``(B, D)``, ``labels`` ``(B,)`` / ``(B, L)``, ``indices`` ``(B,)``
        (required by ``mode="index"``) into the memory, without loss or gathering; returns the ``(B,)`` slot of every
        row (``-1``: not kept, a FIFO batch larger than the memory)."""
        labels, indices = self._check_batch(embeddings, labels, indices)
        return self._write(embeddings.detach(), self._fit_label_width(labels), indices)

    def _write(self, embeddings: Tensor, labels: Tensor, indices: Tensor | None) -> Tensor:
        B, M = embeddings.shape[0], self.memory_size
        device = self.filled.device
        if self.mode == "index":
            slots = indices.to(device)
        else:
            start = int(self.ptr)
            slots = (start + torch.arange(B, device=device)) % M
            if B > M:  # only the last M rows survive
                slots = torch.where(torch.arange(B, device=device) >= B - M, slots, torch.full_like(slots, -1))
            self.ptr.fill_((start + B) % M)
        kept = slots >= 0
        rows = torch.nonzero(kept, as_tuple=True)[0]
        if self.mode == "index" and rows.numel() > 1:
            # repeated dataset indices: the last row wins (as sequential writes would), deterministically
            last = torch.full((M,), -1, dtype=torch.long, device=device)
            last = last.scatter_reduce(0, slots[rows], rows, reduce="amax")
            rows = rows[last[slots[rows]] == rows]
        self.embeddings[slots[rows]] = embeddings[rows].to(self.embeddings.dtype)
        self.labels[slots[rows]] = labels[rows].to(self.labels.device)
        self.filled[slots[rows]] = True
        return slots

    def get(self) -> tuple[Tensor, Tensor]:
        """The filled part of the memory: ``(embeddings (K, D), labels (K,) or (K, L))`` (views when possible)."""
        return self._reference()[:2]

    def _reference(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Filled rows and, when they are a copy, the map slot -> row (``None``: row == slot)."""
        n = self.num_filled
        if n == self.memory_size:
            return self.embeddings, self.labels, None
        if self.mode == "fifo" and bool(self.filled[:n].all()):
            return self.embeddings[:n], self.labels[:n], None
        row_of_slot = torch.cumsum(self.filled.long(), 0) - 1
        return self.embeddings[self.filled], self.labels[self.filled], row_of_slot

    def _reference_loss(self, queries, labels, ref, ref_labels, self_index, use_dist: bool) -> Tensor:
        if use_dist:
            return reference_loss(self.loss, queries, labels, ref, ref_labels, self_index=self_index, group=self.group)
        pairs = None if self_index is None else pairs_without_self(labels, ref_labels, self_index)
        return self.loss(queries, labels, pairs, ref, ref_labels)

    def forward(self, embeddings: Tensor, labels: Tensor, indices: Tensor | None = None) -> Tensor:
        """Scalar ``(batch_weight · L(batch) + memory_weight · L(batch, ref = memory)) / (batch_weight +
        memory_weight)`` of this process's ``embeddings`` ``(B, D)`` (with gradient), ``labels`` ``(B,)`` / ``(B, L)``
        and ``indices`` ``(B,)`` (needed by ``mode="index"``); ``last_losses`` holds the detached terms."""
        labels, indices = self._check_batch(embeddings, labels, indices)
        labels = labels.to(embeddings.device)
        use_dist = self.distributed is not False and is_distributed(self.group)
        exclude_self = not getattr(self.loss, "include_self", False)
        if use_dist:
            batch = gather_batch(embeddings, labels, indices, group=self.group, multilabel=self.multilabel)
        else:
            batch = GlobalBatch(
                embeddings, labels, indices, torch.arange(embeddings.shape[0], device=embeddings.device)
            )
        all_emb, all_labels, all_indices, local = batch.embeddings, batch.labels, batch.indices, batch.local
        if self.multilabel:  # one width for the batch, the gathered batch and the memory
            all_labels = self._fit_label_width(all_labels)
            labels = pad_label_sets(labels, all_labels.shape[1])

        active, training = self.is_active, self.training
        if training:
            self.step += 1
        terms: dict[str, Tensor] = {}
        if active:
            slots = None
            if training and not self.get_first:
                slots = self._write(all_emb.detach(), all_labels, all_indices).to(embeddings.device)[local]
            elif self.mode == "index" and exclude_self:  # the query's own (older) slot, when it is filled
                slots = all_indices.to(embeddings.device)[local]
                slots = torch.where(self.filled[slots.to(self.filled.device)].to(slots.device), slots, -1)
            if self.num_filled:  # not on an empty memory (get_first, or eval mode before anything was written)
                ref, ref_labels, row_of_slot = self._reference()
                if training and self.get_first:  # the buffers are written below, before backward: keep this step's
                    ref, ref_labels = ref.clone(), ref_labels.clone()
                if slots is not None and row_of_slot is not None:
                    slots = torch.where(slots >= 0, row_of_slot.to(slots.device)[slots.clamp(min=0)], slots)
                ref, ref_labels = ref.to(embeddings.device), ref_labels.to(embeddings.device)
                self_index = slots if exclude_self else None
                terms["memory"] = self._reference_loss(embeddings, labels, ref, ref_labels, self_index, use_dist)
            if training and self.get_first:
                self._write(all_emb.detach(), all_labels, all_indices)
        if "memory" not in terms or self.batch_weight:
            if use_dist:
                self_index = local if exclude_self else None
                terms["batch"] = self._reference_loss(embeddings, labels, all_emb, all_labels, self_index, True)
            else:
                terms["batch"] = self.loss(embeddings, labels)
        self.last_losses = {k: v.detach() for k, v in terms.items()}
        if "memory" not in terms or "batch" not in terms:
            return terms["memory"] if "memory" in terms else terms["batch"]
        total = self.batch_weight + self.memory_weight
        return (self.batch_weight * terms["batch"] + self.memory_weight * terms["memory"]) / total


def _check_width(embeddings: Tensor, embedding_size: int, asynchronous: bool = False) -> None:
    """:func:`~pml_suprank._validation.check_embeddings`, then ``ValueError`` unless ``(B, embedding_size)``."""
    check_embeddings("embeddings", embeddings, asynchronous=asynchronous)
    if embeddings.shape[1] != embedding_size:
        raise ValueError(
            f"embeddings must have shape (B, embedding_size={embedding_size}); got shape {tuple(embeddings.shape)}"
        )


def _fit_label_buffer(module: nn.Module, name: str, state_dict: dict[str, Tensor], prefix: str) -> None:
    """Before loading ``state_dict``: give the label buffer ``name`` the saved shape (``(M, L)`` levels or ``(M, W)``
    label sets saved into a fresh memory); ``ValueError`` unless it is ``(M,)`` or ``(M, L)``."""
    saved, current = state_dict.get(prefix + name), getattr(module, name)
    if saved is None or saved.shape == current.shape:
        return
    if saved.dim() not in (1, 2) or saved.shape[0] != current.shape[0]:
        raise ValueError(
            f"state_dict['{prefix}{name}'] must have shape ({current.shape[0]},) or ({current.shape[0]}, L); got "
            f"{tuple(saved.shape)}"
        )
    setattr(module, name, torch.zeros(saved.shape, dtype=current.dtype, device=current.device))


#: the package's loss bases whose subclasses rank against a memory (matched by name: no import of the losses)
_RANK_LOSS_BASES = ("BaseRankLoss", "CombinedRankLoss", "CalibrationLoss")


class CrossBatchMemory(_PMLCrossBatchMemory):
    """Drop-in for ``pytorch_metric_learning.losses.CrossBatchMemory(loss, embedding_size, memory_size=1024,
    miner=None)`` that also accepts every loss deriving from a class named ``BaseRankLoss``, ``CombinedRankLoss`` or
    ``CalibrationLoss``. PML's behaviour: the batch is enqueued (detached), then the loss is called as
    ``loss(embeddings, labels, pairs, memory_embeddings, memory_labels)``, ``pairs`` omitting each query's own copy.

    Multi-label losses (``relevance="multilabel"`` or ``multilabel="per_label"``, never the labels' shape) take
    ``(B, W)`` sets padded with ``-1``: the label memory becomes ``(memory_size, W)``, grown to a wider batch; pairs
    (and a miner) see column 0 of the sets, the rank losses their union.
    """

    def __init__(self, loss: nn.Module, embedding_size: int, memory_size: int = 1024, miner: Any = None, **kwargs):
        check_positive_int("embedding_size", embedding_size)
        check_positive_int("memory_size", memory_size)
        name = type(loss).__name__
        if not any(c.__name__ in _RANK_LOSS_BASES for c in type(loss).__mro__):
            if name not in _PMLCrossBatchMemory.supported_losses():  # PML's list (PML raises a bare Exception)
                raise ValueError(
                    f"loss must be a pml_suprank rank loss (a subclass of {' / '.join(_RANK_LOSS_BASES)}) or one of "
                    f"PML's CrossBatchMemory losses {_PMLCrossBatchMemory.supported_losses()}; got {name} (proxy "
                    "losses such as ClusterLoss have no reference set to enlarge)"
                )
        super().__init__(loss, embedding_size, memory_size, miner, **kwargs)

    @classmethod
    def check_loss_support(cls, loss_name: str) -> None:
        """Checked in ``__init__`` on the loss's bases, not its name."""

    multilabel = RankingMemory.multilabel

    def forward(self, embeddings, labels, indices_tuple=None, enqueue_mask=None):
        """PML's ``forward``; multi-label sets ``(B, W)`` and the memory are first padded to one width. The batch is
        checked first: ``embeddings`` ``(B, embedding_size)``, ``labels`` ``(B,)`` (``(B, W)`` sets for a multi-label
        loss), at most ``memory_size`` rows enqueued, ``enqueue_mask`` a ``(B,)`` bool tensor."""
        self._check_batch(embeddings, labels, enqueue_mask)
        if self.multilabel and isinstance(labels, torch.Tensor):
            memory = self.label_memory if self.label_memory.dim() == 2 else self.label_memory[:, None]
            width = max(memory.shape[1], labels.shape[1] if labels.dim() == 2 else 1)
            self.label_memory = pad_label_sets(memory, width)
            labels = pad_label_sets(labels.to(memory.device), width)
        return super().forward(embeddings, labels, indices_tuple, enqueue_mask)

    def _check_batch(self, embeddings: Any, labels: Any, enqueue_mask: Any) -> None:
        """``ValueError`` / ``TypeError`` naming the argument for a batch PML would fail on deep inside (or store
        wrongly)."""
        _check_width(embeddings, self.embedding_size, asynchronous=True)  # no host read per step on accelerators
        if not self.multilabel and isinstance(labels, Tensor) and labels.dim() == 2:
            raise ValueError(
                f"labels must have shape (B,) == ({embeddings.shape[0]},): CrossBatchMemory stores one label per slot "
                f"(PML's memory); got shape {tuple(labels.shape)} (for hierarchical (B, L) labels use RankingMemory, "
                "or build the loss with hierarchy= and pass the fine labels)"
            )
        check_labels("labels", labels, embeddings.shape[0], allow_2d=self.multilabel)
        if enqueue_mask is None:
            enqueued = embeddings.shape[0]
        else:
            if not isinstance(enqueue_mask, Tensor) or enqueue_mask.dtype != torch.bool:
                got = enqueue_mask.dtype if isinstance(enqueue_mask, Tensor) else type(enqueue_mask).__name__
                raise TypeError(f"enqueue_mask must be a bool torch.Tensor; got {got}")
            if tuple(enqueue_mask.shape) != (embeddings.shape[0],):
                raise ValueError(
                    f"enqueue_mask must have shape (B,) == ({embeddings.shape[0]},); got {tuple(enqueue_mask.shape)}"
                )
            enqueued = int(enqueue_mask.sum())
        if enqueued > self.memory_size:
            raise ValueError(
                f"a batch enqueues at most memory_size={self.memory_size} rows; got {enqueued} (use a larger "
                "memory_size, or RankingMemory, which keeps the last rows of a larger batch)"
            )

    def create_indices_tuple(self, embeddings, labels, E_mem, L_mem, input_indices_tuple, do_remove_self_comparisons):
        """PML's pairs, built from column 0 of multi-label sets (the rank losses use their union)."""
        if self.multilabel and labels.dim() == 2:
            labels, L_mem = labels[:, 0], L_mem[:, 0]
        return super().create_indices_tuple(
            embeddings, labels, E_mem, L_mem, input_indices_tuple, do_remove_self_comparisons
        )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _fit_label_buffer(self, "label_memory", state_dict, prefix)  # a multi-label (M, W) memory
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
