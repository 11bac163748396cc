"""The splits of :func:`pml_suprank.data.load_retrieval_dataset` as ``{split name: datasets.Dataset}``, from Hub
ids, image folders, parquet files, ``save_to_disk`` folders or in-memory ``datasets`` objects."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .folders import IMAGE_SUFFIXES, has_dataset_files
from .paths import PathConfiner

__all__ = ["check_image_paths", "describe", "image_column_name", "load_splits", "select_split"]


def select_split(splits: dict[str, Any], split: str, source: Any) -> tuple[list[str], Any]:
    """The split names ``split`` designates (``"train+test"`` concatenates) and the map-style dataset they form."""
    import datasets

    parts = [split] if split in splits else [p.strip() for p in str(split).split("+")]
    unknown = [p for p in parts if p not in splits]
    if unknown:
        raise ValueError(
            f"split={split!r} is not in {describe(source)}; available splits: {sorted(splits)} (choose one: split= "
            "of the loader, --split / --test_split / --train_split / --gallery_split of the commands)"
        )
    ds = splits[parts[0]] if len(parts) == 1 else datasets.concatenate_datasets([splits[p] for p in parts])
    if isinstance(ds, datasets.IterableDataset):
        raise ValueError("streaming datasets are not supported: retrieval needs random access (use a map-style one)")
    return parts, ds


def describe(source: Any) -> str:
    return repr(str(source)) if isinstance(source, (str, Path)) else type(source).__name__


def image_column_name(ds: Any, image_column: str | None, source: Any) -> str:
    import datasets

    if image_column is not None:
        if image_column not in ds.column_names:
            raise ValueError(
                f"image_column={image_column!r} not found in {describe(source)}; available columns: {ds.column_names}"
            )
        return image_column
    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image):
            return name
    for name in ("image", "img", "pixel_values"):
        if name in ds.column_names:
            return name
    raise ValueError(f"no image column found in {describe(source)} (columns {ds.column_names}); pass image_column=")


def load_splits(source: Any, *, data_files: Any, cache_dir: Any, revision: Any, token: Any) -> dict[str, Any]:
    """Every split of ``source`` (memory-mapped, lazy images); local files are read without ``datasets`` progress bars
    (a "Downloading data" bar would look like network use)."""
    import datasets

    text = str(source) if isinstance(source, (str, Path)) else None
    local = text is not None and (Path(text).exists() or text in ("", "parquet") or text.endswith(".parquet"))
    quiet = local and datasets.is_progress_bar_enabled()
    if quiet:
        datasets.disable_progress_bars()
    try:
        if isinstance(source, datasets.DatasetDict):
            return dict(source)
        if isinstance(source, datasets.Dataset):
            return _single(source)
        if text is None:
            raise TypeError(
                "source must be a Hub dataset id, a local folder / parquet path, or a datasets.Dataset; "
                f"got {type(source).__name__}"
            )
        path = Path(text)
        if data_files is not None:
            builder = "parquet" if text in ("", "parquet") else text
            return dict(datasets.load_dataset(builder, data_files=data_files, cache_dir=cache_dir))
        if text.endswith(".parquet") or (("*" in text or "?" in text) and ".parquet" in text):
            if "*" not in text and not path.is_file():
                raise FileNotFoundError(f"parquet file {text} does not exist")
            return dict(datasets.load_dataset("parquet", data_files={"train": text}, cache_dir=cache_dir))
        if path.is_dir():
            if has_dataset_files(path, saved=True):
                loaded = datasets.load_from_disk(text)
                return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else _single(loaded)
            files = [p for p in path.rglob("*") if p.is_file()]
            if any(p.suffix.lower() in IMAGE_SUFFIXES for p in files):
                return dict(datasets.load_dataset("imagefolder", data_dir=text, cache_dir=cache_dir))
            if any(p.suffix == ".parquet" for p in files):
                return dict(datasets.load_dataset("parquet", data_dir=text, cache_dir=cache_dir))
            raise ValueError(
                f"{text} is a folder but neither a save_to_disk dataset, an image folder, nor a folder of parquet files"
            )
        if path.exists():
            raise ValueError(f"{text} is a file but not a parquet file; pass parquet files, a folder or a Hub id")
        if text.startswith((".", "/", "~")) or text.count("/") > 1:
            raise FileNotFoundError(f"{text} does not exist (and is not a Hub dataset id of the form 'org/name')")
        return dict(datasets.load_dataset(text, cache_dir=cache_dir, revision=revision, token=token))
    finally:
        if quiet:
            datasets.enable_progress_bars()


def _single(ds: Any) -> dict[str, Any]:
    return {str(ds.split) if ds.split is not None else "train": ds}


def _local_root(source: Any) -> Path | None:
    """The folder a local ``source`` (folder, parquet file or glob) owns, or ``None`` (Hub id, in-memory data)."""
    if not isinstance(source, (str, Path)):
        return None
    text = str(source)
    path = Path(text)
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    if "*" in text or "?" in text:
        static = Path(text.split("*", 1)[0].split("?", 1)[0])
        return static if str(static).endswith(("/", "\\")) or static.is_dir() else static.parent
    return None


def check_image_paths(ds: Any, image_column: str, source: Any, split: str) -> None:
    """Refuse image files stored by path (cells without bytes) outside a local ``source``'s folder (``ValueError``
    naming the source, split, row and path); Hub ids and in-memory datasets are the user's own."""
    import datasets
    import pyarrow.compute as pc

    root = _local_root(source)
    if root is None or not isinstance(ds.features.get(image_column), datasets.Image):
        return
    column = ds.select_columns([image_column]).with_format("arrow")[image_column]
    paths = pc.struct_field(column, "path")
    stored = pc.and_(pc.is_null(pc.struct_field(column, "bytes")), pc.is_valid(paths))
    rows = pc.indices_nonzero(stored.combine_chunks() if hasattr(stored, "combine_chunks") else stored)
    confine = PathConfiner(root)
    for row in rows.to_pylist():
        path = paths[row].as_py()
        where = f"{describe(source)}, split {split!r}, row {row} of the image column {image_column!r}"
        confine(os.path.abspath(path), where=where, allow_absolute=True)
