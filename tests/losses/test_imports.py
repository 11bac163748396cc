"""Import structure of the losses: the input helpers and the base class import no loss, and no import cycle runs
through the losses, the memory or the distributed helpers (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_input_helpers_and_base_class_import_no_loss_class():
    graph = _graph()
    for helper in ("_inputs", "_suprank_step"):
        deps = _reachable(graph, f"pml_suprank.losses.{helper}")
        assert not {d for d in deps if d.startswith("pml_suprank.losses")}, (helper, deps)
    direct = graph["pml_suprank.losses.base_rank_loss"]
    assert "pml_suprank.losses.calibration_loss" not in direct and "pml_suprank.losses.cluster_loss" not in direct


def test_no_import_cycle_through_losses_memory_or_distributed():
    graph = _graph()
    mine = [m for m in graph if m.startswith("pml_suprank.losses")] + ["pml_suprank.memory", "pml_suprank.distributed"]
    for module in mine:
        assert module not in _reachable(graph, module), f"{module} imports itself through a cycle"
