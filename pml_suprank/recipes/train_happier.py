"""``pml-suprank-train-happier``: the training command with HAPPIER (or ``--loss ROD-NDCG``), its defaults the preset
``train_happier`` of :data:`pml_suprank.training.recipe.PRESETS` (``--help`` lists every option)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - before torch: spinning threads slow a busy CPU

from pml_suprank.training import recipe  # noqa: E402

DEFAULTS, DESCRIPTION, HIERARCHICAL = recipe.PRESETS["train_happier"], recipe.DESCRIPTIONS["train_happier"], None
main, run = recipe.preset_command("train_happier")

if __name__ == "__main__":
    run()
