"""The trust review's probes (issue 37), re-run by ``benchmarks/probe_trust.py``: one PASS / HOLE line per probe and
no hole. Slow (the recipe probes run the commands as a user would, in subprocesses)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("timm")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_trust.py"


@pytest.mark.slow
def test_every_probe_of_the_trust_review_passes(capsys):
    spec = importlib.util.spec_from_file_location("probe_trust", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    holes = module.main()
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(("PASS", "HOLE"))]
    assert len(lines) == len(module.PROBES) >= 25, out
    assert holes == 0, "\n".join(line for line in lines if line.startswith("HOLE"))
