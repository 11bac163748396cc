"""``data_spec.json``: the data options a model folder records (written with a run's final model) so that
``evaluate`` / ``search`` / ``fit_heat`` given ``--model RUN/final`` alone use the run's data and test set."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._safe_json import load_json
from .._validation import OptionCheck, is_bool, is_int, shorten
from ..hub.local_names import public_name
from .benchmarks.registry import BENCHMARKS
from .source import SYNTHETIC_NAMES, data_option_errors, dataset_source, folder_layout, is_path_syntax

__all__ = ["DATA_SPEC_FILE", "data_spec", "read_data_spec"]

DATA_SPEC_FILE = "data_spec.json"
VERSION = 1
MAX_CLASSES = 1_000_000  #: most class names a side of a recorded class split may list
_KEYS = ("version", "data", "seed", "k_values", "alpha", "class_split", "local_dataset")
_SIDES = ("train_classes", "test_classes")
#: the data keys naming a local path -> the flag that names it
_PATH_FLAGS = {"dataset": "--dataset (search: --gallery, fit_heat: --id_dataset)", "data_root": "--data_root"}
_CHECKS: dict[str, OptionCheck] = {  # key -> the check of its value
    "version": replace(is_int(1, VERSION), expected=f"an int in [1, {VERSION}] (a newer file needs a newer "
                       "pml-suprank)"),
    "local_dataset": is_bool(),
    "class_split": OptionCheck(lambda v: v is None or isinstance(v, dict) and set(v) <= set(_SIDES) and all(
        isinstance(s, list) and len(s) <= MAX_CLASSES and all(isinstance(c, str) for c in s) for s in v.values()),
        f"a mapping of train_classes / test_classes to lists of at most {MAX_CLASSES} class names"),
}  # fmt: skip


def data_spec(section: Mapping[str, Any], *, seed: int, k_values: Sequence[int], alpha: float,
              label_names: Sequence[str] | None = None, class_split: Mapping[str, Any] | None = None,
              ) -> dict:  # fmt: skip
    """The content of ``data_spec.json``: the run's data ``section`` (a local folder by its name, ``"local_dataset":
    true``; ``label_names``: the ``label_columns`` of a retrieval dataset that inferred them), ``seed``, the
    evaluator's ``k_values`` / ``alpha`` and a folder's ``class_split`` (``train_classes`` / ``test_classes``)."""
    data = dict(section)
    if label_names and dataset_source(data, "test").kind == "retrieval" and not data.get("label_columns"):
        data["label_columns"] = list(label_names)
    if local := folder_layout(data.get("dataset")) is not None:  # a local folder: by its name, never its path
        data["dataset"] = public_name(data["dataset"])
    split = {"class_split": {k: list(v) for k, v in class_split.items() if k in _SIDES}} if class_split else {}
    return {"version": VERSION, "data": data, "seed": int(seed), "k_values": [int(k) for k in k_values],
            "alpha": float(alpha), **({"local_dataset": True} if local else {}), **split}  # fmt: skip


def _is_path(value: Any, folder: Path, where: str = "a recorded value") -> bool:
    """A recorded data value naming a local path (by its form, :func:`~.source.is_path_syntax`, or an existing one);
    ``ValueError`` naming ``where`` for a value the file system refuses to look up (a name too long, a NUL byte)."""
    if not isinstance(value, str) or value in (*SYNTHETIC_NAMES, *BENCHMARKS):
        return False
    if is_path_syntax(value):
        return True
    try:
        return Path(value).exists() or (folder / value).exists()
    except (OSError, ValueError) as e:  # ENAMETOOLONG, "embedded null byte": no path, no name either
        raise ValueError(f"{where} is {shorten(repr(value), 80)}: neither a dataset name nor a usable path "
                         f"({type(e).__name__}: {shorten(str(e), 80)})") from None  # fmt: skip


def read_data_spec(model: str | Path, *, dataset: str | None = None, data_root: str | None = None,
                   problems: Callable[[Mapping[str, Any]], list[str]] | None = None) -> dict | None:  # fmt: skip
    """The data spec of the model folder ``model`` (``None``: none there), a suggestion the user confirms. Refused
    (``ValueError`` naming the file, the key and the flag to give): unknown keys, a newer ``version``, a value that
    ``problems`` (the flags' checks) refuses, a recorded path (``dataset``, ``data_root``) outside the folder unless the
    user typed that option (one inside is returned absolute), a folder recorded by name without ``dataset``. ``data``:
    the recorded section with the typed ``dataset``; ``None`` when that is another dataset."""
    path = Path(model) / DATA_SPEC_FILE
    if not path.is_file():
        return None
    spec = load_json(path, what="data spec", expected=dict)
    if not isinstance(spec.get("data"), dict):
        raise ValueError(f"{path}: expected a JSON object with a 'data' mapping")
    errors = [f"unknown key {k!r} (valid: {list(_KEYS)})" for k in spec if k not in _KEYS]
    errors += [f"{k!r} must be {check.expected}; got {shorten(repr(spec[k]), 200)}" for k, check in _CHECKS.items()
               if k in spec and not check(spec[k])]  # fmt: skip
    if errors := errors + (problems(spec) if problems else []):
        raise ValueError(f"{path}: " + "; ".join(errors))
    folder, data, local = Path(model).resolve(), dict(spec["data"]), bool(spec.get("local_dataset"))
    recorded = data.get("dataset")
    if local and dataset is None:
        raise ValueError(f"{path}: the model was trained on a local folder named {recorded!r} (a model folder records "
                         f"its name, never its path): give that folder with {_PATH_FLAGS['dataset']}")  # fmt: skip
    try:  # the same data: the recorded name, or a local folder where one was recorded (by name: a folder of that name)
        same = dataset in (None, recorded) or folder_layout(dataset) is not None and (
            public_name(dataset) == recorded if local else _is_path(recorded, folder))  # fmt: skip
    except ValueError:  # not a readable folder: another dataset
        same = False
    if not same:  # another dataset: its own options; the recorded seed and evaluator options still apply
        return {"seed": 0, **spec, "data": None}
    typed = {"dataset": dataset, "data_root": data_root}
    for key, flag in _PATH_FLAGS.items():
        if not (key == "dataset" and local) and _is_path(value := data.get(key), folder, f"{path}: data.{key}"):
            where = (folder / Path(value).expanduser()).resolve()
            if where.is_relative_to(folder):
                data[key] = str(where)
            elif typed[key] is None:
                raise ValueError(f"{path}: data.{key} is {value!r}, a path outside the model folder: a model folder's "
                                 f"recorded paths are followed only when you name them; give {flag} {value} to use it "
                                 "(or another dataset)")  # fmt: skip
    if errors := data_option_errors({k: v for k, v in data.items() if typed.get(k) is None}):
        raise ValueError(f"{path}: data: {'; '.join(errors)}")
    return {"seed": 0, **spec, "data": {**data, "dataset": dataset} if dataset is not None else data}
