"""Serve the retrieval demo (Gradio): a query image, its neighbours in a gallery folder, the OOD guard's verdict.

The repository's entry point of :mod:`pml_suprank.recipes.demo` (``--help`` lists every option); the same recipe
runs from any pip install as ``pml-suprank-demo`` or ``python -m pml_suprank.recipes.demo``.
"""

import os

# Spinning OpenMP threads make small ops 10-20x slower on a shared or busy CPU: set before torch is imported; an
# explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

from pml_suprank.recipes.demo import run  # noqa: E402

if __name__ == "__main__":
    run()
