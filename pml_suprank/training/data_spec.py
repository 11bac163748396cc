"""The data spec of a model folder: ``data_spec.json``, written with the final model of a training run, read by the
recipes that use a trained model (``evaluate``, ``search``, ``fit_heat``) so that ``--model RUN/final`` alone
evaluates on the training run's own test set.

The file holds the run's data options as a hub_config ``data`` section (dataset, data root, label columns — resolved
when training inferred them from a folder —, splits, synthetic sizes, the open-set rule), the seed of its class split
and synthetic sets, the evaluator's options (``k_values``, ``alpha``), and, for a folder split by class, the class
names on each side. :func:`~pml_suprank.training.data_source.dataset_source` turns the section back into the run's
training / test sets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._safe_json import load_json

__all__ = ["DATA_SPEC_FILE", "data_spec", "read_data_spec"]

#: the file name inside a model folder
DATA_SPEC_FILE = "data_spec.json"
#: the format version written
VERSION = 1


def data_spec(
    section: Mapping[str, Any],
    *,
    seed: int,
    k_values: Sequence[int],
    alpha: float,
    label_names: Sequence[str] | None = None,
    class_split: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of ``data_spec.json`` (plain JSON values).

    Args:
        section: The run's data options that are set (``RunSpec.data_section()``).
        seed: The run's seed (class split of a folder without a test split, synthetic sets).
        k_values: Recall@k values of the run's evaluator.
        alpha: H-AP relevance exponent of the run's evaluator.
        label_names: The label columns the run used, finest first (recorded as ``label_columns`` of a retrieval
            dataset when the options left them to be inferred).
        class_split: ``{"train_classes": [...], "test_classes": [...]}`` of a folder split by class, for reference.
    """
    from .data_source import dataset_source, folder_layout

    data = dict(section)
    if label_names and dataset_source(data, "test").kind == "retrieval" and not data.get("label_columns"):
        data["label_columns"] = list(label_names)
    if folder_layout(data.get("dataset")) is not None:  # a local folder: recorded by its name, never its path
        from ..hub.local_names import public_name

        data["dataset"] = public_name(data["dataset"])
    out: dict[str, Any] = {"version": VERSION, "data": data, "seed": int(seed), "k_values": [int(k) for k in k_values],
                           "alpha": float(alpha)}  # fmt: skip
    if class_split:
        out["class_split"] = {k: list(v) for k, v in class_split.items() if k in ("train_classes", "test_classes")}
    return out


def read_data_spec(model: str | Path) -> dict[str, Any] | None:
    """The data spec of the model folder ``model`` (``None``: not a local folder, or written before data specs).

    Raises:
        ValueError: the file is not a JSON object with a ``data`` mapping and an int ``seed`` (the message names
            the file).
    """
    path = Path(model) / DATA_SPEC_FILE
    if not path.is_file():
        return None
    spec = load_json(path, what="data spec", expected=dict)
    if not isinstance(spec.get("data"), dict):
        raise ValueError(f"{path}: expected a JSON object with a 'data' mapping")
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"{path}: 'seed' must be an int >= 0; got {seed!r}")
    from .data_source import data_option_errors

    errors = data_option_errors(spec["data"])
    if errors:
        raise ValueError(f"{path}: data: {'; '.join(errors)}")
    return spec
