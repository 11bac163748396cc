"""``pml-suprank-train``: the training command with any loss (``--list_losses``), its defaults the preset
``train`` of :data:`pml_suprank.training.recipe.PRESETS` (``--help`` lists every option)."""

from pml_suprank.training import recipe  # OMP_WAIT_POLICY: set by the package, before torch

DEFAULTS, DESCRIPTION, HIERARCHICAL = recipe.PRESETS["train"], recipe.DESCRIPTIONS["train"], None
main, run = recipe.preset_command("train")

if __name__ == "__main__":
    run()
