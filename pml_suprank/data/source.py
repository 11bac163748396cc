"""Where a run's training / test set comes from (:class:`DatasetSource`, from a ``data`` section): a built-in synthetic
set, a paper benchmark (under ``data_root``) or a retrieval dataset (Hub id, local folder or parquet, with label
columns and an optional open-set rule); a local image folder without a test split is split by class, seeded by the run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from .._validation import check_choice, shorten
from .benchmarks.registry import BENCHMARKS, BenchmarkSpec, benchmark_label_names, load_benchmark
from .folders import FolderLayout, class_names_of, class_split, class_split_side, image_folder_layout
from .loading import load_retrieval_dataset
from .synthetic_multishapes import SYNTHETIC_DATASETS, synthetic_dataset
from .synthetic_shapes import Split

__all__ = [
    "SYNTHETIC_NAMES",
    "DatasetSource",
    "data_option_errors",
    "dataset_source",
    "folder_layout",
    "is_path_syntax",
    "missing_path_problem",
    "resolved_split",
]

SYNTHETIC_NAMES = tuple(SYNTHETIC_DATASETS)  #: the built-in datasets
SYNTHETIC_SPLITS: tuple[str, ...] = get_args(Split)  #: the splits of the built-in datasets


@dataclass(frozen=True)
class DatasetSource:
    """One split of a dataset, ready to load: ``kind``, ``name`` (the set, the benchmark, or the Hub id / path),
    ``split`` (``"a+b"`` concatenates), a benchmark's ``root`` and loader ``options`` (``class_split``: the side of
    the seeded class split of a folder without a test split)."""

    kind: Literal["synthetic", "benchmark", "retrieval"]
    name: str
    split: str
    root: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def load(
        self, transform: Any = None, *, seed: int = 0, recorded_split: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """The dataset (``seed``: of the synthetic sets and of a class split; ``kwargs``: extra loader arguments such
        as ``cache_dir``, none for a benchmark). ``ValueError``: the folder's seeded class split no longer gives the
        ``{"train_classes", "test_classes"}`` a model recorded (``recorded_split``)."""
        options = {**self.options, **kwargs}
        side = options.pop("class_split", None)
        if side is not None:
            whole = load_retrieval_dataset(self.name, split=self.split, transform=transform, **options)
            if recorded_split:
                _check_recorded_split(whole, recorded_split, seed, self.name)
            return class_split_side(whole, side, seed=seed)
        if self.kind == "synthetic":
            return synthetic_dataset(self.name, self.split, seed=seed, transform=transform, **options)
        if self.kind == "benchmark":
            if options:
                raise TypeError(f"benchmark {self.name} takes no loader arguments; got {sorted(options)}")
            return load_benchmark(self.name, self.root, self.split, transform)
        return load_retrieval_dataset(self.name, split=self.split, transform=transform, **options)


def dataset_source(data: Mapping[str, Any], part: str, *, data_root: str | Path | None = None) -> DatasetSource:
    """The :class:`DatasetSource` of the ``part`` (``"train"`` / ``"test"``) of a data section that
    :func:`data_option_errors` accepts (a synthetic set too reads ``data.<part>_split``, default ``part``);
    ``data_root`` replaces the section's. ``ValueError``: a retrieval dataset other than a local image folder without
    ``data.label_columns`` (unset or empty)."""
    check_choice("part", part, ("train", "test"))
    dataset = data.get("dataset", "synthetic")
    split = resolved_split({"data": data}, part)
    if dataset in SYNTHETIC_NAMES:
        options = {k: data[k] for k in ("num_per_class", "image_size") if data.get(k) is not None}
        return DatasetSource("synthetic", dataset, split, options=options)
    if dataset in BENCHMARKS:
        root = data_root if data_root is not None else data.get("data_root")
        return DatasetSource("benchmark", dataset, split, root=None if root is None else str(root))
    layout = folder_layout(dataset)
    options: dict[str, Any] = {"label_columns": _label_columns(data, layout)}
    rules = {k: data[k] for k in ("train_classes_per_coarse", "train_class_fraction") if k in data}
    if layout is not None and layout.needs_class_split and not any(data.get(f"{p}_split") for p in ("train", "test")):
        if not (data.get("open_set") and rules):  # the folder's classes split in two, seeded by the run
            return DatasetSource("retrieval", dataset, "train", options={**options, "class_split": part})
        split = "train"  # the user's open-set rule splits the one split of the folder
    if data.get("open_set"):
        options["open_set"] = part
        options.update(rules)
    return DatasetSource("retrieval", dataset, split, options=options)


def _label_columns(data: Mapping[str, Any], layout: FolderLayout | None) -> list[str]:
    """The label columns of the retrieval ``data`` section: ``data.label_columns`` (a column name or a non-empty list,
    finest first), else, unset or empty, the levels of a local image folder (``layout``). ``ValueError``: neither."""
    given = data.get("label_columns")
    if not given and layout is not None:  # a local image folder has label levels of its own
        return list(layout.label_columns)
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(c, str) for c in names):
        raise ValueError(
            f"'data.label_columns' must be a non-empty list of column names, finest first (e.g. ['fine_label', "
            f"'coarse_label']), for dataset {shorten(repr(data.get('dataset')), 200)}: only a local image folder "
            f"(class folders or a metadata.csv) has label levels of its own; got {shorten(repr(given), 200)}"
        )
    return list(names)


def _check_recorded_split(whole: Any, recorded: Mapping[str, Any], seed: int, name: str) -> None:
    train, test = class_split(whole.labels, seed=seed)
    now = {"train_classes": class_names_of(whole, train), "test_classes": class_names_of(whole, test)}
    for key, names in now.items():
        if key in recorded and sorted(map(str, recorded[key])) != sorted(names):
            before, after = set(map(str, recorded[key])), set(names)
            raise ValueError(
                f"the classes of {name} changed since the model was trained: its seeded class split no longer gives "
                f"the recorded {key.split('_')[0]} classes (now also: {sorted(after - before)[:10]}, now missing: "
                f"{sorted(before - after)[:10]}); the test set would silently change — evaluate on the folder as it "
                "was, or give it a test/ split"
            )


def folder_layout(dataset: Any) -> FolderLayout | None:
    """The :class:`FolderLayout` of ``dataset`` when it names a local folder of images, else ``None``."""
    if not isinstance(dataset, str) or dataset in SYNTHETIC_NAMES or dataset in BENCHMARKS:
        return None
    return image_folder_layout(dataset)


def is_path_syntax(dataset: Any) -> bool:
    """The ``dataset`` string can only be a local path: absolute, starting with ``.`` or ``~``, a ``.parquet`` file,
    with a separator other than ``/``, or with ``/`` other than once between two names (a Hub id is ``name`` or
    ``org/name``, so ``org/name`` stays a Hub id). A glob pattern is left to the parquet loader."""
    if not isinstance(dataset, str) or not dataset or any(c in dataset for c in "*?"):
        return False
    parts = dataset.split("/")
    return (
        dataset.startswith((".", "~"))
        or Path(dataset).is_absolute()
        or dataset.endswith(".parquet")
        or "\\" in dataset
        or (os.sep != "/" and os.sep in dataset)
        or len(parts) > 2
        or (len(parts) == 2 and "" in parts)
    )


def missing_path_problem(dataset: Any) -> str | None:
    """``"no such folder or file: <dataset> ..."`` when the ``dataset`` string can only be a local path
    (:func:`is_path_syntax`) and nothing is there, else ``None``."""
    if not is_path_syntax(dataset) or Path(dataset).expanduser().exists():
        return None
    return f"no such folder or file: {dataset} (a local path; a Hub dataset id has the form 'org/name')"


def data_option_errors(data: Mapping[str, Any], *, require_root: bool = False) -> list[str]:
    """The problems of a ``data`` section as messages naming the keys (``[]``: consistent): label columns, a
    benchmark's splits and (``require_root``) ``data_root``, the open-set rules."""
    errors = []
    dataset = data.get("dataset")
    spec = BENCHMARKS.get(dataset) if isinstance(dataset, str) else None
    given = data.get("label_columns") or []
    levels = [given] if isinstance(given, str) else list(given)
    if spec is not None:
        errors += _benchmark_errors(spec, data, require_root)
    elif missing := missing_path_problem(dataset):
        errors.append(missing)
    elif dataset in SYNTHETIC_NAMES:
        errors += [f"'data.{p}_split' (--{p}_split) must be a split of the built-in dataset {dataset} "
                   f"{list(SYNTHETIC_SPLITS)}; got {split!r}" for p in ("train", "test")
                   if (split := data.get(f"{p}_split")) is not None and split not in SYNTHETIC_SPLITS]  # fmt: skip
    elif dataset is not None and not levels:  # unset or empty: a folder's levels
        try:
            layout = folder_layout(dataset)
        except (ValueError, OSError) as e:
            errors.append(str(e))
        else:
            levels = list(layout.label_columns) if layout is not None else levels
            if layout is None:
                errors.append(
                    "'data.label_columns' is required unless data.dataset is 'synthetic', a benchmark name or a "
                    "local image folder (class folders or a metadata.csv)"
                )
    if spec is None and "data_root" in data:
        errors.append(f"'data.data_root' is for a benchmark dataset ({', '.join(BENCHMARKS)}); got dataset {dataset!r}")
    if dataset in SYNTHETIC_NAMES and "label_columns" in data:
        errors.append(f"'data.label_columns' must not be set for the built-in dataset {dataset} (it has its own)")
    rules = [k for k in ("train_classes_per_coarse", "train_class_fraction") if k in data]
    if len(rules) > 1:
        errors.append(f"'data' sets both {rules}; give one open-set rule")
    if rules and not data.get("open_set", False):
        errors.append(f"'data.{rules[0]}' needs 'data.open_set: true'")
    if rules and dataset in SYNTHETIC_NAMES:
        errors.append("the synthetic dataset has its own open-set split; drop the open-set rule")
    if rules and spec is not None:
        errors.append(f"benchmark {dataset} has its own train / test splits; drop 'data.{rules[0]}'")
    if "train_classes_per_coarse" in data and len(levels) < 2:  # given, or the levels of a local image folder
        errors.append("'data.train_classes_per_coarse' needs at least two label_columns (fine and coarse)")
    return errors


def _benchmark_errors(spec: BenchmarkSpec, data: Mapping[str, Any], require_root: bool) -> list[str]:
    errors = []
    for part in ("train", "test"):
        split = data.get(f"{part}_split")
        if split is not None and split not in spec.splits:
            errors.append(
                f"'data.{part}_split' must be a split of benchmark {spec.name} {list(spec.splits)}; got {split!r}"
            )
    try:
        resolved_split({"data": data}, "test")
    except ValueError as e:
        errors.append(str(e))
    train_split = data.get("train_split") or spec.train_split
    if "label_columns" in data and train_split in spec.splits:
        names = list(benchmark_label_names(spec.name, train_split))
        if list(data["label_columns"]) != names:
            errors.append(
                f"'data.label_columns' {list(data['label_columns'])} does not match the label names {names} of "
                f"benchmark {spec.name} (split {train_split!r}); drop label_columns or give exactly these"
            )
    if require_root and not data.get("data_root"):
        errors.append(
            f"benchmark {spec.name} is read from its archive: give its folder with --data_root (data.data_root); "
            f"expected layout: {spec.layout}"
        )
    return errors


def resolved_split(config: Mapping[str, Any], part: str) -> str:
    """The split of the ``part`` (``"train"`` / ``"test"``) dataset: ``data.<part>_split``, else a benchmark's own
    split, else ``part``."""
    check_choice("part", part, ("train", "test"))
    data = config.get("data") or {}
    split = data.get(f"{part}_split")
    if split is not None:
        return split
    spec = BENCHMARKS.get(data.get("dataset")) if isinstance(data.get("dataset"), str) else None
    if spec is None:
        return part
    split = spec.train_split if part == "train" else spec.test_split
    if split is None:
        raise ValueError(
            f"benchmark {spec.name} has no single test split (evaluate it with pml-suprank-evaluate --benchmark "
            f"{spec.name}); set data.test_split (--test_split) to one of {list(spec.splits)}"
        )
    return split
