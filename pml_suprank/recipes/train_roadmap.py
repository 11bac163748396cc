"""``pml-suprank-train-roadmap``: the training command with ROADMAP (SupAP + L_DG), its defaults the preset
``train_roadmap`` of :data:`pml_suprank.training.recipe.PRESETS` (``--help`` lists every option)."""

from pml_suprank.training import recipe  # OMP_WAIT_POLICY: set by the package, before torch

DEFAULTS, DESCRIPTION, HIERARCHICAL = recipe.PRESETS["train_roadmap"], recipe.DESCRIPTIONS["train_roadmap"], None
main, run = recipe.preset_command("train_roadmap")

if __name__ == "__main__":
    run()
