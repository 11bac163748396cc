########################################################################
# Train an image-retrieval model with HAPPIER (Ramzi et al., "Hierarchical Average Precision Training for
# Pertinent Image Retrieval", ECCV 2022): (1 - λ)·Sup-H-AP + λ·ClusterLoss on hierarchical labels (fine → coarse).
#
# With no argument it trains a tiny timm backbone on SyntheticShapes (coarse = shape family, fine = variant ×
# colour; train and test fine classes disjoint) on the CPU, without network, in a few minutes, and prints the
# test metrics before and after training (H-AP, NDCG, ASI, AP per level, R@1).
#
# The same script runs in any of these settings (`accelerate launch [--multi_gpu --num_processes N
# --mixed_precision bf16] recipes/train_happier.py ...`, or `torchrun --nproc_per_node N`):
#   - single CPU or GPU, multi-process CPU (gloo), multi-GPU / multi-node (DDP), fp16 / bf16
# and at the paper settings with a hub_config:
#   accelerate launch recipes/train_happier.py --config hub_configs/happier_sop.yaml
########################################################################
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (recipes/common.py: argparse, config, the whole job)

# The no-argument run: tiny backbone, 48-px images, fast on 2 CPU cores.
DEFAULTS = {
    "output_dir": "outputs/happier_synthetic",
    "backbone": "test_resnet",
    "image_size": 48,
    "num_per_class": 32,
    "crop_scale": [0.5, 1.0],
    "embedding_size": 128,
    "epochs": 12,
    "batch_size": 64,
    "lr_backbone": 1e-3,
    "lr_head": 2e-3,
    "lr_proxies": 10.0,
    "weight_decay": 1e-4,
    "warmup_epochs": 0,
    "eval_every": 4,
}


def make_loss(args: argparse.Namespace, num_classes: int, embedding_size: int, train_dataset) -> object:
    from pml_suprank import losses

    # New Code #
    # HAPPIER takes the 2-D labels (N, L) of the batch (column 0 finest); the proxies of its ClusterLoss are
    # parameters of the loss and get their own optimizer group (lr_proxies) in pml_suprank.training.
    # ROD-NDCG (Sup-NDCG + ClusterLoss) trains the same way (hub_configs/rod_ndcg_sop.yaml).
    common_kwargs = {"decomposability_weight": args.decomposability_weight, **common.suprank_kwargs(args)}
    if args.loss == "ROD-NDCG":
        return losses.RODNDCGLoss(num_classes=num_classes, embedding_size=embedding_size, **common_kwargs)
    return losses.HAPPIERLoss(num_classes=num_classes, embedding_size=embedding_size, alpha=args.alpha, **common_kwargs)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description="Train a retrieval model with HAPPIER (hierarchical AP).")
    common.add_common_arguments(parser, DEFAULTS)
    g = parser.add_argument_group("HAPPIER loss")
    g.add_argument(
        "--loss",
        type=str,
        default="HAPPIER",
        choices=["HAPPIER", "ROD-NDCG"],
        help="HAPPIER (Sup-H-AP + ClusterLoss) or ROD-NDCG (Sup-NDCG + ClusterLoss)",
    )
    g.add_argument("--alpha", type=float, default=1.0, help="H-AP relevance exponent (α > 1: HAPPIER_F)")
    args, hub_config = common.parse_with_config(parser, argv)
    return common.run(args, hub_config, make_loss, loss_name=args.loss, hierarchical_labels=True)


if __name__ == "__main__":
    main()
