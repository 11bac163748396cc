"""Check a built distribution: ``python .ci/check_dist.py DIST_DIR [REPO_ROOT]``.

DIST_DIR holds one wheel and one sdist of pml-suprank (``python -m build``). The wheel must hold every recipe module
of ``pml_suprank/recipes`` and every hub_config of ``pml_suprank/hub_configs`` (as in REPO_ROOT, default: this
checkout), the LICENSE (same text), the console scripts pointing at the recipe modules' ``run``; the sdist the same
files plus ``pyproject.toml``. Exit status 1 with the list of what is missing.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

SCRIPTS = {
    "pml-suprank-train": "train",
    "pml-suprank-train-happier": "train_happier",
    "pml-suprank-train-roadmap": "train_roadmap",
    "pml-suprank-evaluate": "evaluate",
    "pml-suprank-search": "search",
    "pml-suprank-fit-heat": "fit_heat",
    "pml-suprank-prepare-dataset": "prepare_dataset",
    "pml-suprank-ood-benchmark": "ood_benchmark",
    "pml-suprank-ood-score": "ood_score",
    "pml-suprank-push": "push",
    "pml-suprank-demo": "demo",
}


def expected_files(root: Path) -> set[str]:
    """Package paths that a distribution must hold: the recipe modules and the hub_configs of ``root``."""
    package = root / "pml_suprank"
    files = {p.relative_to(root).as_posix() for p in (package / "recipes").glob("*.py")}
    files |= {p.relative_to(root).as_posix() for p in (package / "hub_configs").glob("*.yaml")}
    return files


def check_wheel(wheel: Path, root: Path) -> list[str]:
    problems = []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        problems += [f"wheel lacks {f}" for f in sorted(expected_files(root) - names)]
        licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        if not licenses:
            problems.append("wheel lacks the LICENSE (*.dist-info/licenses/LICENSE)")
        elif z.read(licenses[0]) != (root / "LICENSE").read_bytes():
            problems.append(f"wheel's {licenses[0]} differs from LICENSE")
        entry_points = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        text = z.read(entry_points).decode() if entry_points else ""
        for script, module in SCRIPTS.items():
            if f"{script} = pml_suprank.recipes.{module}:run" not in text:
                problems.append(f"wheel lacks the console script {script} = pml_suprank.recipes.{module}:run")
        metadata = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if metadata is None or "License-Expression: MIT" not in z.read(metadata).decode():
            problems.append("wheel METADATA lacks License-Expression: MIT")
    return problems


def check_sdist(sdist: Path, root: Path) -> list[str]:
    with tarfile.open(sdist) as t:
        names = {name.split("/", 1)[1] for name in t.getnames() if "/" in name}
    wanted = expected_files(root) | {"LICENSE", "pyproject.toml", "README.md"}
    return [f"sdist lacks {f}" for f in sorted(wanted - names)]


def main(argv: list[str]) -> int:
    dist = Path(argv[0])
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"{dist}: expected one wheel and one sdist; found {[p.name for p in [*wheels, *sdists]]}")
        return 1
    problems = check_wheel(wheels[0], root) + check_sdist(sdists[0], root)
    for problem in problems:
        print(problem)
    if not problems:
        n = len(expected_files(root))
        print(f"{wheels[0].name} and {sdists[0].name}: {n} recipe modules and hub_configs, LICENSE, "
              f"{len(SCRIPTS)} console scripts")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
