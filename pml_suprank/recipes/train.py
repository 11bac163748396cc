"""``pml-suprank-train``: the training command with any loss (``--list_losses``), its defaults the preset
``train`` of :data:`pml_suprank.training.recipe.PRESETS` (``--help`` lists every option)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - before torch: spinning threads slow a busy CPU

from pml_suprank.training import recipe  # noqa: E402

DEFAULTS, DESCRIPTION, HIERARCHICAL = recipe.PRESETS["train"], recipe.DESCRIPTIONS["train"], None
main, run = recipe.preset_command("train")

if __name__ == "__main__":
    run()
