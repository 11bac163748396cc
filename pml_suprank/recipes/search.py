"""Search a gallery with a trained retrieval model and look at the results::

    python -m pml_suprank.recipes.search --model outputs/happier_synthetic/final --gallery synthetic --k 10 \
        --output_dir search_out
    python -m pml_suprank.recipes.search --model DIR --gallery synthetic --queries my_photos/ --output_dir OUT

``--gallery``: ``synthetic``, a benchmark name (with ``--data_root``), a dataset source (Hub id, image folder,
parquet; with ``--label_columns``) or a folder of plain image files (unlabelled); unset, the model's recorded test
set. ``--queries``: image files or a dataset; unset, ``--num_queries`` gallery items are drawn (seeded) and each is
left out of its own results. With an OOD guard in the model folder (``ood/``), every query gets a verdict.

Writes to ``--output_dir``: ``results.json`` (every query with its top-k: rank, gallery index, name, score, labels,
relevance, OOD verdict), ``results.html`` (one offline page: ✓ same fine class, ~ same coarse class, ✗ other),
``results_grid.png``, and with ``--save_index`` the index folder.
"""

from __future__ import annotations

import argparse
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from pml_suprank._validation import is_bool, is_choice, is_int, is_str, optional
from pml_suprank.training import TrainingConfig
from pml_suprank.training.config import option
from pml_suprank.training.options import DataOptions, ModelUseOptions
from pml_suprank.training.run_folder import write_json_atomically
from pml_suprank.training.spec import build_parser as spec_parser
from pml_suprank.training.spec import parse, shared

from ._common import console_script, device, load_model, output_folder, refuse, test_transform


@dataclass
class SearchSpec:
    """Every option of the ``search`` recipe; the model's ``data_spec.json`` is a layer under the flags."""

    REQUIRED = ("model", "output_dir")
    RULES = staticmethod(lambda v: ["--query_split applies to --queries: give --queries, or leave it out"]
                         if v["query_split"] is not None and v["queries"] is None else [])  # fmt: skip
    DESCRIPTION = "Search a gallery with a retrieval model; write results.json, an HTML page and a PNG grid."
    MODEL_DATA = ("gallery",)

    model: str | None = shared(ModelUseOptions, "model")
    gallery: str | None = option(None, "'synthetic', a benchmark name, or a dataset source (unset: the test set the "
                                 "model was trained with)", check=optional(is_str()))  # fmt: skip
    queries: str | None = option(None, "a folder of images, or a dataset given like --gallery",
                                 check=optional(is_str()))  # fmt: skip
    output_dir: str | None = shared(TrainingConfig, "output_dir", None,
                                    "where results.json / .html / _grid.png go (required)")  # fmt: skip
    k: int = option(10, "results per query", check=is_int(1, 100_000))
    backend: str = option("torch", "search backend", check=is_choice("torch", "faiss", "faiss-ivf", "faiss-hnsw"))
    gallery_split: str | None = option(None, "split of the gallery dataset (unset: the model's test split, else test)",
                                       check=optional(is_str()))  # fmt: skip
    query_split: str | None = option(None, "split of a query dataset (unset: --gallery_split)",
                                     check=optional(is_str()))  # fmt: skip
    num_queries: int = option(8, "queries drawn from the gallery without --queries", check=is_int(1, 100_000))
    label_columns: list[str] | None = shared(DataOptions, "label_columns", None, "label columns of a dataset source, "
                                             "finest first, space-separated (e.g. fine coarse)")  # fmt: skip
    data_root: str | None = shared(DataOptions, "data_root")
    num_per_class: int = shared(DataOptions, "num_per_class", 10)
    batch_size: int = shared(ModelUseOptions, "batch_size")
    seed: int = shared(TrainingConfig, "seed", 0, "seed of the drawn queries, a synthetic gallery and a class split "
                       "(the model's when it records one)")  # fmt: skip
    thumbnail_size: int = option(96, "longer side of the HTML thumbnails", check=is_int(16, 1024))
    save_index: bool = option(False, "also save the index to OUTPUT_DIR/index", check=is_bool())
    ood_threshold: float | None = shared(ModelUseOptions, "ood_threshold")
    device: str | None = shared(ModelUseOptions, "device")
    embedding_cache: str | None = shared(ModelUseOptions, "embedding_cache")
    model_data: dict | None = shared(ModelUseOptions, "model_data")


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SearchSpec)


def parse_args(argv: list[str] | None = None) -> SearchSpec:
    return parse(SearchSpec, argv)


def load_dataset(args: SearchSpec, source: str, split: str, transform: Any, image_size: int) -> Any:
    from pml_suprank import data
    from pml_suprank.data import BENCHMARKS

    if source == "synthetic":
        return data.SyntheticShapes(split, num_per_class=args.num_per_class, image_size=image_size, seed=args.seed,
                                    transform=transform)  # fmt: skip
    if source in BENCHMARKS:
        if not args.data_root:
            refuse(f"--data_root is required for benchmark {source!r}")
        return data.load_benchmark(source, args.data_root, split, transform)
    if not args.label_columns:
        refuse(f"--label_columns is required with dataset {source!r}")
    return data.load_retrieval_dataset(source, args.label_columns, split=split, transform=transform)


def folder_split(source: str, given: str | None, flag: str) -> str:
    """The split of a dataset source: ``given``, else ``test``, else a folder's only split (several and none named
    ``test``: refused, naming ``flag``)."""
    if given is not None or not Path(source).is_dir():
        return given or "test"
    from pml_suprank.data.folders import image_folder_layout

    try:
        layout = image_folder_layout(source)
    except ValueError:
        return "test"
    if layout is None or "test" in layout.splits:
        return "test"
    if len(layout.splits) == 1:
        return layout.splits[0]
    refuse(f"{flag}: {source} has the splits {list(layout.splits)} and none is named 'test': give one of them")


def model_gallery(args: SearchSpec, transform: Any) -> tuple[Any, SearchSpec]:
    """The test set the model was trained with (``args.model_data``) and the spec naming it."""
    from pml_suprank.data.source import dataset_source

    if args.model_data is None:
        refuse(f"--gallery is required: the model {args.model} records no data spec (data_spec.json)")
    section = args.model_data["data"]
    source = dataset_source(section, "test")
    args = replace(args, gallery=source.name, gallery_split=source.split)
    try:
        return source.load(transform, seed=args.seed, recorded_split=args.model_data.get("class_split")), args
    except (OSError, ValueError) as e:
        refuse(f"the training data recorded by {args.model} ({section.get('dataset')!r}) cannot be read: {e}; a local "
               "folder is recorded by its name only: give its path with --gallery")  # fmt: skip


def item_name(gallery: Any, args: SearchSpec, index: int) -> str:
    """Gallery item ``index`` as a person names it: its file relative to the ``--gallery`` folder (the file name
    outside it), else ``"<gallery>:<split>[index]"``."""
    path = getattr(gallery, "item_path", lambda i: None)(index)
    if not path:
        return f"{args.gallery}:{args.gallery_split}[{index}]"
    if args.gallery is not None and Path(args.gallery).is_dir():
        with suppress(ValueError, OSError):  # outside the folder: its file name
            return Path(path).resolve().relative_to(Path(args.gallery).resolve()).as_posix()
    return Path(path).name


def gallery_ids(gallery: Any, args: SearchSpec) -> list[str] | None:
    """The ids saved with the index: the gallery's file names (``None``: not read from files)."""
    if not hasattr(gallery, "item_path") or gallery.item_path(0) is None:
        return None
    return [item_name(gallery, args, j) for j in range(len(gallery))]


def class_name(dataset: Any, labels: list[int] | None) -> str | None:
    """The name of the fine class of a label row, when the dataset names its classes."""
    names = getattr(dataset, "class_names", None) or {}
    return None if not labels else names.get(int(labels[0]))


def describe_results(
    args: SearchSpec, gallery, labels, queries, query_images, query_labels, scores, indices
) -> list[dict]:
    """The per-query records of results.json (with their images: of the HTML page and the grid)."""
    from pml_suprank.plots import relevance_level

    records = []
    for row, (name, q_labels) in enumerate(zip(queries, query_labels, strict=True)):
        results = []
        for rank, (score, j) in enumerate(zip(scores[row].tolist(), indices[row].tolist(), strict=True), start=1):
            if j < 0:  # an approximate backend found fewer than k items
                continue
            item_labels = labels[j].tolist() if labels is not None else None
            results.append({
                "rank": rank, "index": j, "name": item_name(gallery, args, j), "score": float(score),
                "labels": item_labels, "class_name": class_name(gallery, item_labels),
                "relevance": relevance_level(q_labels, item_labels),
            })  # fmt: skip
        records.append({"name": name, "labels": q_labels, "class_name": class_name(gallery, q_labels),
                        "results": results, "image_ref": query_images[row]})  # fmt: skip
    return records


def load_source(args: SearchSpec, flag: str, split: str | None, transform: Any, image_size: int) -> tuple[Any, str]:
    """The dataset of ``--gallery`` / ``--queries`` (``flag``) and its split: an image file or a folder of them without
    a dataset's files is read unlabelled (split ``all``), a dataset source at ``split`` (:func:`folder_split`); or a
    refusal naming ``flag``."""
    from pml_suprank.data.folders import has_dataset_files
    from pml_suprank.data.source import missing_path_problem
    from pml_suprank.search.image_files import ImageFiles

    source = args.gallery if flag == "--gallery" else args.queries
    if problem := missing_path_problem(source):
        refuse(f"{flag} {problem}")
    path = Path(source)
    plain = path.is_file() or (path.is_dir() and not has_dataset_files(path))
    if source != "synthetic" and plain and not (flag == "--gallery" and args.label_columns):
        try:
            return ImageFiles(source, transform, what=f"{flag} {source}"), split or "all"
        except ValueError as e:
            refuse(e)
    split = folder_split(source, split, {"--gallery": "--gallery_split", "--queries": "--query_split"}[flag])
    try:
        return load_dataset(args, source, split, transform, image_size), split
    except (OSError, ValueError, KeyError) as e:
        refuse(f"{flag} {source} (split {split!r}): {e}")


def load_gallery(args: SearchSpec, transform: Any, image_size: int) -> tuple[Any, SearchSpec]:
    """The gallery dataset and the spec naming it (its split resolved)."""
    recorded = (args.model_data or {}).get("data") is not None
    if args.gallery is None or (
        recorded and Path(args.gallery).is_dir() and not args.label_columns and not args.gallery_split
    ):  # the model's own training folder: its test split
        return model_gallery(args, transform)
    gallery, split = load_source(args, "--gallery", args.gallery_split, transform, image_size)
    return gallery, replace(args, gallery_split=split)


def ood_verdicts(model: Any, dataset: Any, indices: list[int], args: SearchSpec, device: torch.device) -> list | None:
    """``[{"score", "is_ood"}, ...]`` of ``dataset[indices]`` by the model's OOD guard (``None``: it has none)."""
    if model.ood_guard is None:
        return None
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=args.batch_size)
    return model.ood_guard.predict(model, loader, threshold=args.ood_threshold, device=device).records()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from pml_suprank._terminal import terminal_safe
    from pml_suprank.data import cached_embeddings
    from pml_suprank.search.image_files import ImageFiles
    from pml_suprank.search.report import write_html_report, write_result_grid

    dev = device(args.device)
    out = output_folder(args.output_dir, {"--model": args.model, "--gallery": args.gallery, "--queries": args.queries})
    model = load_model(args.model, dev, "--ood_threshold" if args.ood_threshold is not None else None)
    transform = test_transform(model)
    image_size = int(model.data_config["input_size"][-1])
    gallery, args = load_gallery(args, transform, image_size)
    if args.queries is not None:  # read and checked before the gallery is embedded
        source, split = load_source(args, "--queries", args.query_split or args.gallery_split, transform, image_size)
        plain = isinstance(source, ImageFiles)
        names = list(source.names) if plain else [f"{args.queries}:{split}[{i}]" for i in range(len(source))]
    ids = gallery_ids(gallery, args)
    index = model.build_index(torch.utils.data.DataLoader(gallery, batch_size=args.batch_size), backend=args.backend,
                              ids=ids, progress=True, embedding_cache=args.embedding_cache)  # fmt: skip
    unlabelled_gallery = isinstance(gallery, ImageFiles)
    labels = index.labels if index.labels is not None and index.labels.dim() == 2 and not unlabelled_gallery else None
    exclude_self = args.queries is None
    if args.queries is None:
        g = torch.Generator().manual_seed(args.seed)
        picked = torch.randperm(len(gallery), generator=g)[: args.num_queries].sort().values
        q_emb = index.embeddings[picked].float().cpu()
        names = [item_name(gallery, args, i) for i in picked.tolist()]
        q_labels = [labels[i].tolist() if labels is not None else None for i in picked.tolist()]
        q_images = [(gallery, i) for i in picked.tolist()]
        verdicts = ood_verdicts(model, gallery, picked.tolist(), args, dev)
    else:
        loader = torch.utils.data.DataLoader(source, batch_size=args.batch_size, shuffle=False)
        q_emb, q_lab = cached_embeddings(
            model, loader, args.embedding_cache, normalize=True, progress=True, description="queries"
        )[:2]
        unlabelled = plain or labels is None or q_lab.dim() != 2
        q_labels = [None if unlabelled else row.tolist() for row in q_lab]
        q_images = [(source, i) for i in range(len(source))]
        verdicts = ood_verdicts(model, source, list(range(len(source))), args, dev)
    num_results = min(args.k, len(index) - int(exclude_self))
    if num_results < 1:
        refuse(f"--gallery: it has {len(index)} item(s): nothing to return once a query is left out")
    scores, indices = index.search(q_emb, min(args.k + int(exclude_self), len(index)), progress=True)
    scores, indices = scores.cpu(), indices.cpu()
    if exclude_self:  # drop each query from its own results (it is a gallery item)
        keep = indices != picked[:, None]
        scores = torch.stack([s[m][:num_results] for s, m in zip(scores, keep, strict=True)])
        indices = torch.stack([i[m][:num_results] for i, m in zip(indices, keep, strict=True)])
    records = describe_results(args, gallery, labels, names, q_images, q_labels, scores, indices)
    guard = model.ood_guard
    for record, verdict in zip(records, verdicts or [None] * len(records), strict=True):
        record["ood"] = verdict

    pages = [{**r, "image": r["image_ref"][0].get_image(r["image_ref"][1]),
              "results": [{**x, "image": gallery.get_image(x["index"])} for x in r["results"]]}
             for r in records]  # fmt: skip
    title = (f"{_short(args.model)}: {len(records)} queries against {_short(args.gallery)} {args.gallery_split} "
             f"({len(index)} images), top {args.k}")  # fmt: skip
    threshold = None if guard is None else (guard.threshold if args.ood_threshold is None else args.ood_threshold)
    guard_info = None if guard is None else {"detector": guard.detector_name, "threshold": threshold}
    write_html_report(
        out / "results.html", pages, title=title, thumbnail_size=args.thumbnail_size, ood_guard=guard_info
    )
    write_result_grid(out / "results_grid.png", pages)
    levels = [x["relevance"] for r in records for x in r["results"]]
    summary = {level: levels.count(level) for level in ("fine", "coarse", "other", "unknown")}
    result = {
        "model": args.model, "gallery": {"source": args.gallery, "split": args.gallery_split, "size": len(index)},
        "queries_source": args.queries, "k": args.k, "backend": args.backend, "index_options": index.options,
        "label_names": list(getattr(gallery, "label_names", []) or []), "relevance_counts": summary,
        "ood_guard": None if guard is None else {**guard_info, "higher_is_ood": True,
            "threshold_source": "--ood_threshold" if args.ood_threshold is not None else "guard"},
        "queries": [{key: v for key, v in r.items() if key != "image_ref"} for r in records],
    }  # fmt: skip
    write_json_atomically(out / "results.json", result)
    if args.save_index:
        index.save(out / "index")
    print(summary_table(records, args.k))
    if guard is None:
        print(
            "no OOD guard in this model: queries are not checked for unknown kinds (fit one with "
            "`pml-suprank-fit-heat --model MODEL`)"
        )
    else:
        n_ood = sum(bool(r["ood"]["is_ood"]) for r in records)
        print(f"OOD guard {guard.detector_name}: {n_ood} of {len(records)} queries OOD (score > {threshold:.6g})")
    print(
        f"{len(records)} queries, top {args.k}: {summary}; results.json, results.html, results_grid.png in "
        f"{terminal_safe(out)}"
    )
    return result


def _short(source: str | None) -> str:
    """A model or gallery as a person names it: ``run/final`` for a folder, else the source as given."""
    if source is None:
        return "-"
    path = Path(source)
    return "/".join(path.parts[-2:]) if path.exists() else source


def summary_table(records: list[dict], k: int) -> str:
    """The console table: one row per query (name, class, same-class / same-group hits in the top ``k``, the first
    result, the OOD verdict), every cell stripped of control characters."""
    from pml_suprank._terminal import terminal_safe
    from pml_suprank.search.report import query_hits

    rows = [("query", "class", f"same class / {k}", f"same group / {k}", "first result", "OOD guard")]
    for r in records:
        hits = query_hits(r)
        first = r["results"][0]["name"] if r["results"] else "-"
        ood = r.get("ood")
        verdict = "-" if ood is None else ("OOD" if ood["is_ood"] else "known") + f" {ood['score']:.4g}"
        rows.append(tuple(terminal_safe(c) for c in (
            r["name"], r.get("class_name") or (r["labels"] or ["-"])[0], hits.get("fine", "-"),
            hits.get("coarse", "-"), first, verdict)))  # fmt: skip
    widths = [min(40, max(len(row[i]) for row in rows)) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell[:40].ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


run = console_script(main)  #: the console script ``pml-suprank-search``

if __name__ == "__main__":
    run()
