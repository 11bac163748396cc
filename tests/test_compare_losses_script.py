"""Tests of benchmarks/compare_losses.py on a tiny generated archive in the Omniglot layout (no real data): the
alphabet split, one run per library, grid selection on the validation alphabets, the table and the command line."""

from __future__ import annotations

import importlib.util
import io
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_losses.py"
ALPHABETS = ("Alpha", "Beta", "Gamma", "Delta", "Eps", "Zeta")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("compare_losses", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _png(seed: int) -> bytes:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = (255 * (torch.rand(105, 105, generator=g) > 0.2)).to(torch.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels.numpy(), mode="L").save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """6 alphabets × 4 characters × 4 drawers."""
    root = tmp_path_factory.mktemp("omniglot_small")
    with zipfile.ZipFile(root / "images_background_small1.zip", "w") as z:
        for a, alphabet in enumerate(ALPHABETS):
            for c in range(4):
                for d in range(4):
                    name = f"images_background_small1/{alphabet}/character{c + 1:02d}/{c:04d}_{d + 1:02d}.png"
                    z.writestr(name, _png(1000 * a + 10 * c + d))
    return root


@pytest.fixture(scope="module")
def protocol(bench):
    return replace(bench.Protocol(), image_size=16, embedding_size=8, batch_size=16, super_classes_per_batch=2)


def test_alphabets_are_held_out_whole(bench, root, protocol):
    splits = bench.load_alphabet_splits(root, protocol, split_sizes=(2, 2, 2))
    sizes = {k: (len(v[0]), int(v[1][:, 0].max()) + 1, int(v[1][:, 1].max()) + 1) for k, v in splits.items()}
    assert sizes == {"train": (32, 8, 2), "val": (32, 8, 2), "test": (32, 8, 2), "train+val": (64, 16, 4)}
    # no image is in two of train / val / test
    flat = {k: {tuple(x.flatten().tolist()[:40]) for x in v[0]} for k, v in splits.items() if k != "train+val"}
    assert not (flat["train"] & flat["val"]) and not (flat["val"] & flat["test"]) and not (flat["train"] & flat["test"])
    with pytest.raises(ValueError, match="split_sizes must add up to the 6 alphabets"):
        bench.load_alphabet_splits(root, protocol, split_sizes=(3, 2, 3))


@pytest.mark.slow
def test_selection_runs_and_table(bench, root, protocol):
    splits = bench.load_alphabet_splits(root, protocol, split_sizes=(2, 2, 2))
    logged = []
    chosen = {
        name: bench.select(name, splits, 2, protocol, "h_ap", logged.append) for name in ("happier", "pml_contrastive")
    }
    assert len(logged) == 8 and len(chosen["happier"]["grid"]) == 4  # 2 values x 2 learning rates each
    best = max(chosen["happier"]["grid"], key=lambda r: (r["h_ap"], r["ap_level0"]))
    assert (chosen["happier"]["value"], chosen["happier"]["lr"]) == (best["decomposability_weight"], best["lr"])
    records = [
        bench.one_run(
            name, chosen[name]["value"], chosen[name]["lr"], seed, 2, splits["train+val"], splits["test"], protocol
        )  # fmt: skip
        for name in chosen
        for seed in (0, 1)
    ]
    for rec in records:
        assert all(0.0 <= rec[k] <= 1.0 for k, _ in bench.METRICS) and rec["ms_per_step"] > 0
    table = bench.markdown_table(bench.summarize(records), chosen)
    assert table.count("\n") == 3 and "| happier | pml-suprank |" in table and "| pml_contrastive | PML |" in table


def test_command_line_is_checked(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--losses", "no_such_loss"])
    assert bench.parse_args(["--losses", "happier"]).losses == ["happier"]
