"""The API reference as a reader meets it: one page per subpackage, cross-references that are links (no Sphinx role
left as text), and the role rewriting of docs/hooks/griffe_roles.py on hand-written docstrings."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("losses", "samplers", "memory", "collectives", "metrics", "relevance", "ranking", "models", "data",
               "training", "hub", "search", "ood")  # fmt: skip


@pytest.fixture(scope="module")
def roles():
    griffe = pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_roles", ROOT / "docs" / "hooks" / "griffe_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, griffe


@pytest.mark.slow
def test_roles_become_optional_links_inside_the_package_and_code_outside(roles):
    module, griffe = roles
    pkg = griffe.load("pml_suprank", search_paths=[str(ROOT)], resolve_aliases=False)
    obj = pkg["losses"]
    text = (":class:`~pml_suprank.losses.SupAPLoss` and :func:`pml_suprank.losses.register_loss`, "
            ":class:`torch.Tensor`, :meth:`~pml_suprank.losses.SupAPLoss.forward`, :class:`SupAPLoss`")  # fmt: skip
    out = module.rewrite(text, pkg, obj)
    assert '<autoref identifier="pml_suprank.losses.SupAPLoss" optional><code>SupAPLoss</code></autoref>' in out
    assert (
        '<autoref identifier="pml_suprank.losses.register_loss" optional>'
        "<code>pml_suprank.losses.register_loss</code></autoref>" in out
    )
    assert "`torch.Tensor`" in out  # outside the package: inline code
    assert out.count("<autoref") == 4  # the relative name resolved against the module too
    assert not re.search(r":(class|func|meth):`", out)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists(),
                    reason="mkdocs is not installed (pip install -e '.[dev]')")  # fmt: skip
def test_built_reference_has_a_page_per_subpackage_and_no_raw_roles(tmp_path):
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    subprocess.run([mkdocs, "build", "--strict", "-q", "--site-dir", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    links = 0
    for name in SUBPACKAGES:
        page = (tmp_path / "api" / name / "index.html").read_text()
        assert f'id="pml_suprank.{name}' in page, name
        assert not re.search(r":(class|func|meth|mod|attr|data|exc|obj):`", page), name
        assert len(page) < 400_000, (name, len(page))  # one subpackage a page, not the whole package
        links += page.count('class="autorefs autorefs-internal"')
    assert links > 100
    assert "_validation" not in (tmp_path / "api" / "losses" / "index.html").read_text()
