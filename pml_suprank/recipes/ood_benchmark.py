"""Near / far OOD benchmark of every registered detector on saved features (``ood.benchmark``).

Two ways to run it:

* **from features saved by** ``fit_heat`` (``<output_dir>/features.safetensors``: ID train / ID test /
  OOD sets and the classifier head), so that nothing is embedded twice::

      python -m pml_suprank.recipes.fit_heat --output_dir outputs/fit_heat
      python -m pml_suprank.recipes.ood_benchmark --features outputs/fit_heat/features.safetensors \\
          --near synthetic-heldout --far noise-uniform noise-blobs

* **with no ``--features``**: it runs ``fit_heat.py``'s data and classifier steps first (the same flags, e.g.
  ``--num_per_class``, ``--backbone``, ``--id_dataset``, ``--ood_datasets``; offline SyntheticShapes by default),
  writes ``features.safetensors`` into ``--output_dir`` and benchmarks on it.

Every registered detector is fitted once on the ID training features (ODIN is left out: it needs the images and the
network, see ``fit_heat.py``), plus the SSD+ variant of Mahalanobis. The recipe adapts sizes to small sets (``k`` of
KNN / NNGuide at most the training size, ViM's ``dim = min(256, D // 2)``) and runs HEAT with the ``fast`` preset.
OOD sets are grouped: ``--near`` names (default: ``synthetic-heldout`` when present), ``--far`` names (default: the
others). It prints the per-group and per-set tables (AUROC, FPR95 in both conventions, AUPR-In / -Out) and writes
``results.csv``, ``results.md``, ``results.json`` and ``score_histograms.png`` into ``--output_dir``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from pml_suprank import ood  # noqa: E402
from pml_suprank.recipes.ood_spec import VARIANTS, OODBenchmarkSpec  # noqa: E402
from pml_suprank.training.spec import build_parser as spec_parser  # noqa: E402
from pml_suprank.training.spec import parse  # noqa: E402

#: Detectors that score images through the network, not features: not run here.
NEEDS_IMAGES = ("ODIN",)


def available_detectors() -> tuple[str, ...]:
    """Every registered detector that scores features, each followed by its variants."""
    names: list[str] = []
    for name in ood.list_detectors():
        if name not in NEEDS_IMAGES:
            names += [name, *(v for v, (base, _) in VARIANTS.items() if base == name)]
    return tuple(names)


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`~pml_suprank.recipes.ood_spec.OODBenchmarkSpec` field (the other flags go to
    ``fit_heat``'s data / classifier steps when ``--features`` is not given)."""
    return spec_parser(OODBenchmarkSpec)


def parse_args(argv: list[str] | None = None) -> tuple[OODBenchmarkSpec, list[str]]:
    """The benchmark's spec (each flag checked by its field) and the flags left for ``fit_heat``."""
    rest: list[str] = []
    return parse(OODBenchmarkSpec, argv, rest=rest), rest


def _import_fit_heat():
    """:mod:`pml_suprank.recipes.fit_heat`, imported when a run needs it."""
    from . import fit_heat

    return fit_heat


def fit_heat_spec(spec: OODBenchmarkSpec, rest: list[str]):
    """The :class:`~pml_suprank.recipes.ood_spec.FitHeatSpec` of the data / classifier steps: ``rest`` (fit_heat's
    flags, ``--config`` included) with the benchmark's seed and progress."""
    from dataclasses import replace

    fh = _import_fit_heat().parse_args(rest)
    return replace(fh, seed=spec.seed, progress=spec.progress)


def extract(spec: OODBenchmarkSpec, fh, out_dir: Path) -> tuple[Path, int | None]:
    """Run fit_heat's data / classifier / extraction steps with the spec ``fh`` and save ``features.safetensors``;
    returns its path and fit_heat's HEAT epochs (the synthetic default)."""
    fit_heat = _import_fit_heat()
    device = torch.device(fh.device)
    fh, train_ds, test_ds, ood_sets, level, classes, train_labels = fit_heat.prepare_data(fh)
    fit_heat.check_trained_head(fh)
    model = fit_heat.build_model(fh, len(classes)).to(device)
    fit_heat.train_classifier(model, train_ds, level, classes, fh, device)
    model.eval()
    feats = fit_heat.extract_all(model, train_ds, test_ds, ood_sets, level, classes, train_labels, fh, device)
    return fit_heat.save_features(out_dir, model, *feats[:3], fh), fh.heat_epochs


def group_sets(names: list[str], near: list[str] | None, far: list[str] | None) -> dict[str, list[str]]:
    """``{"near": [...], "far": [...]}`` from the OOD set names of the file (unknown names are an error)."""
    unknown = sorted((set(near or ()) | set(far or ())) - set(names))
    if unknown:
        raise SystemExit(f"--near/--far name sets that are not in the feature file: {unknown}; it holds {names}")
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


def _output_dir(path: str) -> Path:
    """``--output_dir``, created and writable, or the command ends with one ``error:`` line (exit 2)."""
    from pml_suprank.training.recipe import refuse
    from pml_suprank.training.run_folder import OutputDirError, prepare_output_dir

    try:
        return prepare_output_dir(path)
    except OutputDirError as e:
        refuse(str(e))


def _read_features(path: Path) -> ood.SavedFeatures:
    """The ``--features`` file, or one ``error:`` line naming it (exit 2): missing, not safetensors, foreign."""
    from pml_suprank.training.recipe import refuse

    try:
        return ood.load_features(path)
    except (OSError, ValueError) as e:
        refuse(f"--features {path}: {e}")


def main(argv=None) -> dict:
    args, rest = parse_args(argv)
    if args.features is not None and rest:
        raise SystemExit(f"unknown flags {rest} (data / classifier flags only apply without --features)")
    fh = fit_heat_spec(args, rest) if args.features is None else None  # every option checked before any work
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # recipe-level seeding of the classifier training (the package never seeds)
    out_dir = _output_dir(args.output_dir)
    t0 = time.perf_counter()
    saved = None if args.features is None else _read_features(Path(args.features))  # before any work
    if fh is not None:
        features_path, heat_epochs = extract(args, fh, out_dir)
        if args.heat_epochs is None and heat_epochs is not None:
            args = replace(args, heat_epochs=heat_epochs)
        saved = ood.load_features(features_path)
    else:
        features_path = Path(args.features)
    missing = {"id_train", "id_test"} - set(saved.sets)
    if missing:
        raise SystemExit(f"{features_path} lacks the set(s) {sorted(missing)} (write it with fit_heat)")
    ood_names = [n for n in saved.sets if n not in ("id_train", "id_test")]
    groups = group_sets(ood_names, args.near, args.far)
    rows = args.detectors or available_detectors()
    unknown = sorted(set(rows) - set(available_detectors()))
    if unknown:
        raise SystemExit(f"--detectors: unknown {unknown}; choose among {list(available_detectors())}")
    detectors = build_detectors(rows, saved, args)
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
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2, default=str))
    figure = "" if args.no_plots else ", score_histograms.png"
    print(f"\nwrote {out_dir}/results.csv, results.md, results.json{figure}")
    print(f"total {summary['total_seconds']:.1f} s")
    return summary


def run() -> None:
    """The console script ``pml-suprank-ood-benchmark``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()
