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
#   accelerate launch [--multi_gpu --num_processes N --mixed_precision bf16] -m pml_suprank.recipes.train_roadmap ...
#   accelerate launch -m pml_suprank.recipes.train_roadmap --config roadmap_sop
########################################################################
from __future__ import annotations

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU; sleeping waits cost nothing on an
# idle one. Set here, before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

from pml_suprank.training import recipe  # noqa: E402  (the command line, the RunSpec and the whole job)

# the run without arguments: a preset of the training command (pml_suprank.recipes.train: every loss, --list_losses)
DEFAULTS = recipe.PRESETS["train_roadmap"]
HIERARCHICAL = None  # every loss is a --loss value; the preset only sets the default
DESCRIPTION = "Train a retrieval model with ROADMAP (SupAP + L_DG)."


def main(argv: list[str] | None = None) -> dict | None:
    return recipe.main(argv, DESCRIPTION, DEFAULTS)


def run() -> None:
    """The console script ``pml-suprank-train-roadmap``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()
