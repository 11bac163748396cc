########################################################################
# Train an image-retrieval model with any loss: every rank loss of the package (HAPPIER, ROADMAP, Smooth-AP, SupAP,
# Sup-R@k, ROD-R@k, Sup-H-AP, Sup-NDCG, ROD-NDCG, CSL: `--list_losses`), a pytorch-metric-learning loss as a baseline
# (`--loss pml:MultiSimilarityLoss --loss_kwargs '{"alpha": 2}'`), your own class (`--loss my_module:MyLoss`) or an
# installed plugin (entry-point group `pml_suprank.losses`).
#
# With no argument it trains HAPPIER with a tiny timm backbone on SyntheticShapes on the CPU, without network, in a
# few minutes. The same command runs on a single CPU/GPU, multi-process CPU (gloo), multi-GPU / multi-node, fp16 /
# bf16:
#   accelerate launch [--multi_gpu --num_processes N --mixed_precision bf16] -m pml_suprank.recipes.train ...
#   accelerate launch -m pml_suprank.recipes.train --config happier_sop
# `train_happier` and `train_roadmap` are presets of it (other defaults, the same code).
########################################################################
from __future__ import annotations

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU; sleeping waits cost nothing on an
# idle one. Set here, before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

from pml_suprank.training import recipe  # noqa: E402  (the command line, the RunSpec and the whole job)

# the run without arguments
DEFAULTS = recipe.PRESETS["train"]
HIERARCHICAL = None  # every loss: --list_losses
DESCRIPTION = "Train a retrieval model with any rank loss, a pytorch-metric-learning loss or your own (--list_losses)."


def main(argv: list[str] | None = None) -> dict | None:
    return recipe.main(argv, DESCRIPTION, DEFAULTS)


def run() -> None:
    """The console script ``pml-suprank-train``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()
