"""``pml-suprank-prepare-dataset NAME --root DIR --output_dir OUT [--push_to_hub true --hub_model_id ORG/NAME]``:
a paper benchmark read from its native archive, written as a Hugging Face ``datasets`` copy.

The copy is a ``DatasetDict`` (``save_to_disk``, one split per benchmark split) with an ``image`` column (the original
encoded bytes: no pixel changes), ``file_name`` (the path inside the archive) and one int64 column per label level
named by :func:`pml_suprank.data.benchmarks.benchmark_label_names` (e.g. ``class_id``, ``super_class_id`` for SOP);
``benchmark.json`` records the label columns per split. ``load_retrieval_dataset(OUT, label_columns, split)`` gives
the labels of ``load_benchmark(NAME, DIR, split)``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pml_suprank.data.benchmarks import BENCHMARKS, benchmark_label_names, load_benchmark
from pml_suprank.training.run_folder import OutputDirError, prepare_output_dir
from pml_suprank.training.spec import str2bool

__all__ = ["build_parser", "check_image", "main", "prepare", "to_hf_dataset"]


def check_image(data: bytes, where: str) -> None:
    """``ValueError`` ``"<where>: not a decodable image (...); nothing was written"`` unless ``data`` passes PIL's
    ``verify`` (structure, checksums) and a full ``load`` (truncated pixels)."""
    from io import BytesIO

    from PIL import Image

    try:
        with Image.open(BytesIO(data)) as image:
            image.verify()
        with Image.open(BytesIO(data)) as image:
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{where}: not a decodable image ({type(err).__name__}: {err}); nothing was written") from None


def to_hf_dataset(ds: Any, cache_dir: str | Path) -> Any:
    """A ``datasets.Dataset`` copy of the benchmark split ``ds`` (:func:`pml_suprank.data.load_benchmark`), its
    Arrow files generated in ``cache_dir``; every image decoded first (:func:`check_image`: ``ValueError`` naming the
    item and its file)."""
    import datasets

    features = datasets.Features(
        {"image": datasets.Image(), "file_name": datasets.Value("string")}
        | {name: datasets.Value("int64") for name in ds.label_names}
    )
    labels = ds.labels.tolist()
    names = list(ds.label_names)

    refused: list[ValueError] = []

    def rows() -> Any:
        for i in range(len(ds)):
            try:
                record = ds.image_record(i)
                describe = getattr(ds, "describe_item", None)  # the absolute path, when the dataset has one
                check_image(record["bytes"], describe(i) if callable(describe) else f"item {i} ({record.get('path')})")
            except ValueError as err:
                refused.append(err)
                raise
            yield {"image": record, "file_name": record["path"], **dict(zip(names, labels[i]))}

    try:
        return datasets.Dataset.from_generator(rows, features=features, cache_dir=str(cache_dir))
    except Exception:
        if refused:  # datasets wraps generator errors in DatasetGenerationError: report the refusal itself
            raise refused[0] from None
        raise


def prepare(name: str, root: str | Path, output_dir: str | Path, splits: Sequence[str] | None = None) -> Any:
    """The ``datasets.DatasetDict`` copy of the ``splits`` (default: all) of benchmark ``name`` of
    :data:`~pml_suprank.data.benchmarks.BENCHMARKS`, read from its archive folder ``root``, written to ``output_dir``
    (``save_to_disk`` layout + ``benchmark.json``; ``ValueError`` / ``OutputDirError`` before anything is written)."""
    import datasets

    if name not in BENCHMARKS:
        raise ValueError(f"name must be one of {sorted(BENCHMARKS)}; got {name!r}")
    splits = list(splits or BENCHMARKS[name].splits)
    unknown = [s for s in splits if s not in BENCHMARKS[name].splits]
    if unknown:
        raise ValueError(f"splits {unknown} are not splits of {name}; available: {list(BENCHMARKS[name].splits)}")
    if Path(output_dir).exists():  # a file or an unwritable folder: refused first (there is nothing to leave behind)
        prepare_output_dir(output_dir)
    sources = {s: load_benchmark(name, root, s) for s in splits}  # the archive's files read before the folder is made
    output_dir = prepare_output_dir(output_dir)  # created, and writable
    with tempfile.TemporaryDirectory(prefix=".prepare_cache_", dir=output_dir, ignore_cleanup_errors=True) as cache:
        parts = {s: to_hf_dataset(source, Path(cache) / s) for s, source in sources.items()}
        copy = datasets.DatasetDict(parts)
        copy.save_to_disk(str(output_dir))
    info = {"benchmark": name, "label_columns": {s: list(benchmark_label_names(name, s)) for s in splits}}
    (output_dir / "benchmark.json").write_text(json.dumps(info, indent=2) + "\n")
    return datasets.load_from_disk(str(output_dir))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Convert a benchmark archive into a Hugging Face datasets copy (see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("name", choices=sorted(BENCHMARKS), help="benchmark name")
    p.add_argument("--root", required=True, help="folder the benchmark archive was extracted to")
    p.add_argument("--output_dir", required=True, help="where to write the datasets copy (save_to_disk layout)")
    p.add_argument("--splits", default=None, help="comma-separated splits to convert (None: all)")
    p.add_argument(
        "--push_to_hub", type=str2bool, nargs="?", const=True, default=False, help="upload the copy (true/false)"
    )
    p.add_argument("--hub_model_id", default=None, help="Hub dataset repo id for --push_to_hub, e.g. user/sop")
    p.add_argument("--private", type=str2bool, nargs="?", const=True, default=False, help="private Hub repo")
    return p


def main(argv: Sequence[str] | None = None) -> Any:
    """The command: every argument checked before anything is read or written (one ``error:`` line, exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id (e.g. your-name/sop-hierarchical); nothing was written")
    if not Path(args.root).is_dir():
        parser.error(f"--root {args.root!r} is not a folder; expected the folder {args.name} was extracted to "
                     f"({BENCHMARKS[args.name].layout})")  # fmt: skip
    splits = [s.strip() for s in args.splits.split(",")] if args.splits else None
    try:
        copy = prepare(args.name, args.root, args.output_dir, splits)
    except (OutputDirError, ValueError) as e:  # --splits or the folder refused, a benchmark file missing or unusable
        parser.error(str(e))
    print(f"{args.name}: wrote {', '.join(f'{k} ({len(v)} images)' for k, v in copy.items())} to {args.output_dir}")
    if args.push_to_hub:
        copy.push_to_hub(args.hub_model_id, private=args.private)
        print(f"pushed to https://huggingface.co/datasets/{args.hub_model_id}")
    return copy


def run() -> None:
    """The console script ``pml-suprank-prepare-dataset``: :func:`main` on the process's arguments."""
    sys.exit(0 if main() is not None else 1)


if __name__ == "__main__":
    run()
