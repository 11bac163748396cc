"""Where the training / test set of a run comes from: :class:`DatasetSource`, a typed description read from a data
section (a :class:`~pml_suprank.training.DataOptions` or a hub_config ``data`` mapping).

Three kinds: the built-in synthetic sets (``"synthetic"``, ``"synthetic_multilabel"``), a paper benchmark read from
its archive by name (:data:`pml_suprank.data.BENCHMARKS`, under ``data_root``) and a retrieval dataset (a Hub
id or a local folder / parquet path, with its label columns and the optional open-set rule). A local image folder
needs no label column (:func:`pml_suprank.data.image_folder_layout`: class folders or a ``metadata.csv``), and one
without a test split is split by class (:func:`pml_suprank.data.class_split`, seeded by the run's seed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..data.benchmarks.registry import BENCHMARKS, BenchmarkSpec, benchmark_label_names
from ..data.folders import FolderLayout, image_folder_layout
from ..losses.registry import registered_losses

__all__ = [
    "SYNTHETIC_NAMES",
    "DatasetSource",
    "data_option_errors",
    "dataset_source",
    "folder_layout",
    "multilabel_option_errors",
    "resolved_split",
]

#: the built-in datasets (:func:`pml_suprank.data.synthetic_dataset`)
SYNTHETIC_NAMES = ("synthetic", "synthetic_multilabel")


@dataclass(frozen=True)
class DatasetSource:
    """One split of a dataset, ready to load.

    Attributes:
        kind: ``"synthetic"``, ``"benchmark"`` or ``"retrieval"``.
        name: The synthetic set's name, the benchmark name, or the Hub id / local path.
        split: The split read (``"a+b"`` concatenates for a retrieval dataset).
        root: The benchmark's folder (benchmarks only).
        options: Further loader arguments: ``num_per_class`` / ``image_size`` (synthetic); ``label_columns``,
            ``open_set`` and the open-set rule (retrieval); ``class_split``: the side (``"train"`` / ``"test"``) of
            the seeded class split of a local folder without a test split (:func:`pml_suprank.data.class_split`).
    """

    kind: Literal["synthetic", "benchmark", "retrieval"]
    name: str
    split: str
    root: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def load(
        self, transform: Any = None, *, seed: int = 0, recorded_split: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """The dataset (``transform``: callable on a PIL image; ``seed``: the synthetic sets' seed and the seed of a
        class split; ``recorded_split``: the ``class_split`` a model folder recorded (``{"train_classes": [...],
        "test_classes": [...]}``), which a folder split by class must still give; ``kwargs``: extra or overriding
        loader arguments such as ``cache_dir``; a benchmark takes none).

        Raises:
            ValueError: the folder's class split differs from ``recorded_split`` (a class folder added or removed
                since training: the test classes would silently change).
        """
        from .. import data

        options = {**self.options, **kwargs}
        side = options.pop("class_split", None)
        if side is not None:
            whole = data.load_retrieval_dataset(self.name, split=self.split, transform=transform, **options)
            if recorded_split:
                _check_recorded_split(whole, recorded_split, seed, self.name)
            return data.class_split_side(whole, side, seed=seed)
        if self.kind == "synthetic":
            return data.synthetic_dataset(self.name, self.split, seed=seed, transform=transform, **options)
        if self.kind == "benchmark":
            if options:
                raise TypeError(f"benchmark {self.name} takes no loader arguments; got {sorted(options)}")
            return data.load_benchmark(self.name, self.root, self.split, transform)
        return data.load_retrieval_dataset(self.name, split=self.split, transform=transform, **options)


def dataset_source(data: Mapping[str, Any], part: str, *, data_root: str | Path | None = None) -> DatasetSource:
    """The :class:`DatasetSource` of the ``part`` (``"train"`` / ``"test"``) of a consistent data section (checked by
    :func:`pml_suprank.training.hub_config.data_option_errors`, e.g. as part of a
    :class:`~pml_suprank.training.RunSpec`).

    Args:
        data: The data options that are set (a hub_config ``data`` section, or ``RunSpec.data_section()``).
        part: ``"train"`` or ``"test"``.
        data_root: The benchmark's folder; replaces ``data_root``.
    """
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test'; got {part!r}")
    dataset = data.get("dataset", "synthetic")
    if dataset in SYNTHETIC_NAMES:
        options = {k: data[k] for k in ("num_per_class", "image_size") if data.get(k) is not None}
        return DatasetSource("synthetic", dataset, part, options=options)
    split = resolved_split({"data": data}, part)
    if dataset in BENCHMARKS:
        root = data_root if data_root is not None else data.get("data_root")
        return DatasetSource("benchmark", dataset, split, root=None if root is None else str(root))
    layout = folder_layout(dataset)
    columns = data.get("label_columns") or (layout.label_columns if layout is not None else None)
    options: dict[str, Any] = {"label_columns": list(columns)}
    rules = {k: data[k] for k in ("train_classes_per_coarse", "train_class_fraction") if k in data}
    if layout is not None and layout.needs_class_split and not any(data.get(f"{p}_split") for p in ("train", "test")):
        if not (data.get("open_set") and rules):  # the folder's classes split in two, seeded by the run
            return DatasetSource("retrieval", dataset, "train", options={**options, "class_split": part})
        split = "train"  # the user's open-set rule splits the one split of the folder
    if data.get("open_set"):
        options["open_set"] = part
        options.update(rules)
    return DatasetSource("retrieval", dataset, split, options=options)


def _check_recorded_split(whole: Any, recorded: Mapping[str, Any], seed: int, name: str) -> None:
    """Refuse a folder whose seeded class split is no longer the one a model recorded."""
    from ..data.folders import class_names_of, class_split

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
    """The :class:`~pml_suprank.data.FolderLayout` of ``dataset`` when it names a local folder of images, else
    ``None`` (a built-in set, a benchmark name, a Hub id, parquet files; ``ValueError`` for an image folder whose
    labels cannot be read)."""
    if not isinstance(dataset, str) or dataset in SYNTHETIC_NAMES or dataset in BENCHMARKS:
        return None
    return image_folder_layout(dataset)


def _benchmark(dataset: Any) -> BenchmarkSpec | None:
    return BENCHMARKS.get(dataset) if isinstance(dataset, str) else None


def data_option_errors(data: Mapping[str, Any], *, require_root: bool = False) -> list[str]:
    """The problems of a ``data`` section (a hub_config's, or ``RunSpec.data_section()``), as messages naming the
    keys; ``[]`` when it is consistent.

    Checks the label columns (required for a Hub / local dataset, forbidden for the synthetic one, equal to the
    benchmark's label names when given for a benchmark), the splits of a benchmark, the open-set rules, and refuses
    ``synthetic_multilabel`` under a loss without a multi-label variant (:func:`multilabel_option_errors`).
    ``require_root=True`` also requires ``data_root`` for a benchmark (a complete run; a shipped file leaves it to
    the command line).
    """
    errors = []
    dataset = data.get("dataset")
    spec = _benchmark(dataset)
    levels = list(data.get("label_columns", []))
    if spec is not None:
        errors += _benchmark_errors(spec, data, require_root)
    elif dataset is not None and dataset not in SYNTHETIC_NAMES and "label_columns" not in data:
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


def multilabel_option_errors(dataset: Any, loss: Any, memory_size: Any, sampler: Any = None) -> list[str]:
    """The problems of training the multi-label ``synthetic_multilabel`` dataset with ``loss`` and the batch
    ``sampler`` option, as messages naming the options; ``[]`` for any other dataset or a supported setting.

    Only the losses registered with ``multilabel=True`` have a multi-label variant (HAPPIER, Sup-H-AP, Sup-NDCG:
    ``relevance="multilabel"``, the thesis' Algorithm 1 relevance), and the batches are drawn by
    :class:`pml_suprank.samplers.MultiLabelSampler` (``sampler`` must keep its default ``m_per_class``). A memory
    (``memory_size``, accepted for the signature) stores the label sets (:class:`pml_suprank.memory.RankingMemory`).
    """
    if dataset != "synthetic_multilabel":
        return []
    errors = []
    multilabel_losses = list(registered_losses(multilabel=True))
    if loss is not None and loss not in multilabel_losses:
        errors.append(
            f"'loss' {loss} has no multi-label variant: dataset synthetic_multilabel (several labels per image) "
            f"trains with {' or '.join(multilabel_losses)} only"
        )
    if sampler not in (None, "m_per_class"):
        errors.append(
            f"'sampler' {sampler}: dataset synthetic_multilabel is sampled by MultiLabelSampler (m items per label); "
            "keep sampler m_per_class"
        )
    return errors


def _benchmark_errors(spec: BenchmarkSpec, data: Mapping[str, Any], require_root: bool) -> list[str]:
    errors = []
    for part in ("train", "test"):
        split = data.get(f"{part}_split")
        if split is not None and split not in spec.splits:
            errors.append(
                f"'data.{part}_split' must be a split of benchmark {spec.name} {list(spec.splits)}; got {split!r}"
            )
    if data.get("test_split") is None and spec.test_split is None:
        errors.append(
            f"benchmark {spec.name} has no single test split (it is evaluated per query / gallery pair by "
            f"pml-suprank-evaluate --benchmark {spec.name}); set 'data.test_split' to one of {list(spec.splits)}"
        )
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
    """The split name of the ``part`` (``"train"`` / ``"test"``) dataset: ``data.<part>_split`` when set, else the
    benchmark's own training / test split for a benchmark name, else ``part``."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test'; got {part!r}")
    data = config.get("data") or {}
    split = data.get(f"{part}_split")
    if split is not None:
        return split
    spec = _benchmark(data.get("dataset"))
    if spec is None:
        return part
    split = spec.train_split if part == "train" else spec.test_split
    if split is None:
        raise ValueError(
            f"benchmark {spec.name} has no single test split (evaluate it with pml-suprank-evaluate --benchmark "
            f"{spec.name}); set data.test_split (--test_split) to one of {list(spec.splits)}"
        )
    return split
