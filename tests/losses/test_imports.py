"""Import structure of the losses: the input helpers and the base class import no loss, and no import cycle runs
through the losses, the memory or the distributed helpers (imports inside functions included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import pml_suprank

ROOT = Path(pml_suprank.__file__).parent
LOSS_MODULES = {p.stem for p in (ROOT / "losses").glob("*.py")} - {"__init__"}


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of the pml_suprank modules imported anywhere in ``path`` (function bodies included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pml_suprank"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("pml_suprank"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = ["pml_suprank", *path.relative_to(ROOT).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_pkg else parts)
        modules[name] = (path, name if is_pkg else name.rsplit(".", 1)[0])
    graph = {}
    for name, (path, package) in modules.items():
        deps = set()
        for target in _imports(path, package):
            pieces = target.split(".")
            for i in range(2, len(pieces) + 1):
                dep = ".".join(pieces[:i])
                if dep in modules and dep != name and not name.startswith(dep + "."):
                    deps.add(dep)
        graph[name] = deps
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


_LOADED_LOSS_MODULES = """
import importlib, sys, types
sys.path.insert(0, sys.argv[1])
import pml_suprank  # the root package imports its subpackages lazily
stub = types.ModuleType("pml_suprank.losses")  # the package without its __init__, which imports every loss
stub.__path__ = [pml_suprank.__path__[0] + "/losses"]
sys.modules["pml_suprank.losses"] = stub
for module in sys.argv[2:]:
    importlib.import_module("pml_suprank.losses." + module)
    print(module, *sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("pml_suprank.losses.")))
"""


def _loaded_loss_modules(*modules: str) -> dict[str, set[str]]:
    """For each of ``modules`` imported in turn in a fresh interpreter: the ``pml_suprank.losses`` modules loaded
    so far (transitive imports included, the package's ``__init__`` bypassed)."""
    out = subprocess.run(
        [sys.executable, "-c", _LOADED_LOSS_MODULES, str(ROOT.parent), *modules],
        capture_output=True, text=True, timeout=300, cwd=ROOT.parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: set(line.split()[1:]) for line in out.stdout.splitlines()}


@pytest.mark.slow  # a fresh interpreter importing torch and PML: several seconds
def test_input_helpers_and_base_class_import_no_loss_class():
    """Transitively: importing the helpers and the base class loads no loss module (only private helpers); the
    combined loss, imported last, does load the losses it combines (the check can fail)."""
    loaded = _loaded_loss_modules("_suprank_step", "_inputs", "base_rank_loss", "combined_rank_loss")
    assert loaded["_suprank_step"] >= {"_suprank_step"} and loaded["base_rank_loss"] >= {"_inputs", "base_rank_loss"}
    public = {m for m in loaded["base_rank_loss"] if not m.startswith("_")}
    assert public == {"base_rank_loss", "compile_guard"}, loaded["base_rank_loss"]  # the guard is no loss
    assert {"calibration_loss", "cluster_loss", "combined_rank_loss"} <= loaded["combined_rank_loss"]


@pytest.mark.slow
def test_no_import_cycle_through_losses_memory_or_distributed():
    graph = _graph()
    mine = [m for m in graph if m.startswith("pml_suprank.losses")] + ["pml_suprank.memory", "pml_suprank.collectives"]
    for module in mine:
        assert module not in _reachable(graph, module), f"{module} imports itself through a cycle"
