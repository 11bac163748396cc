"""A plain Accelerate training loop with pml-suprank: the whole job in one readable file.

What it shows, in the order a training script needs it: the built-in SyntheticShapes data (hierarchical labels
``(N, L)``, fine → coarse), a timm backbone with a projection head (``RetrievalModel``), the m-per-class batch
sampler, the HAPPIER loss (hierarchical AP + proxy term) inside a cross-batch memory (``RankingMemory``), one
optimizer with a group for the loss proxies, and the exact evaluator (H-AP, NDCG, R@k) before and after training.

The hardened recipe (``pml-suprank-train``: checkpoints, resume, run folders, trackers, model cards, hub_configs,
gradient caching) does the same job with every option checked; start from this file to write your own loop.

    python examples/accelerate_loop.py                     # CPU, a minute or two
    accelerate launch examples/accelerate_loop.py --epochs 20
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - a script may configure its process

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from pml_suprank.data import build_transforms, collate, synthetic_dataset  # noqa: E402
from pml_suprank.losses import HAPPIERLoss  # noqa: E402
from pml_suprank.memory import RankingMemory  # noqa: E402
from pml_suprank.metrics import RetrievalEvaluator  # noqa: E402
from pml_suprank.models import RetrievalModel  # noqa: E402
from pml_suprank.samplers import MPerClassBatchSampler  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", default="test_resnet", help="any timm model name")
    p.add_argument("--image_size", type=int, default=32)
    p.add_argument("--embedding_size", type=int, default=64)
    p.add_argument("--num_per_class", type=int, default=16, help="SyntheticShapes images per fine class")
    p.add_argument("--batch_size", type=int, default=32, help="images per step and process")
    p.add_argument("--samples_per_class", type=int, default=4)
    p.add_argument("--memory_size", type=int, default=128, help="cross-batch memory slots (0: none)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max_steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--cpu", action="store_true", help="run on the CPU even with an accelerator")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


@torch.no_grad()
def embed(model: torch.nn.Module, loader: DataLoader, accelerator: Accelerator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, D)`` L2-normalised embeddings and ``(N, L)`` labels of the whole loader (all processes)."""
    model.eval()
    embeddings, labels = [], []
    for batch in loader:
        e = model(batch["image"].to(accelerator.device))
        e, y = accelerator.gather_for_metrics((e.contiguous(), batch["labels"].to(accelerator.device)))
        embeddings.append(F.normalize(e.float(), dim=-1).cpu())
        labels.append(y.cpu())
    model.train()
    return torch.cat(embeddings), torch.cat(labels)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    accelerator = Accelerator(cpu=args.cpu)
    set_seed(args.seed)  # the model initialisation

    # -- model and data: train and test sets have disjoint fine classes (open-set retrieval) ---------------------
    model = RetrievalModel(args.backbone, embedding_size=args.embedding_size, image_size=args.image_size)
    train_tf = build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    test_tf = build_transforms(model.data_config, train=False)
    common = {"num_per_class": args.num_per_class, "image_size": args.image_size, "seed": args.seed}
    train_ds = synthetic_dataset("synthetic", "train", transform=train_tf, **common)
    test_ds = synthetic_dataset("synthetic", "test", transform=test_tf, **common)

    # -- the sampler draws m images of batch_size // m classes; it shards the global batch over the processes ------
    sampler = MPerClassBatchSampler(
        train_ds.labels, m=args.samples_per_class, batch_size=args.batch_size, seed=args.seed,
        num_replicas=accelerator.num_processes, rank=accelerator.process_index,
    )  # fmt: skip
    train_loader = DataLoader(train_ds, batch_sampler=sampler, collate_fn=collate)
    test_loader = accelerator.prepare(DataLoader(test_ds, batch_size=128, collate_fn=collate))

    # -- loss: HAPPIER on the (B, L) labels; its proxies (one per fine class) are parameters -----------------------
    num_classes = int(train_ds.labels[:, 0].max()) + 1
    loss_fn = HAPPIERLoss(num_classes=num_classes, embedding_size=args.embedding_size)
    if args.memory_size > 0:  # the memory ranks each batch against the last memory_size embeddings too
        loss_fn = RankingMemory(loss_fn, args.embedding_size, args.memory_size,
                                label_levels=train_ds.labels.shape[1])  # fmt: skip
    optimizer = torch.optim.Adam([
        {"params": model.parameters(), "lr": args.lr},
        {"params": loss_fn.parameters(), "lr": 10.0},  # the proxies learn fast (the reference recipe's lr)
    ])  # fmt: skip
    steps = args.epochs * len(sampler) if args.max_steps is None else min(args.max_steps, args.epochs * len(sampler))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(steps, 1))
    model, loss_fn, optimizer, scheduler = accelerator.prepare(model, loss_fn, optimizer, scheduler)

    evaluator = RetrievalEvaluator(k_values=(1, 10), metrics=("h_ap", "ndcg", "recall_at_k"))
    before = evaluator.evaluate(*embed(model, test_loader, accelerator))

    # -- the loop --------------------------------------------------------------------------------------------------
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new plan of batches every epoch (seeded)
        for batch in train_loader:
            images = batch["image"].to(accelerator.device)
            labels, indices = batch["labels"].to(accelerator.device), batch["index"].to(accelerator.device)
            with accelerator.autocast():
                embeddings = model(images)
            # rank losses need float32 sigmoids: compute the loss outside autocast
            if args.memory_size > 0:
                loss = loss_fn(embeddings.float(), labels, indices)
            else:
                loss = loss_fn(embeddings.float(), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % 10 == 0:
                accelerator.print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
            if step >= steps:
                break
        if step >= steps:
            break

    after = evaluator.evaluate(*embed(model, test_loader, accelerator))
    keys = ("h_ap", "ndcg", "recall_at_1", "recall_at_10")
    accelerator.print(f"{'metric':<14}{'before':>8}{'after':>8}")
    for key in keys:
        accelerator.print(f"{key:<14}{before[key]:8.4f}{after[key]:8.4f}")
    return {"before": {k: float(before[k]) for k in keys}, "after": {k: float(after[k]) for k in keys}}


if __name__ == "__main__":
    main()
