"""Label columns of Hugging Face datasets read as integer ids, one reader for one-label and list-valued (multi-label)
columns: integer and integral float values are the ids, other values (strings) ids by sorted value over all splits.
Multi-label fine labels come with their ``(num_fine, L)`` hierarchy table, from further list columns aligned element
by element with the fine one (``labels = [3, 7]``, ``families = [0, 2]``), from ``hierarchy=``, or neither (flat)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..relevance import Hierarchy, check_tree
from .retrieval_dataset import RetrievalDatasetBase, pad_label_sets

__all__ = ["is_list_column", "label_mappings", "label_tensor", "multilabel_labels"]


def is_list_column(d: Any, column: str) -> bool:
    """Whether ``column`` of the ``datasets.Dataset`` ``d`` holds lists (of labels)."""
    import pyarrow as pa

    t = d.with_format("arrow")[column].type if column in d.column_names else None
    return t is not None and (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _values(d: Any, column: str, split: str, where: str, multilabel: bool) -> tuple[Any, np.ndarray]:
    """The label values (pyarrow; a list column flattened) and the per-row counts of ``column``; ``ValueError``
    naming the column, split and row for a list column in one-label data (or the reverse), an empty or null list,
    nested lists, a missing (null / NaN) label."""
    import pyarrow as pa
    import pyarrow.compute as pc

    name = f"label column {column!r} of split {split!r} of {where}"
    if is_list_column(d, column) != multilabel:
        raise ValueError(
            f"{name} is {'not ' * multilabel}list-valued: every label column of multi-label data (a list-valued fine "
            "label column) holds lists aligned with it, and every label column of one-label data one label per row"
        )
    col = d.with_format("arrow")[column]
    col = col.combine_chunks() if hasattr(col, "combine_chunks") else col

    def refuse_missing(values: Any, rows: Any = None) -> None:
        missing = pc.is_null(values, nan_is_null=True) if pa.types.is_floating(values.type) else pc.is_null(values)
        if pc.any(missing).as_py():
            row = pc.index(missing, True).as_py()
            raise ValueError(
                f"{name} has a missing (null / NaN) label {'in the list ' * (rows is not None)}at row "
                f"{row if rows is None else rows[row].as_py()}; drop or label those rows before loading"
            )

    refuse_missing(col)
    if not multilabel:
        return col, np.ones(len(col), np.int64)
    lengths = pc.list_value_length(col)
    empty = pc.equal(lengths, 0)
    if pc.any(empty).as_py():
        raise ValueError(
            f"{name} has no label (an empty list or a null) at row {pc.index(empty, True).as_py()}; every item needs "
            "at least one label: drop or label those rows before loading"
        )
    values = pc.list_flatten(col)
    if pa.types.is_nested(values.type):
        raise ValueError(f"{name} holds nested lists, not label ids")
    refuse_missing(values, pc.list_parent_indices(col))
    return values, lengths.to_numpy(zero_copy_only=False).astype(np.int64)


def _ids(values: Any, mapping: dict[str, int] | None, column: str, split: str, where: str) -> np.ndarray:
    """Integer ids of label values (strings through ``mapping``); refuses non-integer and negative ids."""
    if mapping is not None:
        return np.array([mapping[str(v)] for v in values.to_pylist()], dtype=np.int64)
    arr = values.to_numpy(zero_copy_only=False)
    if arr.dtype.kind == "f" and not np.all(arr == np.round(arr)):
        raise ValueError(f"label column {column!r} of split {split!r} of {where} holds non-integer labels")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(
            f"label column {column!r} of split {split!r} of {where} holds the negative id {int(arr.min())} "
            "(unlabelled?); label ids must be >= 0 (-1 is the padding of multi-label rows)"
        )
    return arr


def label_mappings(splits: dict[str, Any], columns: list[str], where: str, multilabel: bool) -> dict[str, dict]:
    """``{column: {value: id}}`` for the non-numeric label ``columns``, ids by sorted value over every split holding
    the column; every split's labels are checked here (:func:`_values`)."""
    import pyarrow as pa

    out = {}
    for c in columns:
        flats = [_values(d, c, name, where, multilabel)[0] for name, d in splits.items() if c in d.column_names]
        if not any(pa.types.is_integer(f.type) or pa.types.is_floating(f.type) for f in flats):
            out[c] = {v: i for i, v in enumerate(sorted({str(v) for f in flats for v in f.to_pylist()}))}
    return out


def _read(d: Any, columns: list[str], mappings: dict, split: str, where: str, multilabel: bool) -> tuple[list, Any]:
    """Ids of every column (flattened, aligned element by element) and the per-row counts of the fine column."""
    flats, lengths = [], None
    for c in columns:
        values, n = _values(d, c, split, where, multilabel)
        if lengths is not None and not np.array_equal(n, lengths):
            row = int(np.flatnonzero(n != lengths)[0])
            raise ValueError(
                f"label columns {columns[0]!r} and {c!r} of split {split!r} of {where} are not aligned: row {row} has "
                f"{lengths[row]} and {n[row]} labels; each coarser column lists the ancestor of every fine label"
            )
        lengths = n
        flats.append(_ids(values, mappings.get(c), c, split, where))
    return flats, lengths


def label_tensor(d: Any, columns: list[str], mappings: dict, split: str, where: str, multilabel: bool) -> Tensor:
    """The labels of ``d``: ``(N, L)`` ids of ``columns`` (fine → coarse), or multi-label ``(N, M)`` fine label sets
    padded with ``-1``."""
    flats, lengths = _read(d, columns[:1] if multilabel else columns, mappings, split, where, multilabel)
    if multilabel:
        return pad_label_sets(torch.from_numpy(flats[0]).split(lengths.tolist()), width=int(lengths.max(initial=1)))
    return torch.from_numpy(np.stack(flats, axis=1))


def multilabel_labels(
    ds: Any, split: str, splits: dict[str, Any], label_columns: list[str], hierarchy: Any, mappings: dict, where: str
) -> tuple[Tensor, Tensor | None, list[str]]:
    """Multi-label labels of ``ds`` (split ``split``) and the hierarchy from the aligned coarser ``label_columns``
    (read over all ``splits``) or the given ``hierarchy``; ``where`` names the source. Returns ``(labels (N, M)
    padded with -1, table (num_fine, L) or None, level names)``; a ``ValueError`` for misaligned columns, a non-tree
    hierarchy, both coarser columns and ``hierarchy=``, a label missing from the table."""
    if hierarchy is not None and len(label_columns) > 1:
        raise ValueError(
            f"give the hierarchy of a multi-label dataset either as coarser label columns {label_columns[1:]} or as "
            "hierarchy= (a (num_fine, L) table), not both"
        )
    labels = label_tensor(ds, label_columns, mappings, split, where, True)
    names, table = list(label_columns), None
    if len(label_columns) > 1:
        present = {k: v for k, v in splits.items() if all(c in v.column_names for c in label_columns)}
        rows = [
            np.stack(_read(d, label_columns, mappings, k, where, True)[0], axis=1)
            for k, d in {**present, split: ds}.items()
        ]
        pairs = torch.from_numpy(np.concatenate(rows))
        check_tree(pairs, name=f"label columns {label_columns} of {where}")
        table = Hierarchy.from_labels(pairs).table
    table = RetrievalDatasetBase._check_hierarchy(labels, hierarchy if table is None else table)
    if hierarchy is not None:
        names += [f"level_{i}" for i in range(1, table.shape[1])]
    return labels, table, names
