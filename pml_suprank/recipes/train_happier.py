########################################################################
# Train an image-retrieval model with HAPPIER (Ramzi et al., "Hierarchical Average Precision Training for
# Pertinent Image Retrieval", ECCV 2022): (1 - λ)·Sup-H-AP + λ·ClusterLoss on hierarchical labels (fine → coarse),
# or with ROD-NDCG (Sup-NDCG + ClusterLoss, `--loss ROD-NDCG`).
#
# With no argument it trains a tiny timm backbone on SyntheticShapes (coarse = shape family, fine = variant ×
# colour; train and test fine classes disjoint) on the CPU, without network, in a few minutes, and prints the
# test metrics before and after training (H-AP, NDCG, ASI, AP per level, R@1).
#
# The same script runs in any of these settings (`accelerate launch [--multi_gpu --num_processes N
# --mixed_precision bf16] -m pml_suprank.recipes.train_happier ...`, or `torchrun --nproc_per_node N -m ...`):
#   - single CPU or GPU, multi-process CPU (gloo), multi-GPU / multi-node (DDP), fp16 / bf16
# and at the paper settings with a hub_config (`--help` lists every option with its default):
#   accelerate launch -m pml_suprank.recipes.train_happier --config happier_sop
########################################################################
from __future__ import annotations

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU; sleeping waits cost nothing on an
# idle one. Set here, before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

from pml_suprank.training import recipe  # noqa: E402  (the command line, the RunSpec and the whole job)

# the run without arguments: a preset of the training command (pml_suprank.recipes.train: every loss, --list_losses)
DEFAULTS = recipe.PRESETS["train_happier"]
HIERARCHICAL = None  # every loss is a --loss value; the preset only sets the default
DESCRIPTION = "Train a retrieval model with HAPPIER (hierarchical AP) or ROD-NDCG."


def main(argv: list[str] | None = None) -> dict | None:
    return recipe.main(argv, DESCRIPTION, DEFAULTS)


def run() -> None:
    """The console script ``pml-suprank-train-happier``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()
