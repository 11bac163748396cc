"""The public surface is pinned: a public name that appears or disappears fails here until the snapshot is updated.

Regenerate the snapshot after an intended change of the public names (then review the diff of the JSON file)::

    PYTHONPATH=$PWD python tests/test_api_snapshot.py --update

Also checked: the surface stays small (at most ``MAX_PUBLIC_NAMES`` names one import away), every listed name
exists, and modules do not reach into one another's underscore names (at most ``MAX_UNDERSCORE_IMPORTS`` such
imports inside ``pml_suprank/``).
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path

from _api_surface import count_public_names, public_surface

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pml_suprank"
SNAPSHOT = Path(__file__).resolve().parent / "data" / "api_snapshot.json"
UPDATE_COMMAND = "PYTHONPATH=$PWD python tests/test_api_snapshot.py --update"
MAX_PUBLIC_NAMES = 180
MAX_UNDERSCORE_IMPORTS = 10


def _diff(old: dict[str, list[str]], new: dict[str, list[str]]) -> list[str]:
    lines = []
    for module in sorted(set(old) | set(new)):
        before, after = set(old.get(module, ())), set(new.get(module, ()))
        lines += [f"  + {module}.{n}" for n in sorted(after - before)]
        lines += [f"  - {module}.{n}" for n in sorted(before - after)]
    return lines


def test_public_names_match_the_snapshot():
    expected = json.loads(SNAPSHOT.read_text())
    current = public_surface()
    changes = _diff(expected, current)
    assert not changes, (
        "the public API changed (+ added, - removed):\n"
        + "\n".join(changes)
        + f"\nIf intended, regenerate the snapshot from the checkout's root with `{UPDATE_COMMAND}`, review "
        "tests/data/api_snapshot.json and record removals in CHANGELOG.md under 'Removed'."
    )


def test_public_surface_is_small():
    surface = public_surface()
    total = count_public_names(surface)
    per_module = ", ".join(f"{m.removeprefix('pml_suprank.')} {len(n)}" for m, n in surface.items())
    assert total <= MAX_PUBLIC_NAMES, f"{total} public names one import away (> {MAX_PUBLIC_NAMES}): {per_module}"


# DESIGN.md section 5: the names the README and downstream code rely on stay listed (not only importable).
PINNED = {
    "pml_suprank": "data hub losses memory metrics models ood ranking relevance samplers search training",
    "pml_suprank.losses": "SmoothAPLoss SupAPLoss CalibrationLoss ClusterLoss ROADMAPLoss SupRecallLoss RODRecallLoss "
    "SupHAPLoss HAPPIERLoss SupNDCGLoss RODNDCGLoss CSLLoss CombinedRankLoss register_loss",
    "pml_suprank.samplers": "MPerClassSampler HierarchicalSampler",
    "pml_suprank.memory": "RankingMemory CrossBatchMemory",
    "pml_suprank.metrics": "RetrievalEvaluator HierarchicalAccuracyCalculator RetrievalMetric functional",
    "pml_suprank.ood": "HEAT MSP MaxLogit Energy ODIN Mahalanobis KNN ViM DICE ReAct GEN RMDS ASH SCALE NNGuide "
    "Detector metrics benchmark",
    "pml_suprank.models": "RetrievalModel",
    "pml_suprank.data": "load_retrieval_dataset SyntheticShapes load_benchmark",
    "pml_suprank.relevance": "multilabel_relevance",
    "pml_suprank.ranking": "choose_kernel",
    "pml_suprank.training": "RunSpec cached_backward",
    "pml_suprank.search": "RetrievalIndex",
}


def test_design_names_stay_public():
    surface = public_surface()
    missing = [f"{m}.{n}" for m, names in PINNED.items() for n in names.split() if n not in surface[m]]
    assert not missing, f"DESIGN.md section 5 names left the public surface: {missing}"
    from pml_suprank.metrics import functional
    from pml_suprank.ood import metrics

    assert callable(functional.graded_average_precision) and callable(metrics.auroc) and callable(metrics.fpr_at_tpr)


def test_every_listed_name_exists():
    for module, names in public_surface().items():
        imported = importlib.import_module(module)
        missing = [n for n in names if not hasattr(imported, n)]
        assert not missing, f"{module}.__all__ lists names it does not define: {missing}"


def underscore_imports(package: Path = PACKAGE) -> list[str]:
    """``["path:line name", ...]``: imports of another module's underscore name (``from .x import _y``).

    Importing a private *module* (``from . import _compiled_counts``, ``from .._validation import check_finite``)
    is fine; what counts is a leading-underscore *name* that is not a module of the package.
    """
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias in node.names:
                if not alias.name.startswith("_") or alias.name.startswith("__"):
                    continue
                if node.level and not node.module:  # ``from . import _module``: a private submodule
                    base = path.parent.joinpath(*[".."] * (node.level - 1)).resolve()
                    if (base / f"{alias.name}.py").exists() or (base / alias.name).is_dir():
                        continue
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}")
    return found


def test_few_underscore_cross_imports():
    found = underscore_imports()
    assert len(found) <= MAX_UNDERSCORE_IMPORTS, (
        f"{len(found)} imports of another module's underscore names (> {MAX_UNDERSCORE_IMPORTS}); promote the helper "
        "to a public name of a shared module (pml_suprank/_validation.py, relevance.py, ...) instead:\n"
        + "\n".join(found)
    )


def test_underscore_import_counter_sees_a_private_name(tmp_path):
    (tmp_path / "a.py").write_text("def _helper():\n    return 1\n")
    (tmp_path / "_private.py").write_text("def shared():\n    return 1\n")
    (tmp_path / "b.py").write_text("from .a import _helper\nfrom . import _private\nfrom ._private import shared\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert underscore_imports(tmp_path) == ["b.py:1 _helper"]
    finally:
        ROOT = saved


def main(argv: list[str]) -> int:
    if argv != ["--update"]:
        print(f"usage: {UPDATE_COMMAND}")  # noqa: T201
        return 2
    surface = public_surface()
    SNAPSHOT.write_text(json.dumps(surface, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}: {count_public_names(surface)} public names")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
