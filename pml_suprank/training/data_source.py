"""Where the training / test set of a run comes from: :class:`DatasetSource`, a typed description read from a data
section (a :class:`~pml_suprank.training.DataOptions` or a hub_config ``data`` mapping).

Three kinds: the built-in synthetic sets (``"synthetic"``, ``"synthetic_multilabel"``), a paper benchmark read from
its archive by name (:data:`pml_suprank.benchmarks.BENCHMARKS`, under ``data_root``) and a retrieval dataset (a Hub
id or a local folder / parquet path, with its label columns and the optional open-set rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..benchmarks.registry import BENCHMARKS

__all__ = ["SYNTHETIC_NAMES", "DatasetSource", "dataset_source"]

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
            ``open_set`` and the open-set rule (retrieval).
    """

    kind: Literal["synthetic", "benchmark", "retrieval"]
    name: str
    split: str
    root: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def load(self, transform: Any = None, *, seed: int = 0, **kwargs: Any) -> Any:
        """The dataset (``transform``: callable on a PIL image; ``seed``: the synthetic sets' seed; ``kwargs``:
        extra or overriding loader arguments such as ``cache_dir``; a benchmark takes none)."""
        from .. import data

        options = {**self.options, **kwargs}
        if self.kind == "synthetic":
            return data.synthetic_dataset(self.name, self.split, seed=seed, transform=transform, **options)
        if self.kind == "benchmark":
            if options:
                raise TypeError(f"benchmark {self.name} takes no loader arguments; got {sorted(options)}")
            return data.load_benchmark(self.name, self.root, self.split, transform)
        return data.load_retrieval_dataset(self.name, split=self.split, transform=transform, **options)


def dataset_source(data: Mapping[str, Any], part: str, *, data_root: str | Path | None = None) -> DatasetSource:
    """The :class:`DatasetSource` of the ``part`` (``"train"`` / ``"test"``) of a consistent data section (checked by
    :func:`pml_suprank.hub_config.data_option_errors`, e.g. as part of a :class:`~pml_suprank.training.RunSpec`).

    Args:
        data: The data options that are set (a hub_config ``data`` section, or ``RunSpec.data_section()``).
        part: ``"train"`` or ``"test"``.
        data_root: The benchmark's folder; replaces ``data_root``.
    """
    from ..hub_config import resolved_split

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
    options: dict[str, Any] = {"label_columns": list(data["label_columns"])}
    if data.get("open_set"):
        options["open_set"] = part
        options.update({k: data[k] for k in ("train_classes_per_coarse", "train_class_fraction") if k in data})
    return DatasetSource("retrieval", dataset, split, options=options)
