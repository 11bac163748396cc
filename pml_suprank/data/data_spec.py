"""The data spec of a model folder, ``data_spec.json``: written with the final model of a training run, read by the
recipes that use a trained model (``evaluate``, ``search``, ``fit_heat``) so that ``--model RUN/final`` alone works
on the run's own test set.

It holds the run's data options as a hub_config ``data`` section (label columns resolved when training inferred
them; a local folder by its name, ``"local_dataset": true``), the seed of its class split and synthetic sets, the
evaluator's ``k_values`` and ``alpha``, and, for a folder split by class, the class names on each side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._safe_json import load_json
from .benchmarks.registry import BENCHMARKS
from .source import SYNTHETIC_NAMES, data_option_errors, dataset_source, folder_layout

__all__ = ["DATA_SPEC_FILE", "data_spec", "read_data_spec"]

DATA_SPEC_FILE = "data_spec.json"
VERSION = 1
_KEYS = ("version", "data", "seed", "k_values", "alpha", "class_split", "local_dataset")
#: the data keys that name a local path
PATH_KEYS = ("dataset", "data_root")
#: most class names a recorded class split may list
MAX_CLASSES = 1_000_000


def data_spec(section: Mapping[str, Any], *, seed: int, k_values: Sequence[int], alpha: float,
              label_names: Sequence[str] | None = None, class_split: Mapping[str, Any] | None = None,
              ) -> dict:  # fmt: skip
    """The content of ``data_spec.json``: the run's data ``section`` (``RunSpec.data_section()``; a local folder by
    its name, ``label_names`` as the ``label_columns`` of a retrieval dataset that inferred them), ``seed``, the
    evaluator's ``k_values`` / ``alpha`` and a folder's ``class_split`` (``train_classes`` / ``test_classes``)."""
    from ..hub.local_names import public_name

    data = dict(section)
    if label_names and dataset_source(data, "test").kind == "retrieval" and not data.get("label_columns"):
        data["label_columns"] = list(label_names)
    local = folder_layout(data.get("dataset")) is not None
    if local:  # a local folder: recorded by its name, never its path
        data["dataset"] = public_name(data["dataset"])
    out: dict[str, Any] = {"version": VERSION, "data": data, "seed": int(seed), "k_values": [int(k) for k in k_values],
                           "alpha": float(alpha)}  # fmt: skip
    if local:
        out["local_dataset"] = True
    if class_split:
        out["class_split"] = {k: list(v) for k, v in class_split.items() if k in ("train_classes", "test_classes")}
    return out


def _is_path(value: Any, folder: Path) -> bool:
    """A recorded data value naming a local path (a Hub id is ``org/name``: never absolute, no leading ``.``/``~``)."""
    if not isinstance(value, str) or value in SYNTHETIC_NAMES or value in BENCHMARKS:
        return False
    if Path(value).is_absolute() or value.startswith((".", "~")) or "\\" in value:
        return True
    return Path(value).exists() or (folder / value).exists()


def _problems(spec: Mapping[str, Any]) -> list[str]:
    problems = [f"unknown key {k!r} (valid: {list(_KEYS)})" for k in spec if k not in _KEYS]
    version = spec.get("version", VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= VERSION:
        problems.append(f"'version' must be an int in [1, {VERSION}] (a newer file needs a newer pml-suprank); got "
                        f"{version!r}")  # fmt: skip
    if not isinstance(spec.get("local_dataset", False), bool):
        problems.append(f"'local_dataset' must be true or false; got {spec['local_dataset']!r}")
    split = spec.get("class_split")
    if split is not None and not (
        isinstance(split, dict) and set(split) <= {"train_classes", "test_classes"}
        and all(isinstance(v, list) and len(v) <= MAX_CLASSES and all(isinstance(c, str) for c in v)
                for v in split.values())
    ):  # fmt: skip
        problems.append("'class_split' must map train_classes / test_classes to lists of class names")
    return problems


def _same_data(dataset: str, recorded: Mapping[str, Any], local: bool, folder: Path) -> bool:
    """The typed ``dataset`` is the recorded one: the same name, or a local folder where the recorded one is a local
    folder too (the same data moved; a folder recorded by name: a folder of that name)."""
    from ..hub.local_names import public_name

    if dataset == recorded.get("dataset"):
        return True
    try:
        if folder_layout(dataset) is None:
            return False
    except ValueError:
        return False
    return public_name(dataset) == recorded.get("dataset") if local else _is_path(recorded.get("dataset"), folder)


def read_data_spec(model: str | Path, *, dataset: str | None = None, data_root: str | None = None,
                   problems: Callable[[Mapping[str, Any]], list[str]] | None = None) -> dict | None:  # fmt: skip
    """The data spec of the model folder ``model`` (``None``: not a local folder, or no data spec), a suggestion the
    user confirms: unknown keys and a newer ``version`` are refused, ``problems`` (the checks of the flags that set
    each value) refuse a value, and a recorded local path (``dataset``, ``data_root``) outside the folder is
    followed only when the user typed that option (``dataset`` / ``data_root``; a path inside the folder is returned
    absolute). A folder recorded by name needs ``dataset``.

    ``data`` of the result is the section for the typed ``dataset``: the recorded one (``dataset`` replaced by the
    typed one, :func:`_same_data`), or ``None`` when the typed dataset is another one (its paths are then not
    checked; the recorded seed and evaluator options still apply).

    Raises:
        ValueError: naming the file, the key and the flag to give.
    """
    path = Path(model) / DATA_SPEC_FILE
    if not path.is_file():
        return None
    spec = load_json(path, what="data spec", expected=dict)
    if not isinstance(spec.get("data"), dict):
        raise ValueError(f"{path}: expected a JSON object with a 'data' mapping")
    errors = _problems(spec) + (problems(spec) if problems else [])
    if errors:
        raise ValueError(f"{path}: " + "; ".join(errors))
    folder, data, local = Path(model).resolve(), dict(spec["data"]), bool(spec.get("local_dataset"))
    if local and dataset is None:
        raise ValueError(
            f"{path}: the model was trained on a local folder named {data.get('dataset')!r} (a model folder records "
            "its name, never its path): give that folder with --dataset (search: --gallery, fit_heat: --id_dataset)"
        )
    spec.setdefault("seed", 0)
    if dataset is not None and not _same_data(dataset, data, local, folder):
        return {**spec, "data": None}
    typed = {"dataset": dataset, "data_root": data_root}
    for key in PATH_KEYS:
        value = data.get(key)
        if (key == "dataset" and local) or not _is_path(value, folder):
            continue
        where = (folder / Path(value).expanduser()).resolve()
        if where.is_relative_to(folder):
            data[key] = str(where)
        elif typed[key] is None:
            flag = "--data_root" if key == "data_root" else "--dataset (search: --gallery, fit_heat: --id_dataset)"
            raise ValueError(
                f"{path}: data.{key} is {value!r}, a path outside the model folder: a model folder's recorded paths "
                f"are followed only when you name them; give {flag} {value} to use it (or another dataset)"
            )
    errors = data_option_errors({k: v for k, v in data.items() if typed.get(k) is None})
    if errors:
        raise ValueError(f"{path}: data: {'; '.join(errors)}")
    return {**spec, "data": {**data, "dataset": dataset} if dataset is not None else data}
