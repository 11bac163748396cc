"""Layout rules: no import cycle, no module over 600 lines, no function over 120 lines, snake_case recipe flags."""

from __future__ import annotations

import ast
import os
import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pml_suprank"
RECIPES = ROOT / "recipes"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _targets(module: str, is_package: bool, node: ast.AST, known: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
    else:
        base = []
    target = ".".join(base + ([node.module] if node.module else []))
    return [target] + [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]


def _import_graph() -> dict[str, set[str]]:
    """Edges module -> imported pml_suprank module, counting imports inside functions (TYPE_CHECKING excluded)."""
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in known.items():
        deps: set[str] = set()
        stack = list(ast.parse(path.read_text()).body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, is_package, node, known):
                    parts = target.split(".")
                    for i in range(1, len(parts) + 1):
                        dep = ".".join(parts[:i])
                        if dep in known and dep != module and not module.startswith(dep + "."):
                            deps.add(dep)
            stack.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
        graph[module] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_detector_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.slow
def test_no_import_cycle_in_the_package():
    assert _cycles(_import_graph()) == []


def _sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *RECIPES.glob("*.py")])


def test_no_module_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert long == {}


@pytest.mark.slow
def test_no_function_over_120_lines():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}


REMOVED_MODULES = (  # moved or re-export-only modules removed before 0.1.0 (CHANGELOG.md, "Removed")
    "pml_suprank.benchmarks",
    "pml_suprank.hierarchical_ranking",
    "pml_suprank.ood.baselines",
    "pml_suprank.losses.cross_batch_memory",
    "pml_suprank.synthetic_shapes",
    "pml_suprank.synthetic_multishapes",
    "pml_suprank._retrieval_dataset",
    "pml_suprank._hf_sources",
    "pml_suprank._multilabel_columns",
    "pml_suprank._sampler_base",
    "pml_suprank.multilabel_sampler",
    "pml_suprank.distributed",
    "pml_suprank.training.rules",
    "pml_suprank.training.data_spec",
    "pml_suprank.search.options",
    "pml_suprank.ood.registry",
    "pml_suprank.ood.gen",
    "pml_suprank.ood.odin",
    "pml_suprank.ood.rmds",
    "pml_suprank.ood.nnguide",
    "pml_suprank.ood.react",
    "pml_suprank.ood.dice",
    "pml_suprank.ood.presets",
    "pml_suprank.training.data_source",
    "pml_suprank.ood.heat_priors",
    "pml_suprank.ood.prior",
    "pml_suprank.ood.head",
    "pml_suprank.losses._combination",
)


def test_packages_group_their_modules_and_removed_paths_stay_removed():
    import pml_suprank

    def exists(module: str) -> bool:
        path = ROOT.joinpath(*module.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    assert not {m for m in REMOVED_MODULES if exists(m)}
    assert not {m.split(".")[1] for m in REMOVED_MODULES if m.count(".") == 1} & set(pml_suprank.__all__)
    assert {"data", "samplers", "memory"} <= set(pml_suprank.__all__)
    for package in ("data", "data/benchmarks", "samplers"):
        assert (PACKAGE / package / "__init__.py").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.py") if "__main__" in p.read_text()))
def test_recipe_flags_are_snake_case_and_show_defaults(recipe, monkeypatch, capsys):
    """The script ``recipes/<recipe> --help``, run as ``python`` runs it (in this process: the imports are shared)."""
    monkeypatch.setattr(sys, "argv", [str(RECIPES / recipe), "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))  # noqa: TID251 - restored
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as raised:
        runpy.run_path(str(RECIPES / recipe), run_name="__main__")
    out = capsys.readouterr()
    assert raised.value.code in (0, None), out.err
    flags = set(re.findall(r"(?<![\w-])--[A-Za-z0-9_-]+", out.out))
    assert flags, out.out
    assert {f for f in flags if "-" in f[2:]} == set()
    assert "(default:" in out.out
