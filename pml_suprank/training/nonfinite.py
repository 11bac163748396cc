"""Non-finite training steps: as AMP's ``GradScaler`` does, for every precision, a step whose loss or gradient norm
``‖g‖₂ = sqrt(Σᵢ ‖gᵢ‖₂²)`` is NaN / ±inf makes no optimizer nor scheduler step; more than
``TrainingConfig.max_nonfinite_steps`` in a row raise :class:`NonFiniteTrainingError` after a checkpoint of the last
good state. Non-finite embeddings never reach the loss (:func:`finite_or_zero`, :func:`nan_unless`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .checkpoint import latest_valid_checkpoint

__all__ = [
    "NonFiniteSteps",
    "NonFiniteTrainingError",
    "finite_or_zero",
    "grad_norm",
    "nan_unless",
    "step_if_finite",
    "stop_error",
]


class NonFiniteTrainingError(RuntimeError):
    """A training run stopped because more than ``max_nonfinite_steps`` consecutive steps had a non-finite loss or
    gradient; the message says at which step, which checkpoint holds the last good state and what to change."""


def finite_or_zero(embeddings: Tensor, distributed: bool = False) -> tuple[Tensor, Tensor]:
    """``(embeddings or zeros (B, D), ok)``: ``ok`` the 0-d bool "all finite" (over every process with
    ``distributed``), no host read."""
    ok = torch.isfinite(embeddings).all()
    if distributed:
        flag = ok.to(torch.int32).reshape(1)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        ok = flag.reshape(()).bool()
    return torch.where(ok, embeddings, torch.zeros_like(embeddings)), ok


def nan_unless(ok: Tensor, loss: Tensor) -> Tensor:
    """``loss`` where the 0-d bool ``ok`` holds, NaN otherwise."""
    return torch.where(ok, loss, torch.full_like(loss, math.nan))


def grad_norm(parameters: Iterable[nn.Parameter]) -> Tensor:
    """``‖g‖₂ = sqrt(Σᵢ ‖gᵢ‖₂²)`` over the gradients of ``parameters``: a 0-d float32 tensor on the first gradient's
    device (``0`` without gradients), no host synchronisation (``get_total_norm`` is newer than torch 2.4)."""
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            grad = p.grad.coalesce().values() if p.grad.is_sparse else p.grad
            groups.setdefault((grad.device, grad.dtype), []).append(grad)
    if not groups:
        return torch.zeros(())
    device = next(iter(groups))[0]
    norms = [n.to(device, torch.float32) for grads in groups.values() for n in torch._foreach_norm(grads, 2.0)]
    return torch.linalg.vector_norm(torch.stack(norms))


def step_if_finite(
    accelerator: Any,
    optimizer: Any,
    scheduler: Any,
    loss: Tensor,
    parameters: Iterable[nn.Parameter],
    grad_clip: float | None,
) -> tuple[float, float, bool]:
    """After ``accelerator.backward``: the optimizer (and ``scheduler``, unless ``None``) step when the loss and the
    gradient norm (clipped to ``grad_clip``, fp16 gradients unscaled) are finite; gradients zeroed either way. A step
    fp16's ``GradScaler`` skips counts as skipped. Returns ``(loss, gradient norm, stepped)``, read in one transfer."""
    params = list(parameters)
    norm = accelerator.clip_grad_norm_(params, grad_clip) if grad_clip is not None else None  # the norm before clipping
    if not isinstance(norm, Tensor):
        if grad_clip is None and getattr(accelerator, "scaler", None) is not None:  # fp16: unscale as step() would
            accelerator.scaler.unscale_(getattr(optimizer, "optimizer", optimizer))
        norm = grad_norm(params)
    norm = norm.detach().reshape(()).float()
    value, norm_value = torch.stack([loss.detach().reshape(()).float(), norm.to(loss.device)]).tolist()  # one read
    stepped = math.isfinite(value) and math.isfinite(norm_value)
    if stepped:
        optimizer.step()
        stepped = not getattr(optimizer, "step_was_skipped", False)  # fp16: the GradScaler found an inf itself
    elif getattr(accelerator, "scaler", None) is not None:
        accelerator.scaler.update()  # fp16: the inf checks were recorded by unscale_; back the scale off
    if stepped and scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return value, norm_value, stepped


def stop_error(trainer: Any, loss: float, norm: float, bar: Any = None) -> NonFiniteTrainingError:
    """The error ending a :class:`~pml_suprank.training.Trainer` run, after closing ``bar`` and checkpointing the
    last finite state (unless buffers are non-finite: then the newest valid checkpoint is named). Every process."""
    if bar is not None:
        bar.close()
    acc = trainer.accelerator
    module = acc.unwrap_model(trainer.loss_module)
    ok = all(bool(t.isfinite().all()) for t in module.state_dict().values() if t.is_floating_point())
    if int(acc.gather(torch.tensor([int(ok)], device=acc.device)).min()) == 1:  # the same answer on every process
        saved = f"saved in checkpoint {trainer.save_checkpoint()}"
    else:
        latest = latest_valid_checkpoint(trainer.output_dir, acc.print, trainer._check_files)
        saved = (f"not saved (the weights, the BatchNorm statistics or the memory hold non-finite values; newest valid "
                 f"one: {latest})")  # fmt: skip
    n, step = trainer.nonfinite, trainer.progress.global_step
    good = step - n.consecutive
    weights = f"those after step {good} (the last finite one)" if good else "the initial ones (no step was finite)"
    return NonFiniteTrainingError(
        f"training stopped at step {step}: {_steps(n.consecutive)} in a row had a non-finite loss or gradient "
        f"(the last: loss {loss:.4g}, gradient norm {norm:.4g}), more than max_nonfinite_steps={n.limit}; "
        f"{_steps(n.skipped)} skipped in all. The weights are {weights}, {saved}. To make the steps finite, "
        f"train with --mixed_precision no (this run: {getattr(acc, 'mixed_precision', 'no')}), a lower learning "
        "rate (--lr_backbone / --lr_head / --lr_proxies) or --grad_clip (e.g. 1.0), continuing with --resume latest "
        "--resume_ignore_config true; or allow more non-finite steps in a row with --max_nonfinite_steps"
    )


@dataclass
class NonFiniteSteps:
    """The skipped-step counters of a run (in ``trainer_state.json``): ``skipped`` in all, ``consecutive`` up to
    now; more than ``limit`` (``max_nonfinite_steps``) in a row stop the run."""

    limit: int
    skipped: int = 0
    consecutive: int = 0

    def record(self, finite: bool, step: int, loss: float, norm: float, note: Callable[[str], None]) -> bool:
        """Count step ``step`` (``note`` a skipped one); ``True`` when the run must stop."""
        if finite:
            self.consecutive = 0
            return False
        self.skipped += 1
        self.consecutive += 1
        note(
            f"step {step}: non-finite {_what(loss, norm)} (loss {loss:.4g}, gradient norm {norm:.4g}): step skipped, "
            f"weights unchanged ({self.consecutive} in a row, at most {self.limit} allowed; {self.skipped} skipped in "
            "all)"
        )
        return self.consecutive > self.limit

    def state(self) -> dict[str, int]:
        """The ``trainer_state.json`` entries."""
        return {"skipped_nonfinite_steps": self.skipped, "consecutive_nonfinite_steps": self.consecutive}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore from a validated trainer state."""
        self.skipped = int(state.get("skipped_nonfinite_steps", 0))
        self.consecutive = int(state.get("consecutive_nonfinite_steps", 0))


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _what(loss: float, norm: float) -> str:
    return "loss" if not math.isfinite(loss) else "gradient" if not math.isfinite(norm) else "step"
