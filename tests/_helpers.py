"""Helpers shared by several test files: recipe imports, the 2-process gloo launcher, multi-label fixtures."""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
WORKER = Path(__file__).parent / "_distributed_worker.py"

# 6 fine labels -> 3 mid -> 2 coarse (column 0 = fine, last = coarsest)
MULTILABEL_TABLE = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 1, 0], [4, 2, 1], [5, 2, 1]])


def import_recipe(name: str):
    """The recipe module ``pml_suprank.recipes.<name>`` (``recipes/<name>.py`` is its thin entry point)."""
    return importlib.import_module(f"pml_suprank.recipes.{name}")


def recipe_parser(recipe: str = "train_happier"):
    """``(pml_suprank.training.recipe, the argparse parser of recipe)``; the parser carries the preset's defaults
    (``preset_defaults``) for :func:`parse_recipe`."""
    from pml_suprank.training import recipe as common

    module = import_recipe(recipe)
    parser = common.build_parser(module.DESCRIPTION, module.DEFAULTS, module.HIERARCHICAL)
    parser.preset_defaults = module.DEFAULTS
    return common, parser


def parse_recipe(parser, argv):
    """The :class:`~pml_suprank.training.RunSpec` of ``argv`` for the training preset of ``parser``
    (:func:`recipe_parser`), by the one spec engine (``parse(RunSpec, argv, defaults=preset)``)."""
    from pml_suprank.training.hub_config import read_layer
    from pml_suprank.training.run_spec import RunSpec
    from pml_suprank.training.spec import parse

    return parse(RunSpec, argv, defaults=parser.preset_defaults, description=parser.description, read_config=read_layer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_workers(out: Path, world_size: int = 2, extra: Sequence[str] = ()) -> tuple[list[int], list[str]]:
    """Run ``tests/_distributed_worker.py`` on ``world_size`` gloo processes; return their exit codes and logs."""
    port, procs = free_port(), []
    for rank in range(world_size):
        cmd = [sys.executable, str(WORKER), "--out", str(out), "--rank", str(rank), "--world-size", str(world_size)]
        cmd += ["--port", str(port), *extra]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=600)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{world_size}-process gloo run timed out")
    return [p.returncode for p in procs], logs


def random_label_sets(n: int, m: int, gen: torch.Generator, num_fine: int = 6) -> torch.Tensor:
    """``(n, m)`` random fine-label sets padded with -1 (about 40 % padding; column 0 always holds a label)."""
    labels = torch.randint(0, num_fine, (n, m), generator=gen)
    pad = torch.rand(n, m, generator=gen) < 0.4
    pad[:, 0] = False
    return labels.masked_fill(pad, -1)


# Host-synchronising aten ops (they block the host until an accelerator's queue drains), as counted by the
# benchmarks. torch._assert_async reads its flag on the CPU but never blocks a CUDA host: ops under it are not syncs.
SYNC_OPS = frozenset(
    {
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::is_nonzero",
        "aten::unique",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::masked_select",
        "aten::equal",
    }
)


# device-to-host reads that dispatch no aten op on the CPU. ``.numpy()`` / ``__array__`` are not counted: they only
# work on CPU tensors, so the code paths calling them are CPU-only branches that do not exist on an accelerator
HOST_READS = ("tolist",)


def profiled_ops(fn, *, host_reads: bool = False, warm_up: bool = True) -> tuple[list[str], list[str]]:
    """``(top-level aten ops, host-synchronising ops)`` of one call of ``fn`` (torch.profiler, CPU), after a warm-up
    call unless ``warm_up=False``.

    Top-level = an aten event whose parent is not an aten op. A sync is counted once, at its outermost op, and not
    when nested in ``aten::_assert_async`` (asynchronous on accelerators). ``host_reads=True`` also counts the
    Python-level reads of a tensor's data (``.tolist()``: no aten op on the CPU, a device-to-host copy elsewhere).
    """
    from torch.profiler import ProfilerActivity, profile

    if warm_up:
        fn()
    reads: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS} if host_reads else {}

    def counting(name, method):
        def wrapper(*args, **kwargs):
            reads.append(name)
            return method(*args, **kwargs)

        return wrapper

    try:
        for name, method in saved.items():
            setattr(torch.Tensor, name, counting(name, method))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    skip = SYNC_OPS | {"aten::_assert_async"}

    def nested(e) -> bool:
        while e.cpu_parent is not None:
            e = e.cpu_parent
            if e.name in skip:
                return True
        return False

    top = [e.name for e in events if not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    syncs = [e.name for e in events if e.name in SYNC_OPS and not nested(e)]
    return top, syncs + reads
