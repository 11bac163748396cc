"""List-valued label columns of Hugging Face datasets: multi-label fine labels and their ``(num_fine, L)`` hierarchy
table, from further list columns aligned element by element with the fine one (``labels = [3, 7]``, ``families =
[0, 2]``), from ``hierarchy=``, or neither (flat, ``L = 1``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..relevance import Hierarchy, check_tree
from .retrieval_dataset import RetrievalDatasetBase, pad_label_sets

__all__ = ["is_list_column", "multilabel_labels"]


def is_list_column(d: Any, column: str) -> bool:
    """Whether ``column`` of the ``datasets.Dataset`` ``d`` holds lists (of labels)."""
    import pyarrow as pa

    t = d.with_format("arrow")[column].type if column in d.column_names else None
    return t is not None and (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _flat_column(d: Any, column: str, split: str, where: str) -> tuple[Any, np.ndarray]:
    """Flattened values (pyarrow array) and per-row lengths of a list column; refuses non-list columns, null rows,
    empty lists, null elements and nested lists (``ValueError`` naming the column, the split and the row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not is_list_column(d, column):
        raise ValueError(
            f"label column {column!r} of split {split!r} of {where} is not list-valued: with a list-valued fine label "
            "column (multi-label data) every label column must hold lists aligned with it"
        )
    col = d.with_format("arrow")[column]
    col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    lengths = pc.list_value_length(col)
    bad = pc.fill_null(pc.equal(lengths, 0), True)
    if pc.any(bad).as_py():
        row = pc.index(bad, True).as_py()
        raise ValueError(
            f"label column {column!r} of split {split!r} of {where} has no label (an empty list or a null) at row "
            f"{row}; every item needs at least one label: drop or label those rows before loading"
        )
    values = pc.list_flatten(col)
    if pa.types.is_nested(values.type):
        raise ValueError(f"label column {column!r} of split {split!r} of {where} holds nested lists, not label ids")
    missing = pc.is_null(values, nan_is_null=True) if pa.types.is_floating(values.type) else pc.is_null(values)
    if pc.any(missing).as_py():
        row = int(pc.list_parent_indices(col)[pc.index(missing, True).as_py()].as_py())
        raise ValueError(
            f"label column {column!r} of split {split!r} of {where} has a missing (null / NaN) label in the list at "
            f"row {row}; drop or label those rows before loading"
        )
    return values, lengths.to_numpy(zero_copy_only=False).astype(np.int64)


def _ids(values: Any, mapping: dict[str, int] | None, column: str, split: str, where: str) -> np.ndarray:
    """Integer ids of flattened label values (strings through ``mapping``); refuses negative ids."""
    if mapping is not None:
        return np.array([mapping[str(v)] for v in values.to_pylist()], dtype=np.int64)
    arr = values.to_numpy(zero_copy_only=False)
    if arr.dtype.kind == "f" and not np.all(arr == np.round(arr)):
        raise ValueError(f"label column {column!r} of split {split!r} of {where} holds non-integer labels")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(
            f"label column {column!r} of split {split!r} of {where} holds the negative id {int(arr.min())}; "
            "label ids must be >= 0 (-1 is the padding of multi-label rows)"
        )
    return arr


def _mappings(splits: dict[str, Any], columns: list[str], where: str) -> dict[str, dict[str, int]]:
    """``{column: {value: id}}`` for list columns of non-integer values, ids by sorted value over all splits."""
    import pyarrow as pa

    out = {}
    for c in columns:
        values = set()
        for name, d in splits.items():
            if c not in d.column_names:
                continue
            flat, _ = _flat_column(d, c, name, where)
            if pa.types.is_integer(flat.type) or pa.types.is_floating(flat.type):
                break
            values.update(map(str, flat.to_pylist()))
        else:
            out[c] = {v: i for i, v in enumerate(sorted(values))}
    return out


def _read(d: Any, columns: list[str], mappings: dict, split: str, where: str) -> tuple[list[np.ndarray], np.ndarray]:
    """Flattened ids of every column (aligned element by element) and the per-row lengths of the fine column."""
    flats, lengths = [], None
    for c in columns:
        values, n = _flat_column(d, c, split, where)
        if lengths is not None and not np.array_equal(n, lengths):
            row = int(np.flatnonzero(n != lengths)[0])
            raise ValueError(
                f"label columns {columns[0]!r} and {c!r} of split {split!r} of {where} are not aligned: row {row} has "
                f"{lengths[row]} and {n[row]} labels; each coarser column lists the ancestor of every fine label"
            )
        lengths = n
        flats.append(_ids(values, mappings.get(c), c, split, where))
    return flats, lengths


def multilabel_labels(
    ds: Any, split: str, splits: dict[str, Any], label_columns: list[str], hierarchy: Any, where: str
) -> tuple[Tensor, Tensor | None, list[str], dict[str, dict[str, int]]]:
    """Multi-label labels of ``ds`` (split ``split``; string ids and the hierarchy read over all ``splits``) and the
    hierarchy from the aligned coarser ``label_columns`` or the given ``hierarchy``; ``where`` names the source.
    Returns ``(labels (N, M) padded with -1, table (num_fine, L) or None, level names, string-id mappings)``; a
    ``ValueError`` for a non-list column, an empty or null row or element, a negative id, misaligned columns, a
    non-tree hierarchy, both coarser columns and ``hierarchy=``, a label missing from the table."""
    if hierarchy is not None and len(label_columns) > 1:
        raise ValueError(
            f"give the hierarchy of a multi-label dataset either as coarser label columns {label_columns[1:]} or as "
            "hierarchy= (a (num_fine, L) table), not both"
        )
    present = {k: v for k, v in splits.items() if all(c in v.column_names for c in label_columns)}
    mappings = _mappings({**present, split: ds}, label_columns, where)
    flats, lengths = _read(ds, label_columns, mappings, split, where)
    labels = pad_label_sets(torch.from_numpy(flats[0]).split(lengths.tolist()), width=int(lengths.max(initial=1)))
    names = list(label_columns)
    table = None
    if len(label_columns) > 1:
        pairs = [np.stack(flats, axis=1)]
        pairs += [np.stack(_read(d, label_columns, mappings, k, where)[0], axis=1) for k, d in present.items()]
        pairs = torch.from_numpy(np.concatenate(pairs))
        check_tree(pairs, name=f"label columns {label_columns} of {where}")
        table = Hierarchy.from_labels(pairs).table
    table = RetrievalDatasetBase._check_hierarchy(labels, hierarchy if table is None else table)
    if hierarchy is not None:
        names += [f"level_{i}" for i in range(1, table.shape[1])]
    return labels, table, names, mappings
