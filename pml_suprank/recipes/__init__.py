"""The recipes, shipped with the package: one module per command, each with ``main(argv=None)`` (argv as a list of
strings, returns the run's results) and ``run()`` (the console script).

* ``train_happier`` (``pml-suprank-train-happier``): train with HAPPIER / ROD-NDCG (hierarchical labels)
* ``train_roadmap`` (``pml-suprank-train-roadmap``): train with ROADMAP (SupAP + L_DG)
* ``evaluate`` (``pml-suprank-evaluate``): exact retrieval metrics and plots of a trained model
* ``search`` (``pml-suprank-search``): search a gallery with a trained model
* ``fit_heat`` (``pml-suprank-fit-heat``): fit HEAT and the OOD baselines
* ``ood_score`` (``pml-suprank-ood-score``): per-image verdicts of a model's OOD guard (scores.csv)
* ``ood_benchmark`` (``pml-suprank-ood-benchmark``): the OOD benchmark harness
* ``demo`` (``pml-suprank-demo``): a Gradio page: a query image, its neighbours and the OOD guard's verdict
* ``push`` (``pml-suprank-push``): upload an existing model folder (RUN/final) to the Hub, after checking access
* ``prepare_dataset`` (``pml-suprank-prepare-dataset``): a paper benchmark's archive → a ``datasets`` copy

Multi-process and mixed-precision runs go through Accelerate:
``accelerate launch [--multi_gpu --num_processes N] -m pml_suprank.recipes.train_happier --config happier_sop``.
The repository's ``recipes/<name>.py`` are thin entry points of these modules.

This package imports nothing at import time, so that each recipe module can set ``OMP_WAIT_POLICY`` before torch is
loaded.
"""

#: commands, not library API: run them (``python -m pml_suprank.recipes.<name>``), do not import names from them
__all__: list[str] = []
