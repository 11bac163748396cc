"""The recipes: one module per command, each with ``main(argv=None)`` (returns the run's results) and ``run()`` (the
console script ``pml-suprank-<name>``, underscores as dashes): ``train`` and its presets ``train_happier`` /
``train_roadmap``, ``evaluate``, ``search``, ``fit_heat``, ``ood_score``, ``ood_benchmark``, ``demo``, ``push`` and
``prepare_dataset``. ``accelerate launch [--multi_gpu --num_processes N] -m pml_suprank.recipes.train_happier`` runs
one on several processes; the repository's ``recipes/<name>.py`` are thin entry points. This package imports nothing:
it sets ``OMP_WAIT_POLICY`` before any recipe loads torch.
"""

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU; sleeping waits cost nothing on an
# idle one. Set before torch is imported; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

#: commands, not library API: run them (``python -m pml_suprank.recipes.<name>``), do not import names from them
__all__: list[str] = []
