"""``pml-suprank-train-roadmap``: the training command with ROADMAP (SupAP + L_DG), its defaults the preset
``train_roadmap`` of :data:`pml_suprank.training.recipe.PRESETS` (``--help`` lists every option)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - before torch: spinning threads slow a busy CPU

from pml_suprank.training import recipe  # noqa: E402

DEFAULTS, DESCRIPTION, HIERARCHICAL = recipe.PRESETS["train_roadmap"], recipe.DESCRIPTIONS["train_roadmap"], None
main, run = recipe.preset_command("train_roadmap")

if __name__ == "__main__":
    run()
