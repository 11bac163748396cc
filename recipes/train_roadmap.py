########################################################################
# Train an image-retrieval model with ROADMAP (Ramzi et al., "Robust and Decomposable Average Precision for Image
# Retrieval", NeurIPS 2021): (1 - λ)·SupAP + λ·L_DG, the calibration loss on pairs (or, with
# `--decomposability proxy`, the ClusterLoss of the SupRank paper, whose proxies get their own learning rate).
#
# ROADMAP trains on the fine labels only; the test metrics still include the hierarchical ones (H-AP, NDCG, ASI, AP
# per level) so that it can be compared with HAPPIER on the same data.
#
# With no argument it trains a tiny timm backbone on SyntheticShapes on the CPU, without network, in a few minutes.
# The same script runs on a single CPU/GPU, multi-process CPU (gloo), multi-GPU / multi-node, fp16 / bf16:
#   accelerate launch [--multi_gpu --num_processes N --mixed_precision bf16] recipes/train_roadmap.py ...
#   accelerate launch recipes/train_roadmap.py --config hub_configs/roadmap_sop.yaml
########################################################################
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (recipes/common.py: argparse, config, the whole job)

# The no-argument run: tiny backbone, small images, fast on 2 CPU cores.
DEFAULTS = {
    "output_dir": "outputs/roadmap_synthetic",
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
    # ROADMAP = SupAP + a decomposability term; "calibration" has no parameters, "proxy" adds ClusterLoss proxies
    # (one per fine class) that pml_suprank.training puts in their own optimizer group.
    kwargs = {}
    if args.decomposability == "proxy":
        kwargs = {"num_classes": num_classes, "embedding_size": embedding_size}
    return losses.ROADMAPLoss(
        decomposability=args.decomposability,
        decomposability_weight=args.decomposability_weight,
        **common.suprank_kwargs(args),
        **kwargs,
    )


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description="Train a retrieval model with ROADMAP (SupAP + L_DG).")
    common.add_common_arguments(parser, DEFAULTS)
    g = parser.add_argument_group("ROADMAP loss")
    g.add_argument("--loss", type=str, default="ROADMAP", choices=["ROADMAP"], help="the loss of this recipe")
    g.add_argument(
        "--decomposability",
        type=str,
        default="calibration",
        choices=["calibration", "proxy"],
        help="L_DG on pairs (NeurIPS 2021) or ClusterLoss proxies (SupRank, TPAMI)",
    )
    args, hub_config = common.parse_with_config(parser, argv)
    return common.run(args, hub_config, make_loss, loss_name="ROADMAP", hierarchical_labels=False)


if __name__ == "__main__":
    main()
