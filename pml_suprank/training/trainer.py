"""The training loop shared by the recipes: :class:`Trainer`, metric learning with rank losses under any
``accelerate launch`` configuration (the single-process gradient: :class:`~.loss_module.LossModule`), with exact
resume, skipped non-finite steps and the final folder.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..metrics import RetrievalEvaluator
from ..metrics.report import format_metrics
from . import checkpoint, run_folder
from .config import TrainingConfig
from .export import write_final_folder
from .loaders import (
    SeededAugmentation,
    build_memory,
    build_sampler,
    dataset_labels,
    embed_loader,
    make_loader,
)
from .loss_module import LossModule, backward_step
from .nonfinite import NonFiniteSteps, step_if_finite, stop_error
from .optim import apply_group_settings, build_optimizer, build_scheduler
from .optimizer_state import optimizer_state_indices
from .pca_init import init_projection_if_requested

__all__ = ["Trainer"]

EpochCallback = Callable[["Trainer", int, "dict[str, float] | None"], None]


@dataclass
class _Progress:
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Run:
    """State of one ``train()`` invocation (not checkpointed)."""

    bar: Any = None
    steps: int = 0
    stopped: bool = False
    loss_sum: float = 0.0  # the finite losses since the last log
    loss_n: int = 0
    logged_steps: int = 0  # steps since the last log
    t0: float = field(default_factory=time.perf_counter)


class Trainer:
    """Train an embedding model with a rank loss under Accelerate; evaluate, checkpoint, resume, export.

    Parameter groups ``backbone`` / ``head`` / ``proxies`` have their own learning rates; warm-up epochs freeze the
    backbone, then a cosine schedule runs. Checkpoints resume exactly (weights, optimizer, scheduler, memory, RNG
    states, sampler position; each item's augmentation is seeded by ``(seed, epoch, index)``).

    Args:
        accelerator: An ``accelerate.Accelerator``.
        model: Maps images to L2-normalised ``(B, D)`` embeddings (``RetrievalModel``).
        loss: A PML-style ``loss(embeddings, labels)``.
        train_dataset: Items ``{"image", "labels", "index"}``, attribute ``labels (N, L)`` (``pml_suprank.data``).
        config: :class:`TrainingConfig`.
        test_dataset: Dataset for evaluation (same contract).
        evaluator: Default ``RetrievalEvaluator(config.k_values, config.alpha)``.
        memory: ``RankingMemory`` wrapping ``loss``; default from ``config.memory_size`` (none when 0).
        sampler: Batch sampler; default from ``config.sampler``, sharded over the processes.
        run_options: The resolved model / data / loss sections (JSON-able): part of the run fingerprint.
    """

    def __init__(
        self,
        accelerator: Any,
        model: nn.Module,
        loss: nn.Module,
        train_dataset: Dataset,
        config: TrainingConfig,
        test_dataset: Dataset | None = None,
        evaluator: Any = None,
        memory: nn.Module | None = None,
        sampler: Any = None,
        run_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(config, TrainingConfig):
            raise TypeError(f"config must be a TrainingConfig; got {type(config).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
        if not isinstance(loss, nn.Module):
            raise TypeError(f"loss must be a torch.nn.Module (a PML loss); got {type(loss).__name__}")
        self.accelerator = accelerator
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.train_labels = dataset_labels(train_dataset)
        self.train_dataset = SeededAugmentation(train_dataset, seed=config.seed)
        self.test_dataset = test_dataset
        self.loss = loss
        self.chunk_size = config.chunk_size  # gradient-cached steps (exact): .loss_module.backward_step
        if memory is None:
            memory = build_memory(config, model, loss, train_dataset, self.train_labels.shape[1])
        self.memory = memory

        R, r = accelerator.num_processes, accelerator.process_index
        self.sampler = sampler if sampler is not None else build_sampler(config, self.train_labels, R, r)
        if not hasattr(self.sampler, "set_epoch"):
            raise TypeError("sampler must be a batch sampler with set_epoch(epoch) (pml_suprank.samplers)")
        self.steps_per_epoch = len(self.sampler)
        if self.steps_per_epoch == 0:
            raise ValueError("the training sampler yields no batch; use a smaller batch_size or more data")
        total = config.epochs * self.steps_per_epoch
        self.total_steps = min(total, config.max_train_steps) if config.max_train_steps else total
        self.scheduled_steps = max(self.total_steps - config.warmup_epochs * self.steps_per_epoch, 1)  # after warm-up

        self.loss_module = LossModule(
            model, loss, self.memory, hierarchical_labels=config.hierarchical_labels, distributed=R > 1
        )
        optimizer = build_optimizer(model, loss, config)
        self.scheduler = build_scheduler(optimizer, self.scheduled_steps, config)
        self.loss_module, self.optimizer = accelerator.prepare(self.loss_module, optimizer)
        # the scheduler is stepped by hand once per global step (a prepared one steps num_processes times) and its
        # state goes into trainer_state.json as JSON (registered with Accelerate, it would be pickled)
        self.evaluator = evaluator
        self.progress = _Progress()
        self.nonfinite = NonFiniteSteps(config.max_nonfinite_steps)  # skipped steps (trainer_state.json)
        self._eval_loader: DataLoader | None = None
        self.last_embeddings: tuple[Tensor, Tensor, Tensor] | None = None
        self.first_embeddings: tuple[Tensor, Tensor, Tensor] | None = None  # e.g. before training, for the plots
        self.finished = False
        self.run_config = run_folder.run_config(config.to_dict(), run_options)
        self.fingerprint = run_folder.run_fingerprint(self.run_config)  # in run.json and every checkpoint
        self._lock: run_folder.RunLock | None = None  # on the main process, between begin_run and end_run
        self._begun = False
        self._claimed = False  # the output folder was checked and claimed by this trainer once

    # -- construction helpers -----------------------------------------------------------------------------------
    def _train_loader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.config.seed)  # keeps the global RNG untouched
        return make_loader(
            self.train_dataset, 0, self.config.num_workers, batch_sampler=self.sampler, generator=generator
        )

    @property
    def model(self) -> nn.Module:
        """The bare model (unwrapped from DDP / compile)."""
        return self.accelerator.unwrap_model(self.loss_module).model

    # -- evaluation ---------------------------------------------------------------------------------------------
    def embed(self, dataset: Dataset | None = None, description: str = "embedding") -> tuple[Tensor, Tensor, Tensor]:
        """Embeddings ``(N, D)``, labels ``(N, L)`` and indices of ``dataset`` (default: the test set), gathered."""
        if dataset is None and self.test_dataset is None:
            raise ValueError("no test_dataset was given to the Trainer; pass dataset=")
        loader = self._eval_loader if dataset is None else None  # the test set's loader is prepared once
        if loader is None:
            c = self.config
            loader = self.accelerator.prepare(
                make_loader(self.test_dataset if dataset is None else dataset, c.eval_batch_size, c.num_workers)
            )
            if dataset is None:
                self._eval_loader = loader
        return embed_loader(self.model, loader, self.accelerator, progress=True, description=description)

    def evaluate(self, dataset: Dataset | None = None, description: str = "evaluation") -> dict[str, float]:
        """Scalar retrieval metrics of ``dataset`` (default: the test set) against itself, ranked on the accelerator's
        device, each process ranking its share of the queries (every process gets all of them)."""
        with torch.random.fork_rng(devices=[]):  # building the loader draws from the global RNG: keep it untouched
            emb, labels, idx = self.embed(dataset, description=description)
        self.last_embeddings = (emb, labels, idx)
        if self.first_embeddings is None:
            self.first_embeddings = self.last_embeddings
        if self.evaluator is None:
            self.evaluator = RetrievalEvaluator(k_values=self.config.k_values, alpha=self.config.alpha)
        ev = self.evaluator
        device = self.accelerator.device if ev.device is None else ev.device
        result = ev.evaluate(emb, labels, device=device, distributed=self.accelerator.num_processes > 1)
        scalar = (int, float, np.floating, np.integer)
        return {k: float(v) for k, v in result.items()
                if (isinstance(v, Tensor) and v.numel() == 1) or isinstance(v, scalar)}  # fmt: skip

    # -- checkpoints --------------------------------------------------------------------------------------------
    def _trainer_state(self) -> dict[str, Any]:
        sampler_state = self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else {}
        if sampler_state:  # the position: batches consumed, not fetched ahead
            sampler_state = {**sampler_state, "epoch": self.progress.epoch, "position": self.progress.step_in_epoch}
        return {
            "global_step": self.progress.global_step,
            "epoch": self.progress.epoch,
            "step_in_epoch": self.progress.step_in_epoch,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "num_processes": self.accelerator.num_processes,
            "sampler": checkpoint.jsonable(sampler_state),
            "scheduler": checkpoint.scheduler_state(self.scheduler),
            "optimizer_state": optimizer_state_indices(self.optimizer),  # the parameters with moments
            "history": self.progress.history,
            **self.nonfinite.state(),
            "fingerprint": self.fingerprint,
            "run_config": self.run_config,
        }

    def save_checkpoint(self) -> Path:
        """Write ``output_dir/checkpoints/step_XXXXXXXX`` atomically, keeping ``keep_checkpoints`` of this run."""
        return checkpoint.save_checkpoint(
            self.accelerator, self.output_dir, self._trainer_state(), self.config.keep_checkpoints
        )

    def load_checkpoint(self, path: str | Path, ignore_config_change: bool = False) -> dict[str, Any]:
        """Restore the whole training state from ``path`` (every file checked first, then ``accelerator.load_state``).
        Another run's checkpoint (``ignore_config_change``) continues with this run's learning rates, weight decays and
        momentum (:func:`~pml_suprank.training.optim.apply_group_settings`), its optimizer moments kept.

        Raises:
            CheckpointError: the folder is incomplete, corrupt, does not fit this run, or is another run's (unless
                ``ignore_config_change``; the message names the settings that differ).
        """
        return self._restore(path := Path(path), self._check_files(path), ignore_config_change)

    def _restore(self, path: Path, state: dict[str, Any], ignore_config_change: bool) -> dict[str, Any]:
        """:meth:`load_checkpoint` of a checkpoint whose files :meth:`_check_files` has read (``state``)."""
        run_folder.check_compatible(
            path, state, self.steps_per_epoch, self.total_steps, self.run_config, self.fingerprint, ignore_config_change
        )
        checkpoint.load_scheduler_state(self.scheduler, state["scheduler"])
        try:
            self.accelerator.load_state(str(path))  # model, optimizer, RNG states (and accelerator.step)
        except Exception as e:
            raise checkpoint.CheckpointError(
                f"checkpoint {str(path)!r} cannot be loaded: {type(e).__name__}: {e}"
            ) from e
        if hasattr(self.sampler, "load_state_dict"):  # checked by validate_checkpoint
            self.sampler.load_state_dict(state["sampler"])
        if state["fingerprint"] != self.fingerprint:  # ignore_config_change: this run's settings, not the file's
            if changes := apply_group_settings(self.optimizer, self.scheduler, self.config):
                self.accelerator.print(f"the optimizer continues with this run's settings ({', '.join(changes)})")
        self.progress = _Progress(state["epoch"], state["step_in_epoch"], state["global_step"],
                                  list(state.get("history") or []))  # fmt: skip
        self.nonfinite.load(state)
        return state

    def _check_files(self, path: Path) -> dict[str, Any]:  # every file, and that it fits this model / optimizer
        return checkpoint.validate_checkpoint(
            path,
            self.accelerator.num_processes,
            module=self.accelerator.unwrap_model(self.loss_module),
            optimizer=self.optimizer,
            sampler=self.sampler,
            scaler=getattr(self.accelerator, "scaler", None),
        )

    # -- run identity -------------------------------------------------------------------------------------------
    def begin_run(
        self,
        resume_from: str | Path | None = None,
        *,
        ignore_config_change: bool = False,
        overwrite_output_dir: bool = False,
    ) -> Path | None:
        """Take ``output_dir``: lock it, check and load the checkpoint to continue from (``resume_from``: a folder or
        ``"latest"``), claim the folder when starting from scratch (``overwrite_output_dir``
        deletes a previous run first), write ``run.json``, set a ``projection_init="pca"`` projection. Returns the
        checkpoint or ``None``. :meth:`train` calls it when not called first; :meth:`end_run` releases the lock.

        Raises:
            RunLockError: another live run holds the lock.
            OutputDirError: starting from scratch in a folder holding a previous run.
            CheckpointError: the checkpoint is invalid or another run's (unless ``ignore_config_change``).
        """
        acc, out = self.accelerator, self.output_dir
        main = partial(run_folder.on_main_process, acc)  # runs on the main process; its error is raised on all
        if not self._begun:
            self._lock = main(lambda: run_folder.RunLock(out, note=acc.print).acquire())
            self._begun = True
        try:
            checked: dict[Path, dict[str, Any]] = {}  # --resume latest: each checkpoint's files read once
            ckpt = resume_from if str(resume_from) != "latest" else checkpoint.latest_valid_checkpoint(
                out, acc.print, lambda p: checked.setdefault(p, self._check_files(p)))  # fmt: skip
            ckpt = Path(ckpt) if ckpt is not None else None
            state = {} if ckpt is None else self._restore(ckpt, checked.get(ckpt) or self._check_files(ckpt),
                                                          ignore_config_change)  # fmt: skip
            if ckpt is None and not self._claimed:  # a new run here (also when --resume latest found no checkpoint)
                main(partial(run_folder.claim_output_dir, out, overwrite_output_dir, acc.print, resumed=resume_from,
                             run_config=self.run_config))  # fmt: skip
            extra = {"resumed_from": str(ckpt)} if ckpt is not None else {}
            if ckpt is not None:
                acc.print(f"resumed from {ckpt} (step {self.progress.global_step})")
            if state.get("fingerprint") not in (None, self.fingerprint):
                extra["previous_fingerprint"] = state["fingerprint"]
                acc.print(f"resuming {ckpt} although its configuration differs (ignore_config_change)")
            main(partial(run_folder.write_run_file, out, self.run_config, self.fingerprint, **extra))
            init_projection_if_requested(self, fresh=ckpt is None and self.progress.global_step == 0)  # PCA, once
        except BaseException:
            self.end_run()
            raise
        self._claimed = True
        return ckpt

    def end_run(self) -> None:
        """Release the lock of ``output_dir`` taken by :meth:`begin_run` (idempotent)."""
        if self._lock is not None:
            self._lock.release()
        self._lock, self._begun = None, False

    # -- training -----------------------------------------------------------------------------------------------
    def _set_backbone_trainable(self, trainable: bool) -> None:
        for module in getattr(self.model, "backbone", nn.Identity()).modules():  # frozen batch norm stays frozen
            bn = self.config.freeze_batch_norm and isinstance(module, nn.modules.batchnorm._BatchNorm)
            for p in module.parameters(recurse=False):
                p.requires_grad_(trainable and not bn)

    def _train_mode(self) -> None:
        self.loss_module.train()
        if self.config.freeze_batch_norm:
            for module in self.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def train(
        self,
        resume_from: str | Path | None = None,
        on_epoch_end: EpochCallback | None = None,
        *,
        ignore_config_change: bool = False,
        overwrite_output_dir: bool = False,
    ) -> list[dict]:
        """Run (or continue) the training, beginning the run (:meth:`begin_run`) unless begun; ``on_epoch_end(trainer,
        epoch, metrics_or_None)`` after every epoch. Returns the history: one record per log (``step``, ``epoch``,
        ``loss``, ``steps_per_s``, ``skipped_nonfinite_steps``, ``lr_GROUP``) and per evaluation (``eval/METRIC``).

        Raises:
            NonFiniteTrainingError: more than ``config.max_nonfinite_steps`` steps in a row were non-finite.
        """
        owns = not self._begun
        if owns:
            self.begin_run(resume_from, ignore_config_change=ignore_config_change,
                           overwrite_output_dir=overwrite_output_dir)  # fmt: skip
        elif resume_from is not None:
            raise ValueError("resume_from must be given to begin_run() when the run was begun with it; got both")
        try:
            return self._train(on_epoch_end)
        finally:
            if owns:
                self.end_run()

    def _train(self, on_epoch_end: EpochCallback | None) -> list[dict]:
        p, c = self.progress, self.config
        run = _Run(bar=tqdm(total=self.total_steps, initial=p.global_step, desc="training", dynamic_ncols=True,
                            mininterval=1.0, disable=not self.accelerator.is_local_main_process))  # fmt: skip
        while p.global_step < self.total_steps and p.epoch < c.epochs and not run.stopped:
            epoch = p.epoch
            self._train_epoch(epoch, run)
            if run.stopped or p.epoch == epoch:  # interrupted, or max_train_steps reached inside the epoch
                break
            self._end_epoch(epoch, on_epoch_end)
        run.bar.close()
        self._set_backbone_trainable(True)
        self.finished = p.global_step >= self.total_steps or p.epoch >= c.epochs
        if self.finished:
            self.save_checkpoint()
        return p.history

    def _train_epoch(self, epoch: int, run: _Run) -> None:
        """Steps of ``epoch`` from the current position until the epoch ends or the run is done or stopped."""
        p = self.progress
        warm = epoch < self.config.warmup_epochs
        self._set_backbone_trainable(not warm)
        self.train_dataset.set_epoch(epoch)
        self.sampler.set_epoch(epoch)  # keeps the position restored by load_checkpoint
        self._train_mode()
        for batch in self._train_loader():
            value, norm, finite = self._step(batch, warm)
            p.global_step += 1
            stop = self.nonfinite.record(finite, p.global_step, value, norm, self.accelerator.print)
            p.step_in_epoch += 1
            run.steps, run.logged_steps = run.steps + 1, run.logged_steps + 1
            if math.isfinite(value):
                run.loss_sum, run.loss_n = run.loss_sum + value, run.loss_n + 1
            run.bar.update(1)
            run.bar.set_postfix(epoch=epoch, loss=f"{value:.4f}", refresh=False)
            done = p.global_step >= self.total_steps
            if p.global_step % self.config.log_every == 0 or done or stop:
                self._log_step(epoch, run)
            if p.step_in_epoch >= self.steps_per_epoch:  # the epoch ends with this step
                p.epoch, p.step_in_epoch = epoch + 1, 0
            if stop:  # too many non-finite steps in a row: checkpoint the last good state, then raise
                raise stop_error(self, value, norm, run.bar)
            self._maybe_checkpoint(run, done)
            if done or run.stopped or p.epoch != epoch:
                break

    def _step(self, batch: dict[str, Tensor], warm: bool) -> tuple[float, float, bool]:
        """One step on ``batch`` (:func:`.nonfinite.step_if_finite`; no scheduler step in the warm-up). Returns
        ``(loss, gradient norm, stepped)``."""
        acc = self.accelerator
        images = batch["image"].to(acc.device, non_blocking=True)
        labels = batch["labels"].to(acc.device)
        index = batch["index"].to(acc.device)
        loss = backward_step(acc, self.loss_module, images, labels, index, self.chunk_size)
        # gradients all-reduced (DDP or cached_backward), the loss the global batch's: every process decides alike
        return step_if_finite(acc, self.optimizer, None if warm else self.scheduler, loss,
                              self.loss_module.parameters(), self.config.grad_clip)  # fmt: skip

    def _log_step(self, epoch: int, run: _Run) -> None:
        """Record the mean finite loss since the last log, the speed and the lrs; send them to the trackers."""
        p = self.progress
        record: dict[str, Any] = {
            "step": p.global_step,
            "epoch": epoch,
            "loss": run.loss_sum / run.loss_n if run.loss_n else math.nan,  # the finite losses' mean
            "steps_per_s": run.logged_steps / max(time.perf_counter() - run.t0, 1e-9),
            "skipped_nonfinite_steps": self.nonfinite.skipped,
            **{f"lr_{g.get('name', 'group')}": g["lr"] for g in self.optimizer.param_groups},
        }
        p.history.append(record)
        self.accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=p.global_step)
        run.loss_sum, run.loss_n, run.logged_steps, run.t0 = 0.0, 0, 0, time.perf_counter()

    def _maybe_checkpoint(self, run: _Run, done: bool) -> None:
        """Checkpoint every ``checkpoint_every`` steps; stop (with a checkpoint) after ``stop_after_steps``."""
        c, step = self.config, self.progress.global_step
        periodic = bool(c.checkpoint_every) and step % c.checkpoint_every == 0
        if periodic and not done:
            self.save_checkpoint()
        if c.stop_after_steps is not None and run.steps >= c.stop_after_steps and not done:
            if not periodic:
                self.save_checkpoint()
            self.accelerator.print(f"stopping after {run.steps} steps (step {step}); resume to continue")
            run.stopped = True

    def _end_epoch(self, epoch: int, on_epoch_end: EpochCallback | None) -> None:
        """After a completed epoch: evaluation (every ``eval_every``), the per-epoch checkpoint, the callback."""
        p, c = self.progress, self.config
        metrics = None
        if c.eval_every and (epoch + 1) % c.eval_every == 0 and self.test_dataset is not None:
            if p.global_step < self.total_steps:  # the final evaluation is the recipe's
                metrics = self._evaluate_epoch(epoch)
        if not c.checkpoint_every and p.global_step < self.total_steps:
            self.save_checkpoint()
        if on_epoch_end is not None:
            on_epoch_end(self, epoch, metrics)

    def _evaluate_epoch(self, epoch: int) -> dict[str, float] | None:
        acc = self.accelerator
        if not all(bool(t.isfinite().all()) for t in self.model.state_dict().values() if t.is_floating_point()):
            acc.print(f"epoch {epoch + 1}/{self.config.epochs}: evaluation skipped, the weights are not finite")
            return None  # the next steps are non-finite too: the non-finite step limit ends the run
        metrics = self.record_evaluation(self.evaluate(description=f"evaluation (epoch {epoch + 1})"), epoch)
        acc.print(f"epoch {epoch + 1}/{self.config.epochs}: {format_metrics(metrics, short=True)}")
        self._train_mode()
        return metrics

    def record_evaluation(self, metrics: dict[str, float], epoch: int | None = None) -> dict[str, float]:
        """Record ``metrics`` at the current step: a ``{"step", "epoch", "eval/METRIC"}`` entry of the history (in the
        checkpoints and ``history.json``) and ``eval/METRIC`` for the trackers. Returns ``metrics``."""
        p = self.progress
        p.history.append({"step": p.global_step, "epoch": p.epoch if epoch is None else epoch,
                          **{f"eval/{k}": v for k, v in metrics.items()}})  # fmt: skip
        self.accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=p.global_step)
        return metrics

    # -- export -------------------------------------------------------------------------------------------------
    def save_final(
        self,
        save_directory: str | Path | None = None,
        metrics: dict[str, float] | None = None,
        summary: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        hub_config: dict[str, Any] | None = None,
        plots: bool = True,
        image_dataset: Any = None,
        repo_id: str | None = None,
    ) -> Path | None:
        """Write the Hub-ready folder (default ``output_dir/final``, replaced whole: :func:`.export.write_final_folder`)
        on the main process; ``None`` elsewhere. ``metrics`` go to the card, ``summary`` to
        ``training_summary.json``, ``metadata`` to ``config.json`` (both with the run fingerprint), the history as
        recorded (:meth:`record_evaluation`) to ``history.json``; ``plots`` draw the last evaluation's embeddings
        (``image_dataset``, default the test set, for the retrieval grid); ``repo_id`` is shown in the card's usage
        snippet."""
        acc = self.accelerator
        save_directory = Path(save_directory) if save_directory is not None else self.output_dir / "final"
        acc.wait_for_everyone()
        if not acc.is_main_process:
            return None
        embeddings = (self.last_embeddings, self.first_embeddings) if plots and self.last_embeddings else None
        run = {"run_fingerprint": self.fingerprint}  # config.json and training_summary.json name the run
        from ..hub.card import run_card_metadata

        card = run_card_metadata(self, hub_config, (metadata or {}).get("dataset"))  # kept in config.json
        return write_final_folder(
            save_directory, self.model, config=self.config.to_dict(), metrics=metrics,
            summary={**(summary or {}), **run}, history=self.progress.history,
            metadata={**(metadata or {}), **run, **card},
            hub_config=hub_config, embeddings=embeddings,
            image_dataset=image_dataset if image_dataset is not None else self.test_dataset,
            label_names=list(getattr(self.test_dataset, "label_names", [])) or None, seed=self.config.seed,
            repo_id=repo_id, replace=True,
        )  # fmt: skip
