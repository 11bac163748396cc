"""``pml-suprank-ood-benchmark``: the near / far OOD benchmark of every registered detector on saved features
(:func:`pml_suprank.ood.benchmark`).

* From the ``features.safetensors`` of ``fit_heat`` (ID train / test, OOD sets, classifier head; nothing embedded
  twice)::

      python -m pml_suprank.recipes.ood_benchmark --features outputs/fit_heat/features.safetensors \\
          --near synthetic-heldout --far noise-uniform noise-blobs

* Without ``--features``: ``fit_heat``'s data and classifier steps first (its flags: ``--num_per_class``,
  ``--backbone``, ``--id_dataset``, ``--ood_datasets``, ...; offline SyntheticShapes by default), the features written
  to ``--output_dir``.

Every registered detector that scores features (not ODIN: it needs the images) and the variants (SSD+), sizes adapted
to small sets (``k`` of KNN / NNGuide at most the training size, ViM's ``dim = min(256, D // 2)``), HEAT with the
``fast`` preset. ``--near`` (default: ``synthetic-heldout`` when present) and ``--far`` (default: the others) group
the OOD sets. It prints the per-group and per-set tables and writes ``results.csv``, ``results.md``, ``results.json``
and ``score_histograms.png`` into ``--output_dir``.
"""

from __future__ import annotations

import argparse
import inspect
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from pml_suprank import ood
from pml_suprank._terminal import refuse
from pml_suprank.recipes import fit_heat
from pml_suprank.recipes._common import console_script, output_folder
from pml_suprank.recipes._common import device as torch_device
from pml_suprank.recipes.ood_spec import VARIANTS, OODBenchmarkSpec, available_detectors
from pml_suprank.training.run_folder import write_json_atomically
from pml_suprank.training.spec import build_parser as spec_parser
from pml_suprank.training.spec import parse


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`~pml_suprank.recipes.ood_spec.OODBenchmarkSpec` field (``--help``; the other flags go to
    ``fit_heat``)."""
    return spec_parser(OODBenchmarkSpec)


def extract(fh, out_dir: Path) -> tuple[Path, int | None]:
    """``features.safetensors`` in ``out_dir`` (created once fit_heat's refusals have passed) from fit_heat's data /
    classifier / extraction steps with its spec ``fh``, and the HEAT epochs of the resolved spec (the synthetic
    default)."""
    device = torch_device(fh.device)  # a CUDA device this machine lacks: refused
    fh, train_ds, test_ds, ood_sets, level, classes, train_labels = fit_heat.prepare_data(fh)
    fit_heat.check_trained_head(fh)
    model = fit_heat.scored_model(fh, len(classes), device)
    output_folder(out_dir, fit_heat.input_folders(fh))  # after the refusals: a refused run leaves no folder behind
    fit_heat.train_classifier(model, train_ds, level, classes, fh, device)
    model.eval()
    feats = fit_heat.extract_all(model, train_ds, test_ds, ood_sets, level, classes, train_labels, fh, device)
    return fit_heat.save_features(out_dir, model, *feats[:3], fh), fh.heat_epochs


def group_sets(names: list[str], near: list[str] | None, far: list[str] | None,
               source: str = "the feature file") -> dict[str, list[str]]:  # fmt: skip
    """``{"near": [...], "far": [...]}`` from the OOD set names of ``source`` (unknown names are an error)."""
    unknown = sorted((set(near or ()) | set(far or ())) - set(names))
    if unknown:
        raise SystemExit(f"--near/--far name sets that are not in {source}: {unknown}; it holds {names}")
    if near is None:
        near = [n for n in names if n == "synthetic-heldout" and n not in (far or ())]
    if far is None:
        far = [n for n in names if n not in near]
    groups = {"near": list(near), "far": list(far)}
    return {g: s for g, s in groups.items() if s}


def build_detectors(names, saved: ood.SavedFeatures, spec: OODBenchmarkSpec) -> dict[str, ood.Detector]:
    """Detectors with their defaults, the saved head where they need one, and sizes adapted to the data."""
    train = saved.sets["id_train"]
    n_train, dim = train.features.shape
    head = {"weight": saved.weight, "bias": saved.bias}
    out = {}
    for row in names:
        name, variant = VARIANTS.get(row, (row, {}))
        cls = ood.get_detector(name)
        params = inspect.signature(cls).parameters
        kwargs = dict(variant)
        if "weight" in params:
            if saved.weight is None:
                print(f"skipping {row}: the feature file has no classifier head", flush=True)
                continue
            kwargs.update(head)
        if name in ("KNN", "NNGuide"):
            kwargs["k"] = min(params["k"].default, n_train)
        if name == "NNGuide":
            kwargs["seed"] = spec.seed
        if name == "ViM":
            kwargs["dim"] = min(256, dim // 2)
        if name == "HEAT":
            settings = {"batch_size": spec.heat_batch_size}
            if spec.heat_epochs is not None:
                settings["epochs"] = spec.heat_epochs
            kwargs.update(preset="fast", settings=settings, seed=spec.seed)
        out[row] = cls(**kwargs)
    return out


def read_features(path: Path) -> ood.SavedFeatures:
    """The saved features of ``path`` (:func:`pml_suprank.ood.load_features`) holding the ``id_train`` and
    ``id_test`` sets, or a refusal naming ``--features``."""
    try:
        saved = ood.load_features(path)
    except (OSError, ValueError) as e:
        refuse(f"--features {path}: {e}")
    if missing := {"id_train", "id_test"} - set(saved.sets):
        refuse(f"--features {path} lacks the set(s) {sorted(missing)} (write it with fit_heat)")
    return saved


def main(argv=None) -> dict:
    rest: list[str] = []  # the flags of fit_heat's data / classifier steps
    args = parse(OODBenchmarkSpec, argv, rest=rest)
    if args.features is not None and rest:
        refuse(f"unknown flags {rest} (data / classifier flags only apply without --features)")
    # every option checked before any work
    fh = None if args.features else replace(fit_heat.parse_args(rest), seed=args.seed, progress=args.progress)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # recipe-level seeding of the classifier training (the package never seeds)
    saved = None if args.features is None else read_features(Path(args.features))  # before the folder is made
    inputs = {} if fh is None else fit_heat.input_folders(fh)  # checked now, made by extract() with extraction
    out_dir = output_folder(args.output_dir, inputs, create=fh is None)
    if fh is not None:  # the OOD sets to extract are known: --near / --far checked before any work
        group_sets(list(fh.ood_datasets), args.near, args.far, "--ood_datasets")
    t0 = time.perf_counter()
    features_path, heat_epochs = extract(fh, out_dir) if fh is not None else (Path(args.features), None)
    if args.heat_epochs is None and heat_epochs is not None:
        args = replace(args, heat_epochs=heat_epochs)
    saved = saved if saved is not None else read_features(features_path)
    ood_names = [n for n in saved.sets if n not in ("id_train", "id_test")]
    groups = group_sets(ood_names, args.near, args.far)
    detectors = build_detectors(args.detectors or available_detectors(), saved, args)  # names checked by parse
    result = ood.benchmark(
        detectors,
        saved.sets["id_test"],
        {g: {n: saved.sets[n] for n in names} for g, names in groups.items()},
        id_train=saved.sets["id_train"],
        ap_method=args.ap_method,
        output_dir=out_dir,
        plot=not args.no_plots,
        progress=args.progress,
    )
    print(f"\nOOD benchmark on {features_path} (ID test {len(saved.sets['id_test'])}; groups {groups})\n")
    print(result.to_markdown(per_set=False), "\n")
    print(result.to_markdown())
    summary = {
        "features": str(features_path),
        "feature_metadata": saved.metadata,
        "groups": groups,
        "rows": result.rows,
        "fit_seconds": result.fit_seconds,
        "total_seconds": time.perf_counter() - t0,
        "args": asdict(args),
    }
    write_json_atomically(out_dir / "results.json", summary, indent=2)
    figure = "" if args.no_plots else ", score_histograms.png"
    print(f"\nwrote {out_dir}/results.csv, results.md, results.json{figure}")
    print(f"total {summary['total_seconds']:.1f} s")
    return summary


run = console_script(main)  #: the console script ``pml-suprank-ood-benchmark``

if __name__ == "__main__":
    run()
