"""``pml-suprank-train-happier``: the training command with HAPPIER (or ``--loss ROD-NDCG``), its defaults the preset
``train_happier`` of :data:`pml_suprank.training.recipe.PRESETS` (``--help`` lists every option)."""

from pml_suprank.training import recipe  # OMP_WAIT_POLICY: set by the package, before torch

DEFAULTS, DESCRIPTION, HIERARCHICAL = recipe.PRESETS["train_happier"], recipe.DESCRIPTIONS["train_happier"], None
main, run = recipe.preset_command("train_happier")

if __name__ == "__main__":
    run()
