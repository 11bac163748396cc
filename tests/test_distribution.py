"""The built distribution is a complete install: the wheel and the sdist, built offline from a copy of the
checkout, hold every recipe module, every hub_config, the LICENSE and the console scripts (``.ci/check_dist.py``, the
check CI runs on its own build); without the package-data entry the check fails (the hub_configs would be missing)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _checker():
    spec = importlib.util.spec_from_file_location("check_dist", ROOT / ".ci" / "check_dist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(src: Path, out: Path) -> None:
    """Wheel and sdist of ``src`` into ``out``, offline, with the installed setuptools (no isolated environment)."""
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
             str(out), str(src)]  # fmt: skip
    subprocess.run(wheel, check=True, capture_output=True, text=True, timeout=300)
    sdist = [sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(out)!r})"]
    subprocess.run(sdist, cwd=src, check=True, capture_output=True, text=True, timeout=300)


def _copy_checkout(dst: Path) -> Path:
    dst.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dst / name)
    shutil.copytree(ROOT / "pml_suprank", dst / "pml_suprank", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


@pytest.mark.slow
def test_wheel_and_sdist_hold_the_recipes_hub_configs_and_license(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"pyproject's license-files needs setuptools >= 77; installed {setuptools.__version__}")
    check = _checker()
    src = _copy_checkout(tmp_path / "src")
    _build(src, tmp_path / "dist")
    assert check.main([str(tmp_path / "dist"), str(ROOT)]) == 0
    expected = check.expected_files(ROOT)
    assert {f"pml_suprank/recipes/{m}.py" for m in check.SCRIPTS.values()} <= expected
    configs = {f"pml_suprank/hub_configs/{p.name}" for p in (ROOT / "pml_suprank" / "hub_configs").glob("*.yaml")}
    assert len(configs) >= 17 and configs <= expected

    # the same build without the package-data entry ships no hub_config: the check says so
    pyproject = src / "pyproject.toml"
    text = pyproject.read_text()
    assert 'pml_suprank = ["hub_configs/*.yaml"]' in text
    pyproject.write_text(text.replace('pml_suprank = ["hub_configs/*.yaml"]', ""))
    shutil.rmtree(src / "build", ignore_errors=True)
    for info in src.glob("*.egg-info"):
        shutil.rmtree(info)
    _build(src, tmp_path / "bare")
    wheel = next((tmp_path / "bare").glob("*.whl"))
    problems = check.check_wheel(wheel, ROOT)
    assert "wheel lacks pml_suprank/hub_configs/happier_sop.yaml" in problems
    assert not [p for p in problems if "recipes" in p or "LICENSE" in p]
