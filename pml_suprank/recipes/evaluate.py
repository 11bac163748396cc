"""Evaluate a trained retrieval model (a folder written by the training recipes, or a Hub id) on a test set: exact
metrics over the whole gallery (AP, mAP@R, R@k, H-AP, NDCG, ASI, AP per level), each query left out of its own
gallery, ``metrics.json`` and the plots in ``--output_dir``::

    accelerate launch -m pml_suprank.recipes.evaluate --model outputs/happier_synthetic/final
    accelerate launch -m pml_suprank.recipes.evaluate --model DIR --dataset sop --data_root /data/sop

Paper benchmarks with their own protocol (``--benchmark NAME --data_root DIR``): ``dyml_*`` (HAPPIER Tab. 2: per
granularity ``ap_fine``, ... and their means ``ap``, ``asi``, ``recall_at_1``, ``map_at_r``), ``gldv2_hier`` (TPAMI
Tab. VII: query vs gallery, ``map_at_100`` the GLDv2 mAP@100) and ``roxford5k`` / ``rparis6k`` (revisited Easy /
Medium / Hard mAP and mP@k; images resized to ``--max_side``, one per batch). Other benchmarks, or ``--split``: one
test set.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from pml_suprank._validation import is_choice, is_int, optional
from pml_suprank.data.benchmarks import BENCHMARKS
from pml_suprank.metrics.report import one_column
from pml_suprank.training import TrainingConfig
from pml_suprank.training.config import option
from pml_suprank.training.options import DataOptions, ModelUseOptions, RunOptions
from pml_suprank.training.recipe import make_accelerator
from pml_suprank.training.run_folder import write_json_atomically
from pml_suprank.training.spec import build_parser as spec_parser
from pml_suprank.training.spec import parse, shared

from ._common import console_script, load_model, output_folder, refuse, test_transform

#: benchmarks with their own protocol (not a single test set): name → mode
PROTOCOLS = {
    **dict.fromkeys(("dyml_vehicle", "dyml_animal", "dyml_product"), "dyml"),
    "gldv2_hier": "landmark",
    "roxford5k": "revisited",
    "rparis6k": "revisited",
}
DYML_GRANULARITIES = ("fine", "middle", "coarse")


def _rules(v: dict) -> list[str]:
    """Flags that would be silently ignored: two test sets, ``--max_side`` without the revisited protocol."""
    recorded = ((v["model_data"] or {}).get("data") or {}).get("dataset")
    test_set = v["benchmark"] or v["dataset"] or recorded
    errors = []
    if v["benchmark"] is not None and v["dataset"] is not None and v["benchmark"] != v["dataset"]:
        errors.append(f"--benchmark {v['benchmark']} and --dataset {v['dataset']} name two test sets; give one")
    if v["max_side"] is not None and (PROTOCOLS.get(test_set) != "revisited" or v["test_split"] is not None):
        split = f" --split {v['test_split']}" if v["test_split"] is not None else ""
        errors.append(f"--max_side applies to the revisited protocol of roxford5k / rparis6k only (no --split); the "
                      f"test set here is {test_set or 'synthetic'}{split}")  # fmt: skip
    return errors


@dataclass
class EvaluateSpec:
    """Every option of the ``evaluate`` recipe; the model's ``data_spec.json`` (test set, class split, seed,
    ``k_values``, ``alpha``) is a layer under the flags."""

    REQUIRED = ("model",)
    DESCRIPTION = "Evaluate a retrieval model on a test set."
    FLAGS = {"test_split": ("--split", "--test_split"), "eval_batch_size": ("--batch_size", "--eval_batch_size")}
    MODEL_DATA = ("benchmark", "dataset")
    RULES = staticmethod(_rules)

    model: str | None = shared(ModelUseOptions, "model")
    output_dir: str | None = shared(TrainingConfig, "output_dir", None, "write metrics.json and plots here")
    benchmark: str | None = option(
        None, "a paper benchmark read from its archive under --data_root, evaluated by its protocol (DyML: per "
        "granularity; gldv2_hier: query vs gallery, mAP@100; roxford5k / rparis6k: revisited E/M/H mAP); other "
        "benchmarks: their test split", check=optional(is_choice(*sorted(BENCHMARKS))),
    )  # fmt: skip
    max_side: int | None = option(
        None, "roxford5k / rparis6k: resize each image so its longer side has this many pixels (unset: the model's "
        "input size; the protocol's papers use 1024)", check=optional(is_int(8, 16384)),
    )  # fmt: skip
    dataset: str | None = shared(DataOptions, "dataset", None, "the test data: 'synthetic', a benchmark name, a Hub "
                                 "id or a local folder (unset: the model's training data, else synthetic)")  # fmt: skip
    data_root: str | None = shared(DataOptions, "data_root")
    label_columns: list[str] | None = shared(DataOptions, "label_columns", None, "label columns, finest first, "
                                             "space-separated (unset: the model's, or the folder's)")  # fmt: skip
    test_split: str | None = shared(DataOptions, "test_split")
    num_per_class: int | None = shared(
        DataOptions, "num_per_class", None, "SyntheticShapes: images per fine class (unset: the model's, else 32)"
    )
    seed: int = shared(TrainingConfig, "seed", 0, "seed of a synthetic test set, a class split and the plots (the "
                       "model's when it records one)")  # fmt: skip
    eval_batch_size: int = shared(TrainingConfig, "eval_batch_size")
    k_values: list[int] = shared(TrainingConfig, "k_values", [1, 10], "Recall@k values, space-separated (the "
                                 "model's when it records them)")  # fmt: skip
    alpha: float = shared(TrainingConfig, "alpha", 1.0, "H-AP relevance exponent (the model's when it records one)")
    no_plots: bool = shared(RunOptions, "no_plots")
    mixed_precision: str | None = shared(RunOptions, "mixed_precision")
    cpu: bool = shared(RunOptions, "cpu")
    embedding_cache: str | None = shared(ModelUseOptions, "embedding_cache")
    model_data: dict | None = shared(ModelUseOptions, "model_data")


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(EvaluateSpec)


def parse_args(argv: list[str] | None = None) -> EvaluateSpec:
    return parse(EvaluateSpec, argv)


def test_data(spec: EvaluateSpec, image_size: int) -> dict:
    """The data section of the test set: the model's recorded one with the user's options over it, or the options
    alone (SyntheticShapes at the model's ``image_size`` by default)."""
    recorded = (spec.model_data or {}).get("data")
    section = dict(recorded) if recorded is not None else {"dataset": spec.dataset or "synthetic"}
    if recorded is None and section["dataset"] == "synthetic":
        section["image_size"] = image_size
    for name in ("data_root", "label_columns", "test_split", "num_per_class"):
        if getattr(spec, name) is not None:
            section[name] = getattr(spec, name)
    return section


def main(argv: list[str] | None = None) -> dict:
    spec = parse_args(argv)
    recorded = (spec.model_data or {}).get("data") or {}
    dataset = spec.benchmark or spec.dataset or recorded.get("dataset", "synthetic")
    name = spec.benchmark or (dataset if dataset in BENCHMARKS else None)
    root = spec.data_root or recorded.get("data_root")
    if name is not None and not root:
        refuse(f"--data_root is required for benchmark {name} (expected: {BENCHMARKS[name].layout})")
    if name is not None and spec.test_split is not None and spec.test_split not in BENCHMARKS[name].splits:
        refuse(f"--split must be a split of {name} {list(BENCHMARKS[name].splits)}; got {spec.test_split!r}")
    spec = replace(spec, data_root=root)

    if spec.output_dir:
        output_folder(spec.output_dir, {"--model": spec.model, "--dataset": spec.dataset, "--data_root": root})
    loaded = load_model(spec.model)
    accelerator = make_accelerator(cpu=spec.cpu, mixed_precision=spec.mixed_precision, output_dir=spec.output_dir)
    model = accelerator.prepare(loaded)
    mode = PROTOCOLS.get(name) if name is not None and spec.test_split is None else None
    if mode is None:
        if name is None:
            section = test_data(spec, int(loaded.data_config["input_size"][-1]))
        else:  # a benchmark's test split: the model's recorded data section is not used
            section = {"dataset": name, "data_root": root}
            section.update({"test_split": spec.test_split} if spec.test_split else {})
        if error := _data_error(section):
            refuse(error)
        split = (spec.model_data or {}).get("class_split") if spec.benchmark is None and recorded else None
        return evaluate_test_set(spec, section, model, accelerator, split)
    protocol = {"dyml": evaluate_dyml, "landmark": evaluate_landmark, "revisited": evaluate_revisited}[mode]
    metrics = protocol(spec, name, model, accelerator)
    _write_metrics(spec, metrics, accelerator, f"{spec.model} on {name} ({mode} protocol):")
    accelerator.wait_for_everyone()
    return metrics


def _data_error(section: dict) -> str | None:
    """Why the data section cannot be read (a Hub id without ``--label_columns``, a bad option), else ``None``."""
    from pml_suprank.data.source import SYNTHETIC_NAMES, data_option_errors, folder_layout, missing_path_problem

    dataset = section.get("dataset")
    if problem := missing_path_problem(dataset):
        return f"--dataset {problem}"
    if dataset not in SYNTHETIC_NAMES and dataset not in BENCHMARKS and not section.get("label_columns"):
        if folder_layout(dataset) is None:
            return f"--label_columns is required with --dataset {dataset!r} (the model records no data spec for it)"
    errors = data_option_errors(section)
    return "; ".join(errors) if errors else None


def _embed(spec: EvaluateSpec, model: torch.nn.Module, dataset, accelerator, batch_size: int | None = None):
    """``(embeddings (N, D), labels (N, L), indices (N,))`` of ``dataset`` in dataset order on every process, through
    ``--embedding_cache`` when given. ``dataset``: a dataset or ``(benchmark, split, transform)``."""
    from pml_suprank.training import embed_loader, make_loader

    if isinstance(dataset, tuple):
        dataset = load_split(spec, *dataset)
    loader = accelerator.prepare(make_loader(dataset, batch_size or spec.eval_batch_size))
    return embed_loader(model, loader, accelerator, progress=True, embedding_cache=spec.embedding_cache)


def load_split(spec: EvaluateSpec, name: str, split: str, transform) -> Any:
    """Split ``split`` of benchmark ``name`` read from ``--data_root``, or a refusal naming it (a missing or
    unreadable file of the archive)."""
    from pml_suprank import data

    try:
        return data.load_benchmark(name, spec.data_root, split, transform)
    except (OSError, ValueError) as e:
        refuse(f"--data_root {spec.data_root}: benchmark {name}, split {split}: {e}")


def _write_metrics(spec: EvaluateSpec, metrics: dict, accelerator, title: str) -> Path | None:
    """Print ``title`` and the metrics; ``metrics.json`` in ``--output_dir`` (returned) when given."""
    accelerator.print(title)
    accelerator.print(one_column(metrics))
    if not spec.output_dir or not accelerator.is_main_process:
        return None
    return write_json_atomically(Path(spec.output_dir) / "metrics.json", metrics).parent


def _floats(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if not hasattr(v, "numel") or v.numel() == 1}


def evaluate_dyml(spec: EvaluateSpec, name: str, model: torch.nn.Module, accelerator) -> dict[str, float]:
    """DyML: for each granularity ``g``, ``query_g`` against ``gallery_g``; ``<metric>_<g>`` and their mean
    ``<metric>`` for ``ap`` (mAP), ``map_at_r``, ``asi`` and ``recall_at_1``."""
    from pml_suprank.metrics import RetrievalEvaluator

    transform = test_transform(model)
    evaluator = RetrievalEvaluator(k_values=tuple(sorted({1, *spec.k_values})), alpha=spec.alpha,
                                   device=accelerator.device)  # fmt: skip
    keys = ("ap", "map_at_r", "asi", "recall_at_1")
    out: dict[str, float] = {}
    for g in DYML_GRANULARITIES:
        q, ql, _ = _embed(spec, model, (name, f"query_{g}", transform), accelerator)
        r, rl, _ = _embed(spec, model, (name, f"gallery_{g}", transform), accelerator)
        metrics = evaluator.evaluate(q, ql, r, rl, distributed=accelerator.num_processes > 1)
        out.update({f"{k}_{g}": float(metrics[k]) for k in keys})
        out[f"num_queries_{g}"] = float(len(q))
    for k in keys:
        out[k] = sum(out[f"{k}_{g}"] for g in DYML_GRANULARITIES) / len(DYML_GRANULARITIES)
    return out


def evaluate_landmark(spec: EvaluateSpec, name: str, model: torch.nn.Module, accelerator) -> dict[str, float]:
    """H-GLDv2: ``query`` against ``gallery``; the standard evaluator's metrics with ``map_at_100`` the GLDv2
    mAP@100 (positives: gallery images of the query's landmark)."""
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.metrics.landmark import landmark_map_at_k

    transform = test_transform(model)
    q, ql, _ = _embed(spec, model, (name, "query", transform), accelerator)
    r, rl, _ = _embed(spec, model, (name, "gallery", transform), accelerator)
    evaluator = RetrievalEvaluator(k_values=tuple(spec.k_values), alpha=spec.alpha, device=accelerator.device)
    out = _floats(evaluator.evaluate(q, ql, r, rl, distributed=accelerator.num_processes > 1))
    per_query = landmark_map_at_k(q @ r.T, ql[:, None, 0] == rl[None, :, 0], k=100)
    out["map_at_100"] = float(torch.nanmean(per_query))
    return out


def resize_only_transform(data_config: dict, max_side: int):
    """Resize so the longer side has ``max_side`` pixels (aspect ratio kept, no crop), ``ToTensor``, ``Normalize``
    with the model's mean / std."""
    from torchvision import transforms as T

    def resize(image):
        w, h = image.size
        scale = max_side / max(w, h)
        return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), resample=2)  # bilinear

    return T.Compose([T.Lambda(resize), T.ToTensor(), T.Normalize(data_config["mean"], data_config["std"])])


def evaluate_revisited(spec: EvaluateSpec, name: str, model: torch.nn.Module, accelerator) -> dict[str, float]:
    """Revisited Oxford / Paris: ``revisited_map(q @ g.T, query.gnd)`` of the cropped queries against the database
    (Easy / Medium / Hard mAP and mP@1/5/10), resize-only transform, one image per batch."""
    from pml_suprank.metrics.landmark import revisited_map

    config = getattr(model, "module", model).data_config
    max_side = spec.max_side or int(max(config["input_size"][1:]))
    transform = resize_only_transform(config, max_side)
    query = load_split(spec, name, "query", transform)
    q = _embed(spec, model, query, accelerator, 1)[0]
    g = _embed(spec, model, (name, "gallery", transform), accelerator, 1)[0]
    return _floats(revisited_map(q @ g.T, query.gnd))


def evaluate_test_set(
    spec: EvaluateSpec, section: dict, model: torch.nn.Module, accelerator, recorded_split: dict | None = None
) -> dict:
    """The ``"test"`` part of the data ``section`` (a folder's seeded class split must still be ``recorded_split``),
    each query against the others, with the plots."""
    from pml_suprank import plots
    from pml_suprank.data.source import dataset_source
    from pml_suprank.metrics import RetrievalEvaluator

    source = dataset_source(section, "test")
    try:  # a missing split, unusable images: the message, not a traceback
        dataset = source.load(test_transform(model), seed=spec.seed, recorded_split=recorded_split)
    except ValueError as e:
        refuse(f"{spec.model} on {source.name} (--split {source.split}): {e}")
    emb, labels, idx = _embed(spec, model, dataset, accelerator)
    evaluator = RetrievalEvaluator(k_values=tuple(spec.k_values), alpha=spec.alpha, device=accelerator.device)
    metrics = _floats(evaluator.evaluate(emb, labels, distributed=accelerator.num_processes > 1))
    out = _write_metrics(
        spec, metrics, accelerator, f"{spec.model} on {source.name} ({source.split}, {len(dataset)} images):"
    )
    if out is not None and not spec.no_plots:
        files = plots.plot_all(
            emb, labels, out, label_names=getattr(dataset, "label_names", None), image_dataset=dataset, indices=idx,
            seed=spec.seed,
        )  # fmt: skip
        accelerator.print(f"metrics.json and {', '.join(files)} in {out}")
    accelerator.wait_for_everyone()
    return metrics


run = console_script(main)  #: the console script ``pml-suprank-evaluate``

if __name__ == "__main__":
    run()
