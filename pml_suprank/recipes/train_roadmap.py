"""``pml-suprank-train-roadmap``: the training command with the ROADMAP preset (--loss ROADMAP), its defaults the preset
``PRESETS["train_roadmap"]`` of :mod:`pml_suprank.training.recipe` (data, one code path for every preset). Without
arguments it trains a tiny timm backbone on SyntheticShapes on the CPU, offline; ``--help`` lists every option with
its default, ``--config happier_sop`` / ``roadmap_sop`` the paper settings. It runs under ``accelerate launch -m
pml_suprank.recipes.train_roadmap`` (multi-process, multi-GPU, fp16 / bf16) and ``torchrun -m``.
"""

from __future__ import annotations

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU; sleeping waits cost nothing on an
# idle one. Set here, before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

from pml_suprank.training import recipe  # noqa: E402  (the command line, the RunSpec and the whole job)

DEFAULTS, DESCRIPTION, HIERARCHICAL = recipe.PRESETS["train_roadmap"], recipe.DESCRIPTIONS["train_roadmap"], None
main, run = recipe.preset_command("train_roadmap")

if __name__ == "__main__":
    run()
