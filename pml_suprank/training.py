"""The training loop shared by the recipes: Accelerate-driven metric learning with rank losses.

What :class:`Trainer` does, in the recipes' words (``recipes/train_happier.py``, ``recipes/train_roadmap.py``):

* **any ``accelerate launch`` configuration** — CPU, multi-process (gloo), multi-GPU, mixed precision: the model and
  the loss (whose proxies are parameters, e.g. ``ClusterLoss``) are wrapped in one module that goes through
  ``accelerator.prepare``, so DDP synchronises the proxies' gradients too (``ecosystem.md`` §3.3);
* **exact distributed loss**: under several processes the embeddings of the global batch are gathered *with
  gradients* (``pml_suprank.distributed.all_gather_with_grad``) and every process computes the loss of the global
  batch; after DDP's gradient averaging this equals the single-process gradient on the concatenated batch
  (``ecosystem.md`` §0.5, §3.5);
* **parameter groups** ``backbone`` / ``head`` / ``proxies`` with their own learning rates (SupRank reference configs,
  ``ranking_reference.md`` §5), **warm-up epochs with the backbone frozen** (its parameters get no gradient and are
  not stepped; no scheduler step during the warm-up, as ``train.py:67-75`` of the reference) and a **cosine**
  schedule over the remaining steps;
* the package's **samplers** (``MPerClassSampler`` / ``HierarchicalSampler``, which shard themselves: one global
  batch of ``num_processes * batch_size`` per step) and the **memory** (``RankingMemory``);
* **evaluation** every ``eval_every`` epochs with :class:`pml_suprank.metrics.RetrievalEvaluator` on embeddings
  gathered with ``accelerator.gather_for_metrics``; **progress bars** on the main process; **tracking** through
  ``accelerator.log`` (whatever trackers the recipe configured);
* **checkpoints** every ``checkpoint_every`` steps with ``accelerator.save_state`` written *atomically* (into a
  temporary folder renamed once complete) and an **exact resume**: model, optimizer, scheduler, memory, RNG
  states, sampler epoch and position are restored and the data augmentation of every item is seeded by
  ``(seed, epoch, index)`` — a resumed run ends with the same weights as an uninterrupted one;
* a final **Hub-ready folder** (``config.json``, ``model.safetensors``, model card, ``metrics.json``, plots).

The module never reads the environment; recipes pass everything explicitly (STYLE R5, R8).
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ._validation import check_choice, check_positive

__all__ = [
    "CheckpointError",
    "LossModule",
    "SeededAugmentation",
    "Trainer",
    "TrainingConfig",
    "build_optimizer",
    "build_scheduler",
    "embed_loader",
    "format_metrics_table",
    "find_checkpoints",
    "latest_checkpoint",
    "validate_checkpoint",
]

logger = logging.getLogger(__name__)

OptimizerType = Literal["adam", "adamw", "sgd"]
SchedulerType = Literal["cosine", "constant"]
SamplerType = Literal["m_per_class", "hierarchical"]

CHECKPOINT_PREFIX = "step_"
TRAINER_STATE = "trainer_state.json"


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, corrupt or was written by an incompatible run."""


# ---------------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class TrainingConfig:
    """Hyper-parameters of a training run (plain values; recipes fill it from argparse and ``--config`` YAML).

    Args:
        output_dir: Folder for checkpoints (``checkpoints/step_XXXXXXXX``), the final model and the plots.
        seed: Seed of the samplers (``(seed, epoch)`` streams) and of the per-item augmentation.
        epochs: Number of epochs (one epoch = one pass of the batch sampler).
        max_train_steps: Stop after this many optimizer steps (also shortens the cosine schedule); ``None`` = all.
        batch_size: Images per step *per process*; the global batch is ``num_processes * batch_size``.
        samples_per_class: Images per class in a batch (``m``).
        sampler: ``"m_per_class"`` or ``"hierarchical"`` (the SOP sampler, needs 2-D labels).
        batches_per_super_tuple: ``HierarchicalSampler`` batches per pair of super-classes.
        super_classes_per_batch: ``HierarchicalSampler`` super-classes per batch.
        optimizer: ``"adam"``, ``"adamw"`` or ``"sgd"`` (Nesterov, ``momentum``).
        lr_backbone: Learning rate of the timm trunk.
        lr_head: Learning rate of pooling (GeM p), projection and classifier.
        lr_proxies: Learning rate of the loss parameters (``ClusterLoss`` proxies; reference: Adam 10).
        weight_decay: Weight decay of the backbone and head groups (proxies: ``proxies_weight_decay``).
        proxies_weight_decay: Weight decay of the proxies (reference: 0).
        momentum: SGD momentum.
        scheduler: ``"cosine"`` (to ``min_lr_ratio * lr`` at the last step) or ``"constant"``.
        min_lr_ratio: Final learning rate of the cosine schedule as a fraction of each group's initial one.
        warmup_epochs: First epochs with the backbone frozen (no gradient, not stepped) and no scheduler step.
        freeze_batch_norm: Keep the backbone's BatchNorm layers in eval mode (reference ResNet-50 recipes).
        grad_clip: Clip the gradient norm to this value (``None``: no clipping).
        memory_size: Size of the ``RankingMemory`` queue (0: no memory).
        memory_warmup_steps: Steps before the memory loss is used.
        hierarchical_labels: Give the loss all label columns ``(N, L)`` (HAPPIER, Sup-NDCG) instead of the fine
            labels ``(N,)`` (SupAP, ROADMAP).
        eval_every: Evaluate on the test set every this many epochs (0: only at the end).
        eval_batch_size: Images per forward pass during evaluation (per process).
        k_values: Recall@k values of the evaluator.
        alpha: H-AP relevance exponent of the evaluator (HAPPIER Eq. 20).
        checkpoint_every: Save a checkpoint every this many steps (0: only at the end of every epoch).
        keep_checkpoints: Number of most recent checkpoints kept (older ones are deleted); 0 keeps all.
        num_workers: DataLoader worker processes.
        log_every: Log the loss to the trackers every this many steps.
        stop_after_steps: End this *invocation* after this many steps (after writing a checkpoint) without finishing
            the run — for jobs with a time limit, to be continued with ``resume``; ``None``: run to the end.
    """

    output_dir: str = "outputs/run"
    seed: int = 0
    epochs: int = 10
    max_train_steps: int | None = None
    batch_size: int = 64
    samples_per_class: int = 4
    sampler: SamplerType = "m_per_class"
    batches_per_super_tuple: int = 4
    super_classes_per_batch: int = 2
    optimizer: OptimizerType = "adam"
    lr_backbone: float = 1e-4
    lr_head: float = 2e-4
    lr_proxies: float = 10.0
    weight_decay: float = 1e-4
    proxies_weight_decay: float = 0.0
    momentum: float = 0.9
    scheduler: SchedulerType = "cosine"
    min_lr_ratio: float = 0.0
    warmup_epochs: int = 0
    freeze_batch_norm: bool = False
    grad_clip: float | None = None
    memory_size: int = 0
    memory_warmup_steps: int = 0
    hierarchical_labels: bool = True
    eval_every: int = 1
    eval_batch_size: int = 128
    k_values: Sequence[int] = (1, 10)
    alpha: float = 1.0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    num_workers: int = 0
    log_every: int = 10
    stop_after_steps: int | None = None

    def __post_init__(self) -> None:
        check_choice("optimizer", self.optimizer, get_args(OptimizerType))
        check_choice("scheduler", self.scheduler, get_args(SchedulerType))
        check_choice("sampler", self.sampler, get_args(SamplerType))
        for name in (
            "epochs",
            "batch_size",
            "samples_per_class",
            "batches_per_super_tuple",
            "super_classes_per_batch",
            "eval_batch_size",
            "log_every",
        ):
            _check_int(name, getattr(self, name), 1)
        for name in (
            "seed",
            "warmup_epochs",
            "memory_size",
            "memory_warmup_steps",
            "eval_every",
            "checkpoint_every",
            "keep_checkpoints",
            "num_workers",
        ):
            _check_int(name, getattr(self, name), 0)
        for name in ("max_train_steps", "stop_after_steps"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        if self.warmup_epochs >= self.epochs and self.epochs > 0 and self.warmup_epochs > 0:
            raise ValueError(f"warmup_epochs must be < epochs = {self.epochs}; got {self.warmup_epochs}")
        if self.batch_size % self.samples_per_class:
            raise ValueError(
                f"batch_size must be a multiple of samples_per_class = {self.samples_per_class}; "
                f"got batch_size={self.batch_size}"
            )
        for name in ("lr_backbone", "lr_head", "lr_proxies"):
            check_positive(name, getattr(self, name), strict=False)
        for name in ("weight_decay", "proxies_weight_decay", "momentum", "min_lr_ratio"):
            check_positive(name, getattr(self, name), strict=False)
        if self.min_lr_ratio > 1:
            raise ValueError(f"min_lr_ratio must lie in [0, 1]; got {self.min_lr_ratio}")
        if self.grad_clip is not None:
            check_positive("grad_clip", self.grad_clip)
        check_positive("alpha", self.alpha)
        self.k_values = tuple(_check_int("k_values", k, 1) for k in self.k_values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingConfig:
        """Build from a dict, rejecting unknown keys with the list of valid ones."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown TrainingConfig keys {unknown}; valid keys: {sorted(names)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["k_values"] = list(self.k_values)
        return d


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


# ---------------------------------------------------------------------------------------------------------------------
# optimiser and schedule
# ---------------------------------------------------------------------------------------------------------------------
def _model_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    if hasattr(model, "parameter_groups"):
        groups = model.parameter_groups()
        return {"backbone": list(groups.get("backbone", [])), "head": list(groups.get("head", []))}
    if hasattr(model, "backbone"):
        backbone = [p for p in model.backbone.parameters() if p.requires_grad]
        ids = {id(p) for p in backbone}
        return {"backbone": backbone, "head": [p for p in model.parameters() if p.requires_grad and id(p) not in ids]}
    return {"backbone": [], "head": [p for p in model.parameters() if p.requires_grad]}


def build_optimizer(model: nn.Module, loss: nn.Module | None, config: TrainingConfig) -> torch.optim.Optimizer:
    """One optimizer with the parameter groups ``backbone`` / ``head`` / ``proxies`` (each with its own lr).

    ``model.parameter_groups()`` (``RetrievalModel``) splits the trunk from the head; the trainable parameters of
    ``loss`` (e.g. ``ClusterLoss`` proxies inside ``ROADMAPLoss(decomposability="proxy")`` / ``HAPPIERLoss``) form
    the ``proxies`` group. Empty groups are left out. Every group carries a ``"name"`` key.
    """
    if not isinstance(config, TrainingConfig):
        raise TypeError(f"config must be a TrainingConfig; got {type(config).__name__}")
    groups = _model_groups(model)
    seen = {id(p) for ps in groups.values() for p in ps}
    proxies = [p for p in (loss.parameters() if loss is not None else []) if p.requires_grad and id(p) not in seen]
    spec = [
        ("backbone", groups["backbone"], config.lr_backbone, config.weight_decay),
        ("head", groups["head"], config.lr_head, config.weight_decay),
        ("proxies", proxies, config.lr_proxies, config.proxies_weight_decay),
    ]
    param_groups = [
        {"params": ps, "lr": lr, "weight_decay": wd, "name": name} for name, ps, lr, wd in spec if len(ps) > 0
    ]
    if not param_groups:
        raise ValueError("model and loss have no trainable parameters")
    if config.optimizer == "adam":
        return torch.optim.Adam(param_groups)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(param_groups)
    return torch.optim.SGD(param_groups, momentum=config.momentum, nesterov=config.momentum > 0)


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, config: TrainingConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine decay of every group's lr from its initial value to ``min_lr_ratio`` times it over ``total_steps``
    scheduler steps (reference: ``CosineAnnealingLR(T_max=max_iter)``), or a constant schedule."""
    total_steps = max(int(total_steps), 1)
    ratio = config.min_lr_ratio

    def factor(step: int) -> float:
        if config.scheduler == "constant":
            return 1.0
        t = min(step, total_steps) / total_steps
        return ratio + (1.0 - ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------------
class SeededAugmentation(Dataset):
    """Dataset wrapper that draws the random augmentation of item ``i`` in epoch ``e`` from the seed
    ``(seed, e, i)``, whatever process or worker loads it and whenever — so that a resumed run, a different
    ``num_workers`` or a different number of processes see the same augmented images.

    The global ``random`` / ``numpy`` / ``torch`` (CPU) generators are forked around ``dataset[i]`` and restored
    afterwards: loading an item has no effect on the caller's random state.
    """

    def __init__(self, dataset: Dataset, seed: int = 0) -> None:
        self.dataset = dataset
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        item_seed = int(np.random.SeedSequence([self.seed, self.epoch, int(index)]).generate_state(1, np.uint64)[0])
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(item_seed)
            random.seed(item_seed)
            np.random.seed(item_seed % (2**32))
            try:
                return self.dataset[index]
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)


def _collate(items: list[dict[str, Any]]) -> dict[str, Tensor]:
    return {
        "image": torch.stack([it["image"] for it in items]),
        "labels": torch.stack([torch.as_tensor(it["labels"]).long().reshape(-1) for it in items]),
        "index": torch.as_tensor([int(it["index"]) for it in items], dtype=torch.long),
    }


def _dataset_labels(dataset: Any) -> Tensor:
    labels = getattr(dataset, "labels", None)
    if labels is None:
        raise TypeError(
            f"dataset must expose `labels`, a LongTensor (N, L) (the pml_suprank.data contract); "
            f"got {type(dataset).__name__} without it"
        )
    labels = torch.as_tensor(labels).long()
    return labels[:, None] if labels.dim() == 1 else labels


@torch.no_grad()
def embed_loader(
    model: nn.Module,
    dataloader: DataLoader,
    accelerator: Any = None,
    *,
    progress: bool = False,
    description: str = "embedding",
) -> tuple[Tensor, Tensor, Tensor]:
    """Embeddings, labels and indices of every item of ``dataloader``, in dataset order.

    Under Accelerate, ``dataloader`` should have gone through ``accelerator.prepare`` (it is sharded across
    processes) and the results are collected with ``accelerator.gather_for_metrics`` (the duplicates that pad the
    last batch are dropped). Every process receives the full result.

    Returns:
        ``(embeddings (N, D) float32 on CPU, labels (N, L) long, indices (N,) long)``.
    """
    was_training = model.training
    model.eval()
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    embs, labs, idxs = [], [], []
    disable = not progress or (accelerator is not None and not accelerator.is_local_main_process)
    bar = _progress(dataloader, desc=description, disable=disable, leave=False)
    for batch in bar:
        images = batch["image"].to(device, non_blocking=True)
        labels = batch["labels"].to(device)
        index = batch["index"].to(device)
        if accelerator is not None:
            with accelerator.autocast():
                emb = model(images)
            emb, labels, index = accelerator.gather_for_metrics((emb.float().contiguous(), labels, index))
        else:
            emb = model(images)
        embs.append(emb.float().cpu())
        labs.append(labels.cpu())
        idxs.append(index.cpu())
    model.train(was_training)
    emb, lab, idx = torch.cat(embs), torch.cat(labs), torch.cat(idxs)
    order = torch.argsort(idx)
    return emb[order], lab[order], idx[order]


def _progress(iterable: Any, **kwargs: Any) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the recipes extra
        return iterable
    return tqdm(iterable, dynamic_ncols=True, mininterval=1.0, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# loss module (model + loss [+ memory]) — what goes through accelerator.prepare
# ---------------------------------------------------------------------------------------------------------------------
class LossModule(nn.Module):
    """``model`` + ``loss`` (+ ``memory``) as one module: ``forward(images, labels, indices) -> loss``.

    Wrapping them together lets ``accelerator.prepare`` put the loss parameters (proxies) under the same DDP as the
    network. With ``num_processes > 1`` the embeddings, labels and indices of the global batch are gathered (the
    embeddings with gradients) and the loss of the global batch is computed on every process: after DDP averages
    the gradients this is exactly the single-process gradient of the loss on the concatenated batch.

    Args:
        model: Maps ``(B, 3, H, W)`` images to ``(B, D)`` embeddings.
        loss: A PML-style loss ``loss(embeddings, labels)``.
        memory: Optional ``RankingMemory`` wrapping ``loss``: ``memory(embeddings, labels, indices)``.
        hierarchical_labels: Pass labels ``(B, L)`` to the loss; otherwise the fine column ``(B,)``.
        distributed: Gather the global batch across processes (``torch.distributed`` must be initialised).
    """

    def __init__(
        self,
        model: nn.Module,
        loss: nn.Module,
        memory: nn.Module | None = None,
        hierarchical_labels: bool = True,
        distributed: bool = False,
    ) -> None:
        super().__init__()
        self.model = model
        # the memory holds the loss as a submodule: registering it twice would duplicate its tensors in state_dict
        self.loss = loss if memory is None else None
        self.memory = memory
        self.hierarchical_labels = bool(hierarchical_labels)
        self.distributed = bool(distributed)

    def forward(self, images: Tensor, labels: Tensor, indices: Tensor | None = None) -> Tensor:
        embeddings = self.model(images).float()
        labels = labels if self.hierarchical_labels else labels[:, 0]
        # mixed precision applies to the network; the rank loss runs in float32 (sigmoids of score differences / τ)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            if self.memory is not None:  # RankingMemory gathers the global batch itself under torch.distributed
                return self.memory(embeddings, labels, indices)
            if self.distributed:
                from . import distributed as dist_utils

                embeddings = dist_utils.all_gather_with_grad(embeddings)
                labels = dist_utils.all_gather(labels)
            return self.loss(embeddings, labels)


# ---------------------------------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------------------------------
def find_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders ``output_dir/checkpoints/step_XXXXXXXX`` sorted by step (temporary folders of an
    interrupted save are ignored)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and p.name[len(CHECKPOINT_PREFIX) :].isdigit():
            found.append((int(p.name[len(CHECKPOINT_PREFIX) :]), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The most recent complete checkpoint of ``output_dir``, or ``None``."""
    ckpts = find_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def validate_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check that ``path`` is a complete checkpoint written by :class:`Trainer` and return its trainer state.

    Raises:
        CheckpointError: naming the folder and what is missing or unreadable (corrupt JSON, truncated weights).
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a folder")
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {TRAINER_STATE} is missing")
    try:
        state = json.loads(state_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {TRAINER_STATE} cannot be read ({e})") from e
    required = ("global_step", "epoch", "step_in_epoch", "sampler", "num_processes")
    if not isinstance(state, dict) or any(k not in state for k in required):
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {TRAINER_STATE} lacks one of {required}")
    weights = sorted(path.glob("model*.safetensors")) + sorted(path.glob("pytorch_model*.bin"))
    if not weights:
        raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: no model weights (model.safetensors)")
    for w in weights:
        if w.suffix == ".safetensors":
            try:
                from safetensors import safe_open

                with safe_open(str(w), framework="pt") as f:
                    for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                        f.get_slice(key)
            except Exception as e:
                raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: cannot read {w.name} ({e})") from e
    return state


# ---------------------------------------------------------------------------------------------------------------------
# trainer
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class _Progress:
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Train an embedding model with a rank loss under Accelerate; evaluate, checkpoint, resume, export.

    Args:
        accelerator: An ``accelerate.Accelerator`` (the recipe creates it: mixed precision, trackers, DDP kwargs).
        model: ``RetrievalModel`` (or any module mapping images to L2-normalised ``(B, D)`` embeddings).
        loss: The loss, a PML-style ``loss(embeddings, labels)`` (``ROADMAPLoss``, ``HAPPIERLoss``, ...).
        train_dataset: A dataset following the ``pml_suprank.data`` contract (items ``{"image", "labels", "index"}``,
            attribute ``labels (N, L)``), with its training transform set.
        config: :class:`TrainingConfig`.
        test_dataset: Dataset for evaluation (same contract, test transform).
        evaluator: ``RetrievalEvaluator``; default ``RetrievalEvaluator(k_values=config.k_values,
            alpha=config.alpha)``.
        memory: Optional ``RankingMemory`` wrapping ``loss``; built from ``config.memory_size`` when ``None`` and
            ``memory_size > 0``.
        sampler: Optional batch sampler; default built from ``config.sampler`` with the accelerator's number of
            processes and rank (the sampler shards the global batch itself).

    Example:
        >>> trainer = Trainer(accelerator, model, losses.HAPPIERLoss(...), train_ds, TrainingConfig(epochs=3),
        ...                   test_dataset=test_ds)
        >>> before = trainer.evaluate()
        >>> trainer.train()
        >>> after = trainer.evaluate()
        >>> trainer.save_final(metrics=after, summary={"before": before, "after": after})
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
        self.train_labels = _dataset_labels(train_dataset)
        if config.sampler == "hierarchical" and self.train_labels.shape[1] < 2:
            raise ValueError("sampler='hierarchical' needs 2-D labels (N, L >= 2); the training set has one column")
        self.train_dataset = SeededAugmentation(train_dataset, seed=config.seed)
        self.test_dataset = test_dataset
        self.loss = loss

        if memory is None and config.memory_size > 0:
            from .memory import RankingMemory

            memory = RankingMemory(
                loss,
                embedding_size=int(getattr(model, "embedding_size", 0) or _infer_dim(model, train_dataset)),
                memory_size=config.memory_size,
                warmup_steps=config.memory_warmup_steps,
                label_levels=self.train_labels.shape[1] if config.hierarchical_labels else None,
            )
        self.memory = memory

        R, r = accelerator.num_processes, accelerator.process_index
        self.sampler = sampler if sampler is not None else self._build_sampler(R, r)
        if not hasattr(self.sampler, "set_epoch"):
            raise TypeError("sampler must be a batch sampler with set_epoch(epoch) (pml_suprank.samplers)")
        self.steps_per_epoch = len(self.sampler)
        if self.steps_per_epoch == 0:
            raise ValueError("the training sampler yields no batch; use a smaller batch_size or more data")
        total = config.epochs * self.steps_per_epoch
        self.total_steps = min(total, config.max_train_steps) if config.max_train_steps else total
        warm = config.warmup_epochs * self.steps_per_epoch
        self.scheduled_steps = max(self.total_steps - warm, 1)

        self.loss_module = LossModule(
            model, loss, memory, hierarchical_labels=config.hierarchical_labels, distributed=R > 1
        )
        optimizer = build_optimizer(model, loss, config)
        self.scheduler = build_scheduler(optimizer, self.scheduled_steps, config)
        self.loss_module, self.optimizer = accelerator.prepare(self.loss_module, optimizer)
        # the scheduler is stepped by hand once per global step (each process sees every step: the sampler shards
        # the global batch), so it is registered, not prepared (a prepared one steps num_processes times)
        accelerator.register_for_checkpointing(self.scheduler)
        self.evaluator = evaluator
        self.progress = _Progress()
        self._eval_loader: DataLoader | None = None
        self.last_embeddings: tuple[Tensor, Tensor, Tensor] | None = None
        self.first_embeddings: tuple[Tensor, Tensor, Tensor] | None = None  # e.g. before training, for the plots
        self.finished = False

    # -- construction helpers -----------------------------------------------------------------------------------
    def _build_sampler(self, num_replicas: int, rank: int) -> Any:
        from . import samplers

        c = self.config
        if c.sampler == "hierarchical":
            return samplers.HierarchicalSampler(
                self.train_labels,
                batch_size=c.batch_size,
                samples_per_class=c.samples_per_class,
                batches_per_super_tuple=c.batches_per_super_tuple,
                super_classes_per_batch=c.super_classes_per_batch,
                seed=c.seed,
                num_replicas=num_replicas,
                rank=rank,
            )
        return samplers.MPerClassSampler(
            self.train_labels[:, 0],
            m=c.samples_per_class,
            batch_size=c.batch_size,
            seed=c.seed,
            num_replicas=num_replicas,
            rank=rank,
        )

    def _train_loader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.config.seed)  # keeps the global RNG untouched
        return DataLoader(
            self.train_dataset,
            batch_sampler=self.sampler,
            num_workers=self.config.num_workers,
            collate_fn=_collate,
            generator=generator,
            persistent_workers=False,
        )

    def _get_evaluator(self) -> Any:
        if self.evaluator is None:
            from .metrics import RetrievalEvaluator

            self.evaluator = RetrievalEvaluator(k_values=self.config.k_values, alpha=self.config.alpha)
        return self.evaluator

    @property
    def model(self) -> nn.Module:
        """The bare model (unwrapped from DDP / compile)."""
        return self.accelerator.unwrap_model(self.loss_module).model

    # -- evaluation ---------------------------------------------------------------------------------------------
    def embed(self, dataset: Dataset | None = None, description: str = "embedding") -> tuple[Tensor, Tensor, Tensor]:
        """Embeddings ``(N, D)``, labels ``(N, L)`` and indices of ``dataset`` (default: the test set), gathered
        over processes."""
        if dataset is None:
            if self.test_dataset is None:
                raise ValueError("no test_dataset was given to the Trainer; pass dataset=")
            if self._eval_loader is None:
                self._eval_loader = self.accelerator.prepare(self._plain_loader(self.test_dataset))
            loader = self._eval_loader
        else:
            loader = self.accelerator.prepare(self._plain_loader(dataset))
        return embed_loader(self.model, loader, self.accelerator, progress=True, description=description)

    def _plain_loader(self, dataset: Dataset) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.config.eval_batch_size,
            shuffle=False,
            num_workers=self.config.num_workers,
            collate_fn=_collate,
        )

    def evaluate(self, dataset: Dataset | None = None, description: str = "evaluation") -> dict[str, float]:
        """Retrieval metrics of ``dataset`` (default: the test set) against itself, every query excluded from its
        own gallery: ``{"ap", "map_at_r", "recall_at_k", "h_ap", "ndcg", "asi", "ap_level{l}", ...}``."""
        with torch.random.fork_rng(devices=[]):  # building the loader draws from the global RNG: keep it untouched
            emb, labels, idx = self.embed(dataset, description=description)
        self.last_embeddings = (emb, labels, idx)
        if self.first_embeddings is None:
            self.first_embeddings = self.last_embeddings
        result = self._get_evaluator().evaluate(emb, labels)
        out: dict[str, float] = {}
        for k, v in result.items():
            if isinstance(v, Tensor) and v.numel() == 1:
                out[k] = float(v)
            elif isinstance(v, (int, float, np.floating, np.integer)):
                out[k] = float(v)
        return out

    # -- checkpoints --------------------------------------------------------------------------------------------
    def _trainer_state(self) -> dict[str, Any]:
        sampler_state = self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else {}
        if sampler_state:
            sampler_state = dict(sampler_state)
            sampler_state["epoch"] = self.progress.epoch
            sampler_state["position"] = self.progress.step_in_epoch  # batches consumed, not fetched ahead
        return {
            "global_step": self.progress.global_step,
            "epoch": self.progress.epoch,
            "step_in_epoch": self.progress.step_in_epoch,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "num_processes": self.accelerator.num_processes,
            "sampler": _jsonable(sampler_state),
            "history": self.progress.history,
            "config": _jsonable(self.config.to_dict()),
        }

    def save_checkpoint(self) -> Path:
        """Write ``output_dir/checkpoints/step_XXXXXXXX`` atomically (``save_state`` into a temporary folder, then
        one rename) and delete the oldest checkpoints beyond ``keep_checkpoints``."""
        acc = self.accelerator
        root = self.output_dir / "checkpoints"
        name = f"{CHECKPOINT_PREFIX}{self.progress.global_step:08d}"
        final, tmp = root / name, root / f".tmp-{name}"
        if acc.is_main_process:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
        acc.wait_for_everyone()
        acc.save_state(str(tmp), safe_serialization=True)
        if acc.is_main_process:
            (tmp / TRAINER_STATE).write_text(json.dumps(self._trainer_state(), indent=1))
        acc.wait_for_everyone()
        if acc.is_main_process:
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
            keep = self.config.keep_checkpoints
            if keep > 0:
                for old in find_checkpoints(self.output_dir)[:-keep]:
                    shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()
        return final

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Restore model, loss, memory, optimizer, scheduler, RNG states and the sampler position from ``path``.

        Raises:
            CheckpointError: the folder is incomplete or corrupt, or was written with a different number of
                processes or a different sampler configuration.
        """
        path = Path(path)
        state = validate_checkpoint(path)
        if state["num_processes"] != self.accelerator.num_processes:
            raise CheckpointError(
                f"checkpoint {str(path)!r} was written by {state['num_processes']} processes; this run has "
                f"{self.accelerator.num_processes} (the sampler streams and RNG states are per process)"
            )
        if state.get("steps_per_epoch", self.steps_per_epoch) != self.steps_per_epoch:
            raise CheckpointError(
                f"checkpoint {str(path)!r} has {state['steps_per_epoch']} steps per epoch; this run has "
                f"{self.steps_per_epoch} (different data, batch size or sampler)"
            )
        try:
            self.accelerator.load_state(str(path))
        except Exception as e:
            raise CheckpointError(f"checkpoint {str(path)!r} cannot be loaded: {type(e).__name__}: {e}") from e
        if state["sampler"] and hasattr(self.sampler, "load_state_dict"):
            try:
                self.sampler.load_state_dict(state["sampler"])
            except ValueError as e:
                raise CheckpointError(f"checkpoint {str(path)!r}: {e}") from e
        self.progress = _Progress(
            epoch=int(state["epoch"]),
            step_in_epoch=int(state["step_in_epoch"]),
            global_step=int(state["global_step"]),
            history=list(state.get("history", [])),
        )
        return state

    # -- training -----------------------------------------------------------------------------------------------
    def _set_backbone_trainable(self, trainable: bool) -> None:
        backbone = getattr(self.model, "backbone", None)
        if backbone is None:
            return
        for name, p in backbone.named_parameters():
            if self.config.freeze_batch_norm and self._is_bn_param(backbone, name):
                p.requires_grad_(False)
            else:
                p.requires_grad_(trainable)

    @staticmethod
    def _is_bn_param(backbone: nn.Module, name: str) -> bool:
        module = backbone.get_submodule(name.rsplit(".", 1)[0]) if "." in name else backbone
        return isinstance(module, nn.modules.batchnorm._BatchNorm)

    def _train_mode(self) -> None:
        self.loss_module.train()
        if self.config.freeze_batch_norm:
            for module in self.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def train(
        self,
        resume_from: str | Path | None = None,
        on_epoch_end: Callable[[Trainer, int, dict[str, float] | None], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Run (or continue) the training; return the history of logged values.

        Args:
            resume_from: A checkpoint folder, or ``"latest"`` for the newest one in ``output_dir`` (if there is
                none, training starts from scratch).
            on_epoch_end: Called as ``fn(trainer, epoch, metrics_or_None)`` after every completed epoch.

        Returns:
            One dict per log event (``{"step", "epoch", "loss", "lr_<group>"}``) and per evaluation
            (``{"step", "epoch", "eval/<metric>"}``).
        """
        acc, c = self.accelerator, self.config
        if resume_from is not None:
            ckpt = latest_checkpoint(self.output_dir) if str(resume_from) == "latest" else Path(resume_from)
            if ckpt is None:
                acc.print(f"no checkpoint in {self.output_dir / 'checkpoints'}; starting from scratch")
            else:
                self.load_checkpoint(ckpt)
                acc.print(f"resumed from {ckpt} (step {self.progress.global_step}, epoch {self.progress.epoch})")
        p = self.progress
        steps_this_call = 0
        stopped = False
        bar = _progress(
            None, total=self.total_steps, initial=p.global_step, desc="training", disable=not acc.is_local_main_process
        )
        running, running_n, t0 = 0.0, 0, time.perf_counter()
        while p.global_step < self.total_steps and p.epoch < c.epochs and not stopped:
            epoch = p.epoch
            warm = epoch < c.warmup_epochs
            self._set_backbone_trainable(not warm)
            self.train_dataset.set_epoch(epoch)
            self.sampler.set_epoch(epoch)  # keeps the position restored by load_checkpoint
            self._train_mode()
            for batch in self._train_loader():
                images = batch["image"].to(acc.device, non_blocking=True)
                labels = batch["labels"].to(acc.device)
                index = batch["index"].to(acc.device)
                with acc.autocast():
                    loss = self.loss_module(images, labels, index)
                acc.backward(loss)
                if c.grad_clip is not None:
                    acc.clip_grad_norm_(self.loss_module.parameters(), c.grad_clip)
                self.optimizer.step()
                if not warm:
                    self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                p.global_step += 1
                p.step_in_epoch += 1
                steps_this_call += 1
                value = float(loss.detach())
                running, running_n = running + value, running_n + 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(epoch=epoch, loss=f"{value:.4f}", refresh=False)
                done = p.global_step >= self.total_steps
                if p.global_step % c.log_every == 0 or done:
                    record: dict[str, Any] = {
                        "step": p.global_step,
                        "epoch": epoch,
                        "loss": running / running_n,
                        "steps_per_s": running_n / max(time.perf_counter() - t0, 1e-9),
                    }
                    for g in self.optimizer.param_groups:
                        record[f"lr_{g.get('name', 'group')}"] = g["lr"]
                    p.history.append(record)
                    acc.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=p.global_step)
                    running, running_n, t0 = 0.0, 0, time.perf_counter()
                if p.step_in_epoch >= self.steps_per_epoch:  # the epoch ends with this step
                    p.epoch, p.step_in_epoch = epoch + 1, 0
                if c.checkpoint_every and p.global_step % c.checkpoint_every == 0 and not done:
                    self.save_checkpoint()
                if c.stop_after_steps is not None and steps_this_call >= c.stop_after_steps and not done:
                    if not (c.checkpoint_every and p.global_step % c.checkpoint_every == 0):
                        self.save_checkpoint()
                    acc.print(f"stopping after {steps_this_call} steps (step {p.global_step}); resume to continue")
                    stopped = True
                if done or stopped or p.epoch != epoch:
                    break
            if stopped or p.epoch == epoch:  # interrupted, or max_train_steps reached inside the epoch
                break
            metrics = None
            if c.eval_every and (epoch + 1) % c.eval_every == 0 and self.test_dataset is not None:
                if p.global_step < self.total_steps:  # the final evaluation is the recipe's
                    metrics = self.evaluate(description=f"evaluation (epoch {epoch + 1})")
                    p.history.append(
                        {"step": p.global_step, "epoch": epoch, **{f"eval/{k}": v for k, v in metrics.items()}}
                    )
                    acc.log({f"eval/{k}": v for k, v in metrics.items()}, step=p.global_step)
                    acc.print(f"epoch {epoch + 1}/{c.epochs}: {_format_metrics(metrics, short=True)}")
                    self._train_mode()
            if not c.checkpoint_every and p.global_step < self.total_steps:
                self.save_checkpoint()
            if on_epoch_end is not None:
                on_epoch_end(self, epoch, metrics)
        if bar is not None:
            bar.close()
        self._set_backbone_trainable(True)
        self.finished = p.global_step >= self.total_steps or p.epoch >= c.epochs
        if self.finished:
            self.save_checkpoint()
        return p.history

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
        """Write the Hub-ready folder (on the main process; returns ``None`` elsewhere).

        Contents: ``config.json``, ``model.safetensors``, ``README.md`` (the model card of
        :func:`pml_suprank.hub.save_pretrained`), ``metrics.json`` (the final test metrics), ``training_summary.json``
        (``summary``, e.g. metrics before and after training, timings), ``history.json`` (logged losses and
        evaluations), ``training_config.json`` and the PNG plots of :func:`pml_suprank.plots.plot_all` (drawn from
        the last evaluation's embeddings, with the first evaluation's — before training — for comparison).

        Args:
            save_directory: Default ``output_dir/final``.
            metrics: Final test metrics ``{name: number}`` (``RetrievalEvaluator`` keys) for the card.
            summary: Any JSON-able dict, written to ``training_summary.json``.
            metadata: ``config.json`` training metadata (``loss``, ``dataset``, ``label_names``, ``loss_kwargs``...).
            hub_config: The hub_config dict (tags, datasets, the paper's numbers for the card).
            plots: Draw the plots.
            image_dataset: Dataset with ``get_image(i)`` for the retrieval grid (default: the test set).
            repo_id: Repo id shown in the card's usage snippet.
        """
        acc = self.accelerator
        save_directory = Path(save_directory) if save_directory is not None else self.output_dir / "final"
        acc.wait_for_everyone()
        if not acc.is_main_process:
            return None
        save_directory.mkdir(parents=True, exist_ok=True)
        plot_files: list[Path] = []
        if plots and self.last_embeddings is not None:
            from . import plots as plots_mod

            emb, labels, idx = self.last_embeddings
            compare = None
            if self.first_embeddings is not None and self.first_embeddings is not self.last_embeddings:
                compare = {"before training": self.first_embeddings[0]}
            label_names = list(getattr(self.test_dataset, "label_names", [])) or None
            names = plots_mod.plot_all(
                emb,
                labels,
                save_directory,
                label_names=label_names,
                image_dataset=image_dataset if image_dataset is not None else self.test_dataset,
                indices=idx,
                compare=compare,
                seed=self.config.seed,
            )
            plot_files = [save_directory / n for n in names]
        (save_directory / "training_summary.json").write_text(json.dumps(_jsonable(summary or {}), indent=1))
        (save_directory / "history.json").write_text(json.dumps(_jsonable(self.progress.history), indent=1))
        (save_directory / "training_config.json").write_text(json.dumps(_jsonable(self.config.to_dict()), indent=1))
        model = self.model
        flat = {k: float(v) for k, v in (metrics or {}).items()}
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(
                save_directory,
                metrics=flat,
                metadata=_jsonable(metadata or {}),
                hub_config=hub_config,
                plots=plot_files,
                repo_id=repo_id,
            )
        else:
            from safetensors.torch import save_file

            save_file(
                {k: v.detach().contiguous() for k, v in model.state_dict().items()},
                str(save_directory / "model.safetensors"),
            )
            (save_directory / "metrics.json").write_text(json.dumps(flat, indent=1))
        return save_directory


def _infer_dim(model: nn.Module, dataset: Any) -> int:
    item = dataset[0]
    with torch.no_grad():
        was = model.training
        model.eval()
        d = int(model(item["image"][None]).shape[-1])
        model.train(was)
    return d


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Tensor):
        return x.item() if x.numel() == 1 else x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    return x


_SHORT_KEYS = ("h_ap", "ndcg", "asi", "ap", "recall_at_1")


def _format_metrics(metrics: dict[str, float], short: bool = False) -> str:
    keys = [k for k in _SHORT_KEYS if k in metrics]
    if not short:
        keys += sorted(k for k in metrics if k.startswith("ap_level"))
        keys += [k for k in ("map_at_r", "precision_at_1") if k in metrics]
    return "  ".join(f"{k}={metrics[k]:.4f}" for k in keys)


def format_metrics_table(before: dict[str, float], after: dict[str, float], keys: Sequence[str] | None = None) -> str:
    """A fixed-width before/after table of the main metrics (what the recipes print)."""
    if keys is None:
        keys = [k for k in ("h_ap", "ndcg", "asi") if k in after]
        keys += sorted((k for k in after if k.startswith("ap_level")), key=lambda s: s)
        keys += [k for k in ("ap", "map_at_r", "recall_at_1", "precision_at_1") if k in after]
    lines = [f"{'metric':<16}{'before':>10}{'after':>10}{'change':>10}"]
    for k in keys:
        b, a = before.get(k, float("nan")), after.get(k, float("nan"))
        lines.append(f"{k:<16}{b:>10.4f}{a:>10.4f}{a - b:>+10.4f}")
    return "\n".join(lines)
