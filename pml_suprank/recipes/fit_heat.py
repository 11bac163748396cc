"""Fit HEAT (Lafon et al., ICML 2023) and every registered OOD baseline on the avg-pooled ``z``, std-pooled ``σ``
and logits of a timm classifier's last feature map; report FPR95 / AUROC per OOD set (like thesis Table 5.5).

With no arguments it runs offline: a small ResNet is trained on four SyntheticShapes families (ID); the OOD sets are
the two held-out families plus noise and blob images. ``--output_dir`` receives ``results.json``, score histograms,
the fitted HEAT detector (``heat_detector/``) and ``features.safetensors`` (read by ``ood_benchmark --features``).
With ``--model RUN/final`` the ID data is the model's recorded training data and the ``--guard`` detector is stored
in the model folder (``ood/``). Example::

    python -m pml_suprank.recipes.fit_heat --backbone resnet18 --pretrained true --id_dataset uoft-cs/cifar10 \
        --label_column label --ood_datasets uoft-cs/cifar100:test:fine_label tanganke/svhn:test:label \
        --image_size 32 --train_epochs 5

Nothing is downloaded unless a Hub id or ``--pretrained true`` is given. Paper-scale GPU settings:
``--config heat_cifar10_resnet34`` or ``heat_imagenet_resnet50``. Every registered detector's constructor argument
with a plain default is a flag ``--<detector>_<argument>`` (``--knn_k``, ``--vim_dim``, ...).
"""

from __future__ import annotations

import argparse
import inspect
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pml_suprank import ood
from pml_suprank.ood import metrics as ood_metrics
from pml_suprank.ood.features import feature_map_positions
from pml_suprank.ood.model_api import read_state_dict
from pml_suprank.recipes.ood_data import (
    build_datasets,
    build_model,
    class_targets,
    image_transform,
    loader,
    progress,
    save_histograms,
    train_classifier,
)
from pml_suprank.recipes.ood_spec import VARIANTS, FitHeatSpec, detector_arguments, methods
from pml_suprank.training.run_folder import write_json_atomically
from pml_suprank.training.spec import build_parser as spec_parser
from pml_suprank.training.spec import parse

from ._common import console_script, load_model, ood_features, output_folder, refuse, test_transform
from ._common import device as torch_device

#: a run of an energy network with fewer optimizer steps than this gets a warning (the synthetic default has 330)
MIN_HEAT_STEPS = 100


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(FitHeatSpec)


def parse_args(argv: list[str] | None = None) -> FitHeatSpec:
    """The run's :class:`FitHeatSpec`: defaults < the model's data spec < ``--config`` < flags (refusals: exit 2)."""
    return parse(FitHeatSpec, argv)


def selected_methods(spec: FitHeatSpec) -> tuple[str, ...]:
    chosen = set(spec.detectors or methods()) - ({"ODIN"} if spec.no_odin else set())
    return tuple(m for m in methods() if m in chosen)


def build_detector(method: str, spec: FitHeatSpec, model, n_train: int, dim: int):
    """A baseline (or a variant row such as SSD+) from the registry, with its flags and the recipe's context."""
    name, variant = VARIANTS.get(method, (method, {}))
    cls = ood.get_detector(name)
    kwargs = detector_arguments(name, spec.detector_options) | variant
    params = inspect.signature(cls).parameters
    if "head" in params:
        kwargs["head"] = model.get_classifier()
    if "model" in params:
        kwargs["model"] = model
    if name in ("KNN", "NNGuide"):
        kwargs["k"] = min(kwargs["k"], n_train)  # a small ID set: the k-th neighbour must exist
    if name == "ViM" and kwargs.get("dim") is None:
        # the principal subspace must leave residual variance: below the rank (n_train - 1) of a small ID set
        kwargs["dim"] = max(1, min(256, dim // 2, (n_train - 1) // 2))
    return cls(**kwargs)


def heat_step_warnings(heat, n_train: int) -> list[str]:
    """One line per HEAT energy network with fewer than :data:`MIN_HEAT_STEPS` optimizer steps on ``n_train``."""
    lines = []
    for prior, s in heat.component_settings.items():
        steps = s["epochs"] * max(1, n_train // min(s["batch_size"], n_train))
        if steps < MIN_HEAT_STEPS:
            lines.append(
                f"HEAT prior {prior}: {steps} optimizer step(s) ({s['epochs']} epoch(s) of batch {s['batch_size']} on "
                f"{n_train} ID features); an energy network needs about {MIN_HEAT_STEPS}+ steps to fit: raise "
                "--heat_epochs or lower --heat_batch_size"
            )
    return lines


def heat_progress(heat, n_train: int, spec: FitHeatSpec, bars: dict[str, Any]):
    """``HEAT.fit`` callback: one progress bar per prior (kept in ``bars``) over its optimiser steps."""

    def callback(prior: str, epoch: int, step: int, loss: float) -> None:
        if prior not in bars:
            for bar in bars.values():
                bar.close()
            s = heat.component_settings[prior]
            total = s["epochs"] * (n_train // min(s["batch_size"], n_train))
            bars[prior] = progress(None, spec, total=total, desc=f"HEAT prior {prior}", unit="step")
        bars[prior].set_postfix(epoch=epoch, loss=f"{loss:.3g}", refresh=False)
        bars[prior].update(1)

    return callback


def fit_detectors(model, train_feats, spec: FitHeatSpec):
    n_train, dim = len(train_feats), train_feats.features.shape[1]
    detectors = {}
    for method in selected_methods(spec):
        if method == "HEAT":
            detectors[method] = spec.heat(model.get_classifier())
            for line in heat_step_warnings(detectors[method], n_train):
                warnings.warn(line, stacklevel=2)
        else:
            detectors[method] = build_detector(method, spec, model, n_train, dim)
    timings = {}
    for name, det in detectors.items():
        print(f"fitting {name} ...", flush=True)
        start = time.perf_counter()
        bars: dict[str, Any] = {}
        extra = {"callback": heat_progress(det, n_train, spec, bars)} if name == "HEAT" else {}
        try:
            det.fit(**train_feats.as_kwargs(), **extra)
        finally:
            for bar in bars.values():
                bar.close()
        timings[name] = time.perf_counter() - start
    return detectors, timings


def score_all(detectors, feats, ds, spec: FitHeatSpec, device):
    scores = {}
    for name, det in detectors.items():
        if det._scores_images():  # ODIN: the images
            batches = progress(loader(ds, spec.batch_size), spec, desc=f"{name} scoring", leave=False)
            scores[name] = torch.cat([det.score(inputs=b["image"].to(device)).cpu() for b in batches])
        else:
            scores[name] = det.score(**{k: v for k, v in feats.as_kwargs().items() if k != "labels"}).cpu()
    return scores


def results_table(id_scores, ood_scores, convention):
    table = {}
    for method, id_s in id_scores.items():
        row = {}
        for ood_name, per_method in ood_scores.items():
            row[ood_name] = {
                "fpr95": ood_metrics.fpr_at_tpr(id_s, per_method[method], convention=convention),
                "auroc": ood_metrics.auroc(id_s, per_method[method]),
            }
        row["average"] = {k: sum(v[k] for v in row.values()) / len(row) for k in ("fpr95", "auroc")}
        table[method] = row
    return table


def format_table(table, ood_names) -> str:
    cols = [*ood_names, "average"]
    width = max(14, *(len(c) + 2 for c in cols))
    lines = ["method".ljust(12) + "".join(c.rjust(width) for c in cols), "-" * (12 + width * len(cols))]
    for method, row in table.items():
        cells = "".join(f"{100 * row[c]['fpr95']:.1f}/{100 * row[c]['auroc']:.1f}".rjust(width) for c in cols)
        lines.append(method.ljust(12) + cells)
    lines.append("(FPR95 / AUROC in %, " + "FPR95 lower is better, AUROC higher is better)")
    return "\n".join(lines)


def resolved(spec: FitHeatSpec, *, model_image_size: int) -> FitHeatSpec:
    """The spec with the data-dependent defaults set: output stride, image size, classifier and HEAT epochs."""
    synthetic, own = spec.synthetic, spec.synthetic and spec.model is None
    epochs = 0 if spec.checkpoint is not None else (10 if synthetic else 5)  # a checkpoint holds a trained head
    return replace(
        spec,
        output_stride=spec.output_stride or (8 if own else 32),
        image_size=spec.image_size or (32 if own else model_image_size),
        train_epochs=epochs if spec.train_epochs is None else spec.train_epochs,
        heat_epochs=spec.heat_epochs or (30 if synthetic else None),
        heat_batch_size=spec.heat_batch_size or (128 if synthetic else None),
    )


def prepare_data(spec: FitHeatSpec):
    """``(spec, train_ds, test_ds, ood_sets, level, classes, train_labels)``: the spec with its data-dependent
    defaults resolved, the datasets, the label level and the ID training classes. With ``--model`` the ID sets are
    its recorded training data unless ``--id_dataset`` names other data."""
    id_data = None
    if spec.model is not None:
        if spec.model_data is None and spec.id_dataset is None:
            refuse(f"--model {spec.model} records no training data (data_spec.json): give --id_dataset")
        model = load_model(spec.model)
        other = spec.id_dataset is not None and (spec.label_column or not Path(spec.id_dataset).is_dir())
        id_data = None if spec.model_data is None or spec.model_data["data"] is None or other else spec.model_data
        spec = resolved(spec, model_image_size=int(model.data_config["input_size"][-1]))
        transform = test_transform(model)
    else:
        import timm

        probe = timm.create_model(spec.backbone, pretrained=False, num_classes=0)
        cfg = timm.data.resolve_model_data_config(probe)
        spec = resolved(spec, model_image_size=int(cfg["input_size"][-1]))
        transform = image_transform(spec.image_size, cfg["mean"], cfg["std"])
    train_ds, test_ds, ood_sets, level = build_datasets(spec, transform, id_data)
    train_labels = train_ds.labels if hasattr(train_ds, "labels") else train_ds.dataset.labels[train_ds.indices]
    classes = torch.unique(train_labels[:, level])
    print(
        f"ID train {len(train_ds)} / test {len(test_ds)} images, {len(classes)} classes; "
        + ", ".join(f"OOD {k}: {len(v)}" for k, v in ood_sets.items()),
        flush=True,
    )
    return spec, train_ds, test_ds, ood_sets, level, classes, train_labels


def check_trained_head(spec: FitHeatSpec) -> None:
    """Refuse ``--train_epochs 0`` without ``--checkpoint`` or ``--pretrained true``: an untrained head."""
    if spec.train_epochs == 0 and spec.checkpoint is None and not spec.pretrained:
        refuse(
            "--train_epochs 0 without --checkpoint: the classifier head would be untrained (random weights), and the "
            "head-based detectors (MSP, Energy, HEAT, ...) would score noise; give --train_epochs N (trains the head "
            "on the ID set) or --checkpoint FILE (a trained classifier)"
        )


def scored_model(spec: FitHeatSpec, num_classes: int, device: torch.device) -> torch.nn.Module:
    """The classifier of :func:`~pml_suprank.recipes.ood_data.build_model` on ``device``; refused (one error line)
    before the classifier trains when its feature map at ``--image_size`` has fewer than 2 spatial positions."""
    model = build_model(spec, num_classes).to(device)
    if (positions := feature_map_positions(model, spec.image_size, device)) < 2:
        flag = f"--model {spec.model}" if spec.model else f"--backbone {spec.backbone}"
        refuse(f"{flag}: its feature map at --image_size {spec.image_size} has {positions} spatial position(s); the "
               "std-pooled features (HEAT's style prior) need at least 2: use a larger --image_size or a model "
               "trained at a larger size")  # fmt: skip
    return model


def extract_all(model, train_ds, test_ds, ood_sets, level, classes, train_labels, spec: FitHeatSpec, device):
    """Features of the ID train / test sets and of every OOD set, and the ID test accuracy."""

    def extract(ds, name):
        def run(batches):
            bar = progress(batches, spec, desc=f"features {name}", unit="batch")
            return ood.extract_features(model, bar, device=device)

        if spec.embedding_cache is None:
            return run(loader(ds, spec.batch_size))
        return ood_features(model, loader(ds, spec.batch_size), spec.embedding_cache, "ood_timm", run)

    train_feats = extract(train_ds, "ID train")
    train_feats.labels = class_targets(train_labels, level, classes)
    test_feats = extract(test_ds, "ID test")
    test_acc = None
    if test_feats.labels is not None:
        test_labels = test_ds.labels if hasattr(test_ds, "labels") else test_ds.dataset.labels[test_ds.indices]
        if bool(torch.isin(test_labels[:, level], classes).all()):
            targets = class_targets(test_labels, level, classes)
            test_acc = float((test_feats.logits.argmax(-1) == targets).float().mean())
            print(f"classifier ID test accuracy {test_acc:.3f}", flush=True)
        else:  # an open-set split (a retrieval model's test classes): no accuracy to measure
            print("ID test classes differ from the training classes (open set): no classifier accuracy", flush=True)
    ood_feats = {k: extract(v, f"OOD {k}") for k, v in ood_sets.items()}
    return train_feats, test_feats, ood_feats, test_acc


def save_features(out_dir: Path, model, train_feats, test_feats, ood_feats, spec: FitHeatSpec) -> Path:
    """``features.safetensors``: every extracted set and the head, read by ``ood_benchmark --features``."""
    return ood.save_features(
        out_dir / "features.safetensors",
        {"id_train": train_feats, "id_test": test_feats, **ood_feats},
        head=model.get_classifier(),
        metadata={
            "id_dataset": spec.id_dataset or spec.model,
            "backbone": spec.model or spec.backbone,
            "ood_datasets": list(ood_feats),
        },
    )


def check_files(spec: FitHeatSpec) -> Path:
    """The output folder, checked but not created yet (:func:`main` creates it after the last refusal, so a refused
    run leaves no folder); refused: an unreadable ``--checkpoint``, another run's ``results.json`` in it, a folder
    inside ``--model`` or ``--id_dataset``."""
    if spec.checkpoint is not None:
        try:
            read_state_dict(spec.checkpoint)
        except ValueError as e:
            refuse(f"--checkpoint {e}")
    out_dir = Path(spec.output_dir)
    if (out_dir / "results.json").exists() and not spec.overwrite_output_dir:
        refuse(f"--output_dir {str(out_dir)!r} already holds a results.json (another run's); choose another "
               "--output_dir, or pass --overwrite_output_dir true to replace it")  # fmt: skip
    return output_folder(out_dir, input_folders(spec), create=False)


def input_folders(spec: FitHeatSpec) -> dict[str, Any]:
    """The local input folders ``{"--flag": path}`` that ``--output_dir`` must not lie inside (the model, the data)."""
    return {"--model": spec.model, "--id_dataset": spec.id_dataset}


def _set_name(entry: str) -> str:
    """An OOD set as the guard records it: a local folder by its name (a model folder holds no local path)."""
    source, sep, rest = entry.partition(":")
    return Path(source).name + sep + rest if Path(source).exists() else entry


def store_guard(spec: FitHeatSpec, detectors, id_scores, ood_scores) -> Path | None:
    """With ``--model`` a local folder: the ``--guard`` detector calibrated at ``--ood_tpr`` on the held-out ID
    scores, saved as the model's OOD guard (``ood/``); returns that folder, else ``None``."""
    from pml_suprank.ood.guard import OODGuard, weights_sha256

    if spec.model is None or spec.guard == "none":
        return None
    folder = Path(spec.model)
    if not folder.is_dir():
        print(f"--model {spec.model} is not a local folder: no OOD guard stored (it is saved inside the model folder)")
        return None
    guard = OODGuard.calibrate(
        detectors[spec.guard], id_scores[spec.guard], model_sha256=weights_sha256(folder), feature_kind="pooled",
        tpr_target=spec.ood_tpr, ood_scores={_set_name(k): v[spec.guard] for k, v in ood_scores.items()},
        seed=spec.seed,
    )  # fmt: skip
    path = guard.save(folder)
    if (folder / "config.json").is_file():  # the model card gains its guard section
        from pml_suprank.hub.card import write_card

        write_card(folder)
    fprs = ", ".join(f"{k} {100 * v['fpr']:.1f}%" for k, v in guard.ood_sets.items())
    kept = f"{100 * guard.id_tpr:.1f}% (target {100 * spec.ood_tpr:.0f}%)"
    print(f"OOD guard {spec.guard} in {path}: OOD when score > {guard.threshold:.6g}; held-out ID kept {kept}; "
          f"OOD accepted (FPR): {fprs or '-'}")  # fmt: skip
    return path


def main(argv=None) -> dict:
    spec = parse_args(argv)
    if spec.push_to_hub:  # token, network and write access: before any work
        from pml_suprank.hub.preflight import require_push_access

        require_push_access(spec.hub_model_id)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)  # recipe-level seeding (classifier init and flips); the package never does this
    device = torch_device(spec.device)  # a CUDA device this machine lacks: refused before any work
    out_dir = check_files(spec)
    t0 = time.perf_counter()

    spec, train_ds, test_ds, ood_sets, level, classes, train_labels = prepare_data(spec)
    check_trained_head(spec)
    model = scored_model(spec, len(classes), device)
    out_dir = output_folder(out_dir, input_folders(spec))  # after the refusals
    train_history = train_classifier(model, train_ds, level, classes, spec, device)
    model.eval()
    train_feats, test_feats, ood_feats, test_acc = extract_all(
        model, train_ds, test_ds, ood_sets, level, classes, train_labels, spec, device
    )
    features_file = save_features(out_dir, model, train_feats, test_feats, ood_feats, spec)

    detectors, fit_times = fit_detectors(model, train_feats, spec)
    print("scoring ...", flush=True)
    id_scores = score_all(detectors, test_feats, test_ds, spec, device)
    ood_scores = {k: score_all(detectors, ood_feats[k], ood_sets[k], spec, device) for k in ood_sets}
    table = results_table(id_scores, ood_scores, spec.convention)
    print(f"\nFPR95 ({spec.convention}) / AUROC, ID = {spec.id_dataset or spec.model}, "
          f"backbone = {spec.model or spec.backbone}")  # fmt: skip
    print(format_table(table, list(ood_sets)))

    heat = detectors.get("HEAT")
    heat_dir = None if heat is None else heat.save_pretrained(out_dir / "heat_detector")
    guard_dir = store_guard(spec, detectors, id_scores, ood_scores)
    plot = None if spec.no_plots else save_histograms(id_scores, ood_scores, out_dir, spec.convention)
    results = {
        "args": spec.to_dict(),
        "classifier_history": train_history,
        "classifier_test_accuracy": test_acc,
        "table": table,
        "fit_seconds": fit_times,
        "heat_fit_seconds_per_prior": None if heat is None else heat.fit_seconds,
        "heat_history": None if heat is None else heat.history,
        "total_seconds": time.perf_counter() - t0,
        "heat_detector": None if heat_dir is None else str(heat_dir),
        "ood_guard": None if guard_dir is None else str(guard_dir),
        "histograms": None if plot is None else str(plot),
        "features": str(features_file),
    }
    write_json_atomically(out_dir / "results.json", results, indent=2)
    saved = f"HEAT detector in {heat_dir}" if heat_dir is not None else "no HEAT detector (not in --detectors)"
    print(f"\nwrote {out_dir / 'results.json'}, {plot or 'no plots'}, {saved}")
    if spec.push_to_hub and heat is not None:
        print(f"pushed to {heat.push_to_hub(spec.hub_model_id, private=spec.hub_private or None)}")
    print(f"total {results['total_seconds']:.1f} s")
    return results


run = console_script(main)  #: the console script ``pml-suprank-fit-heat``

if __name__ == "__main__":
    run()
