"""Exact large batches on one device: gradient-cached virtual batches for any loss, rank losses first.

A rank loss is not a sum over the items of the batch (the batch *is* the ranking), so accumulating small-batch
gradients computes another loss. Gradient caching (Gao et al., RepL4NLP 2021) gives the large-batch gradient exactly,
at the activation memory of one chunk plus the ``(N, D)`` embeddings, for one extra forward:

1. embed the ``N`` inputs chunk by chunk without an autograd graph, recording each chunk's RNG state;
2. evaluate the loss on the whole ``(N, D)`` batch of embeddings, a leaf that requires grad, and back-propagate it:
   this fills ``dL/dE`` (``N, D``) and the ``.grad`` of the loss's own parameters (proxies);
3. embed each chunk again, now with a graph and its recorded RNG state restored (the same dropout masks), and
   back-propagate ``dL/dE`` of its rows: by the chain rule ``dL/dθ = Σ_i (dL/dE_i)ᵀ dE_i/dθ``, the sum over chunks
   being exactly the full-batch backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import get_device_states, set_device_states

from .._validation import check_bool, check_positive_int

__all__ = ["cached_backward"]

Chunk = tuple[tuple[Tensor, ...], dict[str, Tensor]]  # model(*args, **kwargs)


def _split_inputs(inputs: Any) -> tuple[Chunk, int]:
    """``((args, kwargs), N)`` of ``inputs`` (``model(x)``, ``model(*x)`` or ``model(**x)``), ``N`` its dim-0 size."""
    if isinstance(inputs, Tensor):
        call, named = ((inputs,), {}), {"inputs": inputs}
    elif isinstance(inputs, Mapping):
        call, named = ((), dict(inputs)), {f"inputs[{k!r}]": v for k, v in inputs.items()}
    elif isinstance(inputs, (tuple, list)):
        call, named = (tuple(inputs), {}), {f"inputs[{i}]": v for i, v in enumerate(inputs)}
    else:
        raise TypeError(f"inputs must be a Tensor or a dict / tuple / list of Tensors; got {type(inputs).__name__}")
    if not named:
        raise ValueError(f"inputs must hold at least one Tensor; got an empty {type(inputs).__name__}")
    sizes = {}
    for name, value in named.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a Tensor (split along dim 0); got {type(value).__name__}")
        if value.dim() == 0:
            raise ValueError(f"{name} must have a batch dimension (dim 0); got a 0-d tensor")
        sizes[name] = value.shape[0]
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every tensor of inputs must have the same size along dim 0; got {sizes}")
    n = next(iter(sizes.values()))
    if n == 0:
        raise ValueError("inputs must hold at least one item; got a batch of size 0")
    return call, n


def _slice(inputs: Chunk, rows: slice) -> Chunk:
    args, kwargs = inputs
    return tuple(v[rows] for v in args), {k: v[rows] for k, v in kwargs.items()}


def _check_output(out: Any, rows: int, start: int) -> Tensor:
    if not isinstance(out, Tensor):
        raise TypeError(f"model must return a Tensor of embeddings (rows, D); got {type(out).__name__}")
    if out.dim() == 0 or out.shape[0] != rows:
        raise ValueError(
            f"model must return one embedding per input row: the chunk of rows {start}..{start + rows - 1} gave "
            f"shape {tuple(out.shape)}"
        )
    return out


def _training_batchnorms(model: nn.Module) -> dict[str, nn.Module]:
    bn = nn.modules.batchnorm._BatchNorm
    return {name or type(m).__name__: m for name, m in model.named_modules() if isinstance(m, bn) and m.training}


class _RNGState:
    """The CPU and device generators of a chunk (what ``torch.utils.checkpoint`` saves)."""

    def __init__(self, tensors: list[Tensor]) -> None:
        self.cpu = torch.get_rng_state()
        types = {t.device.type for t in tensors} - {"cpu", "meta"}
        self.device_type = next(iter(types)) if len(types) == 1 else None
        self.devices, self.states = get_device_states(*tensors) if self.device_type else ([], [])

    @contextlib.contextmanager
    def restored(self):
        """Run the block with this state; the global generators are restored afterwards."""
        kwargs = {"device_type": self.device_type} if self.device_type else {}
        with torch.random.fork_rng(devices=self.devices, **kwargs):
            torch.set_rng_state(self.cpu)
            if self.device_type:
                set_device_states(self.devices, self.states, device_type=self.device_type)
            yield


def _autocast_off(device_type: str) -> contextlib.ExitStack:
    """Disable the enabled autocast regions (CPU, CUDA, ``device_type``) for the block."""
    stack = contextlib.ExitStack()
    for kind in dict.fromkeys(("cpu", "cuda", device_type)):
        if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
            stack.enter_context(torch.autocast(kind, enabled=False))
    return stack


def _ddp_chunks_agree(model: nn.Module, num_chunks: int) -> None:
    """Under DDP every process must run the same number of chunk forwards (DDP's forward may run collectives)."""
    if not isinstance(model, DistributedDataParallel):
        return
    counts = torch.tensor([num_chunks, -num_chunks], dtype=torch.long, device=next(model.parameters()).device)
    torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.MAX, group=model.process_group)
    if int(counts[0]) != num_chunks or -int(counts[1]) != num_chunks:
        raise ValueError(
            f"with a DistributedDataParallel model every process must split its batch into the same number of "
            f"chunks; this process has {num_chunks}, the processes range over {-int(counts[1])}..{int(counts[0])} "
            "(use equal local batches, or a chunk_size that gives the same count)"
        )


def _embed_without_graph(model: nn.Module, inputs: Chunk, bounds: list[slice]) -> tuple[list[_RNGState], list[Tensor]]:
    """Pass 1: the embeddings of every chunk without a graph, and the RNG state before each chunk."""
    states, outputs = [], []
    with torch.no_grad():
        for rows in bounds:
            args, kwargs = _slice(inputs, rows)
            states.append(_RNGState([*args, *kwargs.values()]))
            outputs.append(_check_output(model(*args, **kwargs), rows.stop - rows.start, rows.start).detach())
    return states, outputs


def _backward_chunks(
    model: nn.Module, inputs: Chunk, bounds: list[slice], states: list[_RNGState], grad: Tensor
) -> None:
    """Pass 2: each chunk again, with a graph and its RNG state, back-propagating its rows of ``grad`` (``dL/dE``);
    DDP synchronises at the last chunk; BatchNorm running statistics keep the first pass's update."""
    norms = list(_training_batchnorms(model).values())
    saved = [{k: b.clone() for k, b in m.named_buffers(recurse=False) if b is not None} for m in norms]
    last = len(bounds) - 1
    for i, (rows, state) in enumerate(zip(bounds, states, strict=True)):
        sync = model.no_sync() if isinstance(model, DistributedDataParallel) and i < last else contextlib.nullcontext()
        with sync, state.restored():
            args, kwargs = _slice(inputs, rows)
            out = model(*args, **kwargs)
            with _autocast_off(out.device.type):
                torch.autograd.backward(out, grad_tensors=grad[rows].to(out.dtype))
    with torch.no_grad():
        for m, buffers in zip(norms, saved, strict=True):
            for k, value in buffers.items():
                getattr(m, k).copy_(value)


def cached_backward(
    model: nn.Module,
    loss_fn: Callable[..., Tensor],
    inputs: Tensor | Mapping[str, Tensor] | Sequence[Tensor],
    labels: Tensor,
    *,
    chunk_size: int,
    allow_batchnorm: bool = False,
    backward: Callable[[Tensor], Any] | None = None,
    **loss_kwargs: Any,
) -> Tensor:
    """Backward of ``loss_fn(model(inputs), labels)`` on a batch of ``N`` items, embedding ``chunk_size`` at a time.

    Every parameter of ``model`` and ``loss_fn`` then holds (accumulates) the ``.grad`` of
    ``loss_fn(torch.cat([model(c) for c in chunks(inputs)]), labels, **loss_kwargs).backward()`` with at most one
    chunk's activations alive (see the module docstring). Training-mode BatchNorm is refused unless
    ``allow_batchnorm=True`` (approximate). Under mixed precision call it inside
    ``accelerator.autocast()`` with ``backward=accelerator.backward``. A DDP ``model`` synchronises once, at the last
    chunk; every process must use the same number of chunks.

    Args:
        model: Maps a chunk of ``inputs`` to its embeddings ``(rows, D)``.
        loss_fn: ``loss_fn(embeddings (N, D), labels, **loss_kwargs) -> scalar``.
        inputs: ``(N, ...)`` tensor (``model(x)``), or tuple / list (``model(*x)``) or dict (``model(**x)``) of
            tensors of the same size ``N`` along dim 0.
        labels: The labels of the ``N`` items (a tensor with ``N`` rows), passed whole to ``loss_fn``.
        chunk_size: Rows embedded at a time (``>= N``: one chunk).
        allow_batchnorm: Accept BatchNorm layers in training mode (approximate).
        backward: Called as ``backward(loss)`` instead of ``loss.backward()`` (e.g. ``accelerator.backward``).
        **loss_kwargs: Extra keyword arguments of ``loss_fn``.

    Returns:
        The loss value, detached (a 0-d tensor).

    Example:
        >>> loss = cached_backward(model, losses.ROADMAPLoss(), images, labels, chunk_size=64)  # images: (1024, ...)
        >>> optimizer.step()
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(embeddings, labels, **loss_kwargs); got {loss_fn!r}")
    chunk_size = check_positive_int("chunk_size", chunk_size)
    inputs, n = _split_inputs(inputs)
    if not isinstance(labels, Tensor):
        raise TypeError(f"labels must be a Tensor with one row per input; got {type(labels).__name__}")
    if labels.dim() == 0 or labels.shape[0] != n:
        raise ValueError(f"labels must have one row per input (N={n} rows); got shape {tuple(labels.shape)}")
    check_bool("allow_batchnorm", allow_batchnorm)
    if backward is not None and not callable(backward):
        raise TypeError(f"backward must be callable as backward(loss) or None; got {backward!r}")
    bn = list(_training_batchnorms(model))
    if bn and not allow_batchnorm:
        raise ValueError(
            "cached_backward cannot reproduce full-batch BatchNorm: the model has BatchNorm layers in training mode "
            f"({', '.join(bn[:3])}{', ...' if len(bn) > 3 else ''}); put them in eval mode (frozen statistics) or "
            "pass allow_batchnorm=True to accept chunk statistics (approximate)"
        )
    bounds = [slice(lo, min(lo + chunk_size, n)) for lo in range(0, n, chunk_size)]
    _ddp_chunks_agree(model, len(bounds))

    states, outputs = _embed_without_graph(model, inputs, bounds)
    embeddings = torch.cat(outputs).requires_grad_(True)
    del outputs

    # the loss on the whole batch: dL/dE and the loss parameters' gradients
    loss = loss_fn(embeddings, labels, **loss_kwargs)
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise ValueError(f"loss_fn must return a scalar Tensor; got {type(loss).__name__} {getattr(loss, 'shape', '')}")
    if not loss.requires_grad:
        raise ValueError("loss_fn returned a loss that does not require grad: nothing to back-propagate")
    with _autocast_off(embeddings.device.type):  # backward outside autocast, as with a plain forward
        (backward or Tensor.backward)(loss)
    grad = embeddings.grad
    if grad is None:  # the loss does not depend on the embeddings: the model gets no gradient, as with backward()
        return loss.detach()

    _backward_chunks(model, inputs, bounds, states, grad)
    return loss.detach()
