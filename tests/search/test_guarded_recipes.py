"""A retrieval model that abstains: ``fit_heat --model`` stores its OOD guard (a flat folder of OOD images works),
``ood_score`` writes one verdict per image, ``search`` adds the verdict to results.json and the page; names from
files reach the terminal without control characters and the page escaped."""

from __future__ import annotations

import csv
import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("timm")

from pml_suprank.models import RetrievalModel  # noqa: E402
from pml_suprank.ood.guard import GUARD_KEYS, OODGuard, weights_sha256  # noqa: E402

EVIL = "e\x1b]0;owned\x07vil.png"  # sets the terminal's window title when printed raw


def _png(path: Path, colour, rng, noise: float = 60.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.zeros((64, 64, 3)) + np.asarray(colour) + rng.random((64, 64, 3)) * noise
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny model folder, an ID folder (3 colour classes, train / test splits with metadata.csv), a flat folder of
    noise images (no class folders) and ``fit_heat --model`` run on them."""
    root = tmp_path_factory.mktemp("guarded")
    rng = np.random.default_rng(0)
    colours = [(180, 0, 0), (0, 180, 0), (0, 0, 180)]
    for split, n in (("train", 24), ("test", 16)):
        rows = ["file_name,label"]
        for i in range(n):
            _png(root / "id" / split / f"{i}.png", colours[i % 3], rng)
            rows.append(f"{i}.png,{i % 3}")
        (root / "id" / split / "metadata.csv").write_text("\n".join(rows) + "\n")
    for i in range(10):
        Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(_mk(root / "flat") / f"n{i}.png")
    torch.manual_seed(0)
    RetrievalModel("test_resnet", embedding_size=8, image_size=64).save_pretrained(root / "final")
    fit_heat = importlib.import_module("pml_suprank.recipes.fit_heat")
    argv = ["--model", str(root / "final"), "--id_dataset", str(root / "id"), "--label_column", "label",
            "--ood_datasets", str(root / "flat"), "noise-uniform", "--num_noise", "10", "--detectors", "HEAT",
            "Mahalanobis", "--guard", "Mahalanobis", "--ood_tpr", "0.9", "--train_epochs", "1", "--heat_epochs", "1",
            "--no_plots", "--threads", "1", "--progress", "false", "--cache_dir", str(root / "cache"),
            "--output_dir", str(root / "fit")]  # fmt: skip
    with torch.random.fork_rng():
        results = fit_heat.main(argv)
    return root, results


def _mk(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_fit_heat_stores_the_guard_in_the_model_folder(world):
    root, results = world
    data = json.loads((root / "final" / "ood" / "guard.json").read_text())
    assert set(data) == {"version", *GUARD_KEYS}
    assert data["detector"] == "Mahalanobis" and data["tpr_target"] == 0.9
    assert data["model_sha256"] == weights_sha256(root / "final")
    assert set(data["ood_sets"]) == {"flat", "noise-uniform"}  # a local folder by its name, never its path
    assert results["ood_guard"] == str(root / "final" / "ood")
    assert set(results["table"]["HEAT"]) == {str(root / "flat"), "noise-uniform", "average"}  # the flat folder
    for file in (root / "final" / "ood").iterdir():
        assert str(root) not in file.read_bytes().decode("latin-1"), file  # no local path in the guard's files
    model = RetrievalModel.from_pretrained(root / "final")
    assert isinstance(model.ood_guard, OODGuard) and model.ood_guard.detector_name == "Mahalanobis"


def test_fit_heat_guard_option_is_checked(capsys):
    fit_heat = importlib.import_module("pml_suprank.recipes.fit_heat")
    with pytest.raises(SystemExit):
        fit_heat.parse_args(["--model", "run/final", "--guard", "ODIN"])  # the guard is stored with --model only
    assert "--guard: 'ODIN'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit_heat.parse_args(["--model", "run/final", "--ood_tpr", "1.5"])
    assert "--ood_tpr must be a number in (0, 1]" in capsys.readouterr().err
    assert fit_heat.parse_args(["--model", "run/final", "--guard", "none"]).guard == "none"


def test_fit_heat_refuses_guard_options_without_model(tmp_path, capsys):
    """``--guard`` / ``--ood_tpr`` (a flag or a config file's) choose the guard stored in ``--model``: without it the
    whole job ran and ignored them."""
    fit_heat = importlib.import_module("pml_suprank.recipes.fit_heat")
    config = tmp_path / "guard.yaml"
    config.write_text("recipe:\n  guard: KNN\n")
    for argv, named in ((["--guard", "KNN"], "--guard"), (["--guard", "KNN", "--ood_tpr", "0.9"], "--guard and "
                        "--ood_tpr"), (["--config", str(config)], f"{config}: recipe.guard")):  # fmt: skip
        with pytest.raises(SystemExit) as raised:
            fit_heat.parse_args(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert raised.value.code == 2 and f"error: {named} given without --model: " in err, err
        assert "give --model RUN/final, or leave them out" in err
    assert fit_heat.parse_args([]).guard == "HEAT"  # the default alone is no refusal


def test_ood_score_flat_nested_and_single_file(world, tmp_path, capsys):
    root, _ = world
    recipe = importlib.import_module("pml_suprank.recipes.ood_score")
    result = recipe.main(["--model", str(root / "final"), "--images", str(root / "flat"), "--output_dir",
                          str(tmp_path / "a"), "--device", "cpu"])  # fmt: skip
    rows = list(csv.DictReader((tmp_path / "a" / "scores.csv").open()))
    assert [r["file"] for r in rows] == [f"n{i}.png" for i in range(10)]
    threshold = result["threshold"]
    assert all((r["is_ood"] == "true") == (float(r["score"]) > threshold) for r in rows)  # the one rule
    assert sum(r["is_ood"] == "true" for r in rows) == result["num_ood"] >= 8  # noise is rejected
    assert (tmp_path / "a" / "score_histogram.png").stat().st_size > 0
    recipe.main(["--model", str(root / "final"), "--images", str(root / "id"), "--output_dir", str(tmp_path / "b")])
    rows = list(csv.DictReader((tmp_path / "b" / "scores.csv").open()))
    assert len(rows) == 40 and rows[0]["file"] == "test/0.png"  # nested: relative names
    assert sum(r["is_ood"] == "false" for r in rows) >= 30  # most ID images are kept
    recipe.main(["--model", str(root / "final"), "--images", str(root / "flat" / "n3.png"), "--output_dir",
                 str(tmp_path / "c"), "--ood_threshold=-1e30", "--no_plots", "true"])  # fmt: skip
    rows = list(csv.DictReader((tmp_path / "c" / "scores.csv").open()))
    assert rows == [{"file": "n3.png", "score": rows[0]["score"], "is_ood": "true"}]
    capsys.readouterr()


@pytest.mark.parametrize("case", ["empty", "unreadable", "no_guard", "missing_model", "output_is_file"])
def test_ood_score_errors_are_one_line(world, tmp_path, capsys, case):
    root, _ = world
    recipe = importlib.import_module("pml_suprank.recipes.ood_score")
    model, images, out = str(root / "final"), str(root / "flat"), str(tmp_path / "out")
    if case == "empty":
        images = str(_mk(tmp_path / "empty"))
    elif case == "unreadable":
        (_mk(tmp_path / "bad") / "x.png").write_text("not an image")
        images = str(tmp_path / "bad")
    elif case == "no_guard":
        model = str(tmp_path / "plain")
        RetrievalModel("test_resnet", embedding_size=8, image_size=64).save_pretrained(model)
    elif case == "missing_model":
        model = str(tmp_path / "nothing")
    else:
        Path(out).write_text("x")
    with pytest.raises(SystemExit) as raised:
        recipe.main(["--model", model, "--images", images, "--output_dir", out])
    err = capsys.readouterr().err.strip()
    assert raised.value.code == 2 and len(err.splitlines()) == 1 and "error: " in err, err
    assert case == "output_is_file" or not Path(out).exists()  # refused before the output folder is made


@pytest.mark.slow
def test_search_with_a_guard_gives_every_query_a_verdict(world, tmp_path, capsys):
    root, _ = world
    queries = _mk(tmp_path / "q")
    shutil.copy(root / "flat" / "n0.png", queries / "noise.png")
    shutil.copy(root / "id" / "test" / "0.png", queries / "<b>red<i>.png")
    shutil.copy(root / "id" / "test" / "1.png", queries / EVIL)
    recipe = importlib.import_module("pml_suprank.recipes.search")
    argv = ["--model", str(root / "final"), "--gallery", str(root / "id"), "--label_columns", "label",
            "--gallery_split", "train", "--queries", str(queries), "--k", "3", "--device", "cpu"]  # fmt: skip
    result = recipe.main([*argv, "--output_dir", str(tmp_path / "s")])
    printed = capsys.readouterr().out
    guard = RetrievalModel.from_pretrained(root / "final").ood_guard
    by_name = {q["name"]: q for q in result["queries"]}
    for q in result["queries"]:
        assert set(q["ood"]) == {"score", "is_ood"} and q["ood"]["is_ood"] == (q["ood"]["score"] > guard.threshold)
    assert by_name["noise.png"]["ood"]["is_ood"] is True
    assert result["ood_guard"]["threshold"] == guard.threshold and result["ood_guard"]["higher_is_ood"] is True
    saved = json.loads((tmp_path / "s" / "results.json").read_text())
    assert [q["ood"] for q in saved["queries"]] == [q["ood"] for q in result["queries"]]
    page = (tmp_path / "s" / "results.html").read_text()
    assert page.count('class="verdict ood"') == sum(q["ood"]["is_ood"] for q in result["queries"]) >= 1
    assert "OOD: unknown kind" in page and "<b>red<i>" not in page and "&lt;b&gt;red&lt;i&gt;" in page
    assert "\x1b" not in printed and "\x07" not in printed and "evil.png" in printed  # name kept, escapes gone
    assert "OOD guard Mahalanobis" in printed
    # --ood_threshold overrides the stored threshold
    result = recipe.main([*argv, "--output_dir", str(tmp_path / "s2"), "--ood_threshold=-1e30"])
    assert all(q["ood"]["is_ood"] for q in result["queries"])
    assert result["ood_guard"]["threshold_source"] == "--ood_threshold"


def test_search_without_a_guard_says_so_once(world, tmp_path, capsys):
    root, _ = world
    plain = tmp_path / "plain"
    RetrievalModel("test_resnet", embedding_size=8, image_size=64).save_pretrained(plain)
    recipe = importlib.import_module("pml_suprank.recipes.search")
    result = recipe.main(["--model", str(plain), "--gallery", str(root / "flat"), "--k", "2", "--num_queries", "3",
                          "--output_dir", str(tmp_path / "s"), "--device", "cpu"])  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("no OOD guard") == 1 and result["ood_guard"] is None
    assert all(q["ood"] is None for q in result["queries"])
    page = (tmp_path / "s" / "results.html").read_text()
    assert page.count("No OOD guard") == 1 and 'class="verdict' not in page
    with pytest.raises(SystemExit) as raised:
        recipe.main(["--model", str(plain), "--gallery", str(root / "flat"), "--ood_threshold", "1",
                     "--output_dir", str(tmp_path / "s3")])  # fmt: skip
    assert raised.value.code == 2 and "--ood_threshold: the model" in capsys.readouterr().err


def test_search_folder_gallery_without_split_and_bad_inputs(world, tmp_path, capsys):
    root, _ = world
    gallery = tmp_path / "classes"
    for name in ("a", "b"):
        for i in range(2):
            _mk(gallery / name)
            shutil.copy(root / "flat" / f"n{i}.png", gallery / name / f"{name}{i}.png")
    recipe = importlib.import_module("pml_suprank.recipes.search")
    result = recipe.main(["--model", str(root / "final"), "--gallery", str(gallery), "--label_columns", "label",
                          "--k", "1", "--num_queries", "2", "--output_dir", str(tmp_path / "s")])  # fmt: skip
    assert result["gallery"]["split"] == "train" and result["gallery"]["size"] == 4  # no --gallery_split needed
    capsys.readouterr()
    (tmp_path / "file").write_text("x")
    for extra in (["--output_dir", str(tmp_path / "file")], ["--queries", str(_mk(tmp_path / "none")),
                                                              "--output_dir", str(tmp_path / "o")]):  # fmt: skip
        with pytest.raises(SystemExit) as raised:
            recipe.main(["--model", str(root / "final"), "--gallery", str(root / "flat"), *extra])
        err = capsys.readouterr().err.strip()
        assert raised.value.code == 2 and len(err.splitlines()) == 1 and "error: " in err, err
