"""The data spec of a model folder: ``data_spec.json``, written with the final model of a training run, read by the
recipes that use a trained model (``evaluate``, ``search``, ``fit_heat``) so that ``--model RUN/final`` alone
evaluates on the training run's own test set.

The file holds the run's data options as a hub_config ``data`` section (dataset, data root, label columns — resolved
when training inferred them from a folder —, splits, synthetic sizes, the open-set rule), the seed of its class split
and synthetic sets, the evaluator's options (``k_values``, ``alpha``), and, for a folder split by class, the class
names on each side. :func:`~pml_suprank.data.source.dataset_source` turns the section back into the run's
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
    from ..data.source import dataset_source, folder_layout

    data = dict(section)
    if label_names and dataset_source(data, "test").kind == "retrieval" and not data.get("label_columns"):
        data["label_columns"] = list(label_names)
    local = folder_layout(data.get("dataset")) is not None
    if local:  # a local folder: recorded by its name, never its path
        from ..hub.local_names import public_name

        data["dataset"] = public_name(data["dataset"])
    out: dict[str, Any] = {"version": VERSION, "data": data, "seed": int(seed), "k_values": [int(k) for k in k_values],
                           "alpha": float(alpha)}  # fmt: skip
    if local:
        out["local_dataset"] = True
    if class_split:
        out["class_split"] = {k: list(v) for k, v in class_split.items() if k in ("train_classes", "test_classes")}
    return out


#: the keys of a data spec
_KEYS = ("version", "data", "seed", "k_values", "alpha", "class_split", "local_dataset")
#: the data keys that name a local path
PATH_KEYS = ("dataset", "data_root")
#: most class names a recorded class split may list
MAX_CLASSES = 1_000_000


def _is_path(value: Any, folder: Path) -> bool:
    """A recorded data value naming a local path (a Hub id is ``org/name``: never absolute, no leading ``.``/``~``)."""
    from ..data.benchmarks.registry import BENCHMARKS
    from ..data.source import SYNTHETIC_NAMES

    if not isinstance(value, str) or value in SYNTHETIC_NAMES or value in BENCHMARKS:
        return False
    if Path(value).is_absolute() or value.startswith((".", "~")) or "\\" in value:
        return True
    return Path(value).exists() or (folder / value).exists()


def _value_problems(spec: Mapping[str, Any]) -> list[str]:
    """The recorded values against the field checks of the flags that set them."""
    from dataclasses import fields

    from .config import TrainingConfig, field_problem
    from .options import DataOptions

    problems = [f"unknown key {k!r} (valid: {list(_KEYS)})" for k in spec if k not in _KEYS]
    version = spec.get("version", VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= VERSION:
        problems.append(f"'version' must be an int in [1, {VERSION}] (a newer file needs a newer pml-suprank); got "
                        f"{version!r}")  # fmt: skip
    data_fields = {f.name: f for f in fields(DataOptions)}
    for key, value in spec["data"].items():
        if key not in data_fields:
            problems.append(f"unknown key 'data.{key}' (valid: {sorted(data_fields)})")
        elif (p := field_problem(data_fields[key], value)) is not None:
            problems.append(f"data.{key} {p}")
    train_fields = {f.name: f for f in fields(TrainingConfig)}
    for key in ("seed", "k_values", "alpha"):
        if key in spec and (p := field_problem(train_fields[key], spec[key])) is not None:
            problems.append(f"{key} {p}")
    if not isinstance(spec.get("local_dataset", False), bool):
        problems.append(f"'local_dataset' must be true or false; got {spec['local_dataset']!r}")
    split = spec.get("class_split")
    if split is not None and not (
        isinstance(split, dict)
        and set(split) <= {"train_classes", "test_classes"}
        and all(isinstance(v, list) and len(v) <= MAX_CLASSES and all(isinstance(c, str) for c in v)
                for v in split.values())  # fmt: skip
    ):
        problems.append("'class_split' must map train_classes / test_classes to lists of class names")
    return problems


def read_data_spec(model: str | Path, *, typed: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The data spec of the model folder ``model`` (``None``: not a local folder, or written before data specs).

    A model folder's data spec is a suggestion, held to the checks of the flags: unknown keys and a newer
    ``version`` are refused, every value passes the check of the option that sets it (``--k_values``,
    ``--alpha``, ``--num_per_class``, ``--image_size``...), and a recorded local path (``dataset``, ``data_root``)
    outside the model folder is not followed unless the user names that option (``typed``: the options given on the
    command line, e.g. ``{"dataset": args.dataset, "data_root": args.data_root}``; a typed value replaces the
    recorded one). A recorded path inside the model folder is returned absolute. A local training folder is recorded
    by its name alone (``"local_dataset": true``): the user must name the folder (``typed["dataset"]``).

    Raises:
        ValueError: the file is not a JSON object with a ``data`` mapping, a value is refused, or a recorded path
            outside the folder is not confirmed (the message names the file, the key and the flag to give).
    """
    path = Path(model) / DATA_SPEC_FILE
    if not path.is_file():
        return None
    spec = load_json(path, what="data spec", expected=dict)
    if not isinstance(spec.get("data"), dict):
        raise ValueError(f"{path}: expected a JSON object with a 'data' mapping")
    problems = _value_problems(spec)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    folder = Path(model).resolve()
    data = dict(spec["data"])
    if spec.get("local_dataset") and (typed or {}).get("dataset") is None:
        raise ValueError(
            f"{path}: the model was trained on a local folder named {data.get('dataset')!r} (a model folder records "
            "its name, never its path): give that folder with --dataset (search: --gallery, fit_heat: --id_dataset)"
        )
    for key in PATH_KEYS:
        value = data.get(key)
        if key == "dataset" and spec.get("local_dataset"):
            continue
        if not _is_path(value, folder):
            continue
        where = (folder / Path(value).expanduser()).resolve()
        if where.is_relative_to(folder):
            data[key] = str(where)
        elif (typed or {}).get(key) is None:
            flag = "--data_root" if key == "data_root" else "--dataset (search: --gallery, fit_heat: --id_dataset)"
            raise ValueError(
                f"{path}: data.{key} is {value!r}, a path outside the model folder: a model folder's recorded paths "
                f"are followed only when you name them; give {flag} {value} to use it (or another dataset)"
            )
    spec["data"] = data
    spec.setdefault("seed", 0)
    from ..data.source import data_option_errors

    errors = data_option_errors({k: v for k, v in data.items() if (typed or {}).get(k) is None})
    if errors:
        raise ValueError(f"{path}: data: {'; '.join(errors)}")
    return spec
