"""recipes/prepare_dataset.py round trip: native archive → datasets copy → load_retrieval_dataset → same labels and
pixels, for every benchmark name."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _benchmark_fixtures import MAKERS, make_sop

from pml_suprank.data import load_retrieval_dataset
from pml_suprank.data.benchmarks import BENCHMARKS, benchmark_label_names, load_benchmark

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"


def _import_prepare():
    return importlib.import_module("pml_suprank.recipes.prepare_dataset")


def _round_trip(name: str, tmp_path: Path) -> None:
    prepare = _import_prepare()
    root = MAKERS[name](tmp_path / "native")
    out = tmp_path / "copy"
    copy = prepare.main([name, "--root", str(root), "--output_dir", str(out)])
    splits = BENCHMARKS[name].splits
    assert sorted(copy) == sorted(splits)
    info = json.loads((out / "benchmark.json").read_text())
    assert info == {"benchmark": name, "label_columns": {s: list(benchmark_label_names(name, s)) for s in splits}}
    assert not list(out.glob(".prepare_cache_*"))
    for split in splits:
        native = load_benchmark(name, root, split)
        loaded = load_retrieval_dataset(str(out), list(native.label_names), split)
        assert torch.equal(loaded.labels, native.labels), (name, split)
        assert loaded.label_names == native.label_names
        for i in (0, len(native) - 1):
            assert torch.equal(loaded[i]["image"], native[i]["image"]), (name, split, i)
        assert copy[split]["file_name"] == native.names


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
@pytest.mark.slow
def test_prepare_dataset_round_trip(name, tmp_path):
    _round_trip(name, tmp_path)


def test_prepare_dataset_selected_splits_and_errors(tmp_path, capsys):
    prepare = _import_prepare()
    root = make_sop(tmp_path / "native")
    copy = prepare.prepare("sop", root, tmp_path / "copy", ["test"])
    assert list(copy) == ["test"] and len(copy["test"]) == 4
    with pytest.raises(ValueError, match=r"splits \['val'\] are not splits of sop"):
        prepare.prepare("sop", root, tmp_path / "other", ["val"])
    with pytest.raises(ValueError, match=r"name must be one of"):
        prepare.prepare("imagenet", root, tmp_path / "other")
    refused = {
        "--push_to_hub needs --hub_model_id": ["--root", str(root), "--output_dir", str(tmp_path / "x"),
                                               "--push_to_hub", "true"],
        "--root '.*missing' is not a folder": ["--root", str(tmp_path / "missing"),
                                               "--output_dir", str(tmp_path / "x")],
        r"splits \['val'\] are not splits of sop": ["--root", str(root), "--output_dir", str(tmp_path / "x"),
                                                  "--splits", "val"],
        "--output_dir '.*file' is a file": ["--root", str(root), "--output_dir", str(tmp_path / "file")],
        r"Ebay_train\.txt: missing file": ["--root", str(tmp_path / "empty"), "--output_dir", str(tmp_path / "x")],
    }  # fmt: skip
    (tmp_path / "file").write_text("mine")
    (tmp_path / "empty").mkdir()
    for message, argv in refused.items():  # one error: line, exit 2, nothing written
        with pytest.raises(SystemExit) as exc:
            prepare.main(["sop", *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert len([line for line in err.splitlines() if "error:" in line]) == 1 and re.search(message, err), err
    assert not (tmp_path / "x").exists() and (tmp_path / "file").read_text() == "mine"


@pytest.mark.slow
def test_prepare_dataset_command_line(tmp_path):
    root = make_sop(tmp_path / "native")
    out = tmp_path / "copy"
    cmd = [sys.executable, str(RECIPES / "prepare_dataset.py"), "sop", "--root", str(root), "--output_dir", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "sop: wrote train (6 images), test (4 images)" in run.stdout
    assert torch.equal(
        load_retrieval_dataset(str(out), ["class_id", "super_class_id"], "test").labels[:, 0],
        torch.tensor([3, 3, 4, 4]),
    )


@pytest.mark.parametrize(
    "name, config", [("sop", "happier_sop"), ("cub", "roadmap_cub"), ("cifar100", "happier_cifar100"),
                     ("inat_full", "happier_inat_full"), ("inat_base", "happier_inat_base")],
)  # fmt: skip
def test_shipped_hub_configs_read_a_prepared_copy(name, config, tmp_path):
    """The label columns and open-set rules of the shipped configs fit the copy: only ``dataset`` changes."""
    import _hub_helpers

    from pml_suprank.training import hub_config

    root = MAKERS[name](tmp_path / "native")
    _import_prepare().prepare(name, root, tmp_path / "copy")
    cfg = hub_config.load_hub_config(ROOT / "pml_suprank" / "hub_configs" / f"{config}.yaml")
    cfg["data"]["dataset"] = str(tmp_path / "copy")
    spec = BENCHMARKS[name]
    for part, split in (("train", spec.train_split), ("test", spec.test_split)):
        built = _hub_helpers.build_dataset(cfg, part)
        assert torch.equal(built.labels, load_benchmark(name, root, split).labels), (name, part)
