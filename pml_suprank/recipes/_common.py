"""Plumbing of the recipes that use a trained model (``evaluate``, ``search``, ``ood_score``, ``fit_heat``); a refusal
is one ``error:`` line, exit 2 (:func:`~pml_suprank._terminal.refuse`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from pml_suprank._terminal import refuse
from pml_suprank._validation import check_device


def load_model(name: str, device: torch.device | None = None, guard_for: str | None = None) -> Any:
    """The :class:`~pml_suprank.models.RetrievalModel` of the folder or Hub id ``name`` (on ``device``, in eval
    mode), or a refusal naming ``--model``; ``guard_for``: the flag that needs the model's OOD guard."""
    from pml_suprank.models import RetrievalModel

    try:
        model = RetrievalModel.from_pretrained(name)
    except (OSError, ValueError, TypeError) as e:
        refuse(f"--model {name}: {e}")
    if guard_for is not None and model.ood_guard is None:
        refuse(
            f"{guard_for}: the model {name} has no OOD guard (ood/guard.json): fit one with "
            f"`pml-suprank-fit-heat --model {name}`"
        )
    return model if device is None else model.to(device).eval()


def device(name: str | None) -> torch.device:
    """``--device``, else CUDA when available, else the CPU; a refusal naming ``--device`` when this machine has no
    such accelerator (the parser checked the spelling)."""
    try:  # the package's one device check: parsed, and its backend (CUDA, MPS, XPU) and index available here
        return check_device("--device", name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except ValueError as e:
        refuse(e)


def test_transform(model: torch.nn.Module) -> Any:
    """The evaluation transform of a (possibly wrapped) model's ``data_config``."""
    from pml_suprank import data

    return data.build_transforms(getattr(model, "module", model).data_config, train=False)


def output_folder(path: str | Path, inputs: Mapping[str, Any] | None = None, *, create: bool = True) -> Path:
    """``--output_dir``, created and checked writable before any work, or a refusal naming it; ``inputs``: the local
    input folders ``{"--flag": path}`` (the model folder, the data) it must not lie inside, where its files would
    replace the model's own (``metrics.json``, the plots) or be read back as data. ``create=False``: that check
    alone, before the inputs are read, for a recipe whose later refusals come before the folder is made (a refused
    run leaves no folder behind); it then calls this again to create it."""
    from pml_suprank.training.run_folder import OutputDirError, check_outside_inputs, prepare_output_dir

    try:
        check_outside_inputs(path, inputs or {})
        return prepare_output_dir(path) if create else Path(path)
    except OutputDirError as e:
        refuse(e)


def console_script(main: Callable[[], Any]) -> Callable[[], None]:
    """A recipe's ``run()``, its console script ``pml-suprank-<name>``: ``main()`` on the process's arguments, its
    results dropped (a console script's return value would be its exit status)."""

    def run() -> None:
        main()

    return run


def ood_features(model: torch.nn.Module, loader: Any, cache: str, kind: str, extract: Callable, drop=()) -> Any:
    """The :class:`~pml_suprank.ood.OODFeatures` of ``loader`` through the embedding cache ``cache``: ``extract``
    (batches → ``OODFeatures``) runs on the batches the cache misses; ``kind``: the cache's ``feature_kind``;
    ``drop``: fields not cached."""
    from pml_suprank.data.embedding_cache import cached_features
    from pml_suprank.ood import OODFeatures

    def tensors(batches: Any) -> dict[str, torch.Tensor]:
        return {k: v for k, v in vars(extract(batches)).items() if v is not None and k not in drop}

    found = cached_features(model, loader, cache, feature_kind=kind, extract=tensors)
    return OODFeatures(**{"std_features": None, "logits": None, **found})
