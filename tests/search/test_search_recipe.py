"""recipes/search.py end to end: on a model trained for two steps by recipes/train_happier.py (the main job, tiny
settings) and on a freshly saved tiny model; results.json, the HTML page (parsed, and rendered in headless Chromium
where /usr/bin/chromium exists), the PNG grid, image-folder queries, the saved index."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _html_checks import parse_report
from PIL import Image

pytest.importorskip("timm")
pytest.importorskip("accelerate")

from pml_suprank.plots import RELEVANCE_COLOURS, relevance_level  # noqa: E402
from pml_suprank.search import RetrievalIndex  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
CHROMIUM = Path("/usr/bin/chromium")
TRAIN_TINY = [
    "--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "8", "--embedding_size", "16",
    "--batch_size", "32", "--eval_batch_size", "64", "--with_tracking", "false", "--cpu", "--no_plots",
]  # fmt: skip


def _env():
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the tests
    env.update({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _run(args):
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _search(model_dir, out, *extra):
    return _run([RECIPES / "search.py", "--model", model_dir, "--gallery", "synthetic", "--num_per_class", "3",
                 "--output_dir", out, "--device", "cpu", *extra])  # fmt: skip


@pytest.fixture(scope="module")
def untrained_model(tmp_path_factory):
    from pml_suprank.models import RetrievalModel

    folder = tmp_path_factory.mktemp("untrained") / "model"
    torch.manual_seed(0)
    RetrievalModel("test_resnet", embedding_size=16, image_size=16).save_pretrained(folder)
    return folder


def check_outputs(out: Path, num_queries: int, k: int, labelled: bool = True) -> dict:
    """results.json, results.html and results_grid.png agree with each other and with the relevance rule."""
    results = json.loads((out / "results.json").read_text())
    assert results["k"] == k and len(results["queries"]) == num_queries
    page = parse_report((out / "results.html").read_text())
    assert len(page["queries"]) == num_queries and page["external_refs"] == []
    assert all(src.startswith("data:image/png;base64,") for src in page["images"])
    assert len(page["images"]) == num_queries * (k + 1)
    for record, parsed in zip(results["queries"], page["queries"], strict=True):
        items = record["results"]
        assert [r["rank"] for r in items] == list(range(1, k + 1))
        scores = [r["score"] for r in items]
        assert scores == sorted(scores, reverse=True)
        for r in items:
            assert r["relevance"] == relevance_level(record["labels"], r["labels"])
            assert (r["relevance"] != "unknown") == labelled
        assert [(p["rank"], p["index"], p["relevance"]) for p in parsed["results"]] == [
            (r["rank"], r["index"], r["relevance"]) for r in items
        ]
        assert [p["score"] for p in parsed["results"]] == pytest.approx(scores, abs=1e-6)
    with Image.open(out / "results_grid.png") as img:
        assert img.width > 300 and img.height > 100 * min(num_queries, 2)
    return results


def render_in_chromium(html: Path, shot: Path) -> np.ndarray:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           f"--screenshot={shot}", "--window-size=1100,900", html.resolve().as_uri()]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=_env())
    assert shot.is_file(), f"chromium wrote no screenshot:\n{proc.stdout}\n{proc.stderr}"
    with Image.open(shot) as img:
        return np.asarray(img.convert("RGB"))


def _has_colour(pixels: np.ndarray, hex_colour: str, min_pixels: int = 50) -> bool:
    target = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels.astype(int) - target).sum(-1) < 12).sum()) >= min_pixels


# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_search(tmp_path_factory):
    """recipes/train_happier.py for two steps (tiny settings), then recipes/search.py on its final model."""
    tmp = tmp_path_factory.mktemp("trained")
    train = tmp / "train"
    _run([RECIPES / "train_happier.py", *TRAIN_TINY, "--output_dir", train, "--max_train_steps", "2"])
    assert (train / "final" / "model.safetensors").is_file()
    out = tmp / "search"
    proc = _search(train / "final", out, "--k", "5", "--num_queries", "4", "--save_index")
    return out, proc


@pytest.mark.slow
def test_recipe_on_a_model_trained_by_the_main_job(trained_search):
    out, proc = trained_search
    assert "4 queries, top 5" in proc.stdout
    results = check_outputs(out, 4, 5)
    # every query is a gallery item, left out of its own results
    for record in results["queries"]:
        own = int(record["name"].rsplit("[", 1)[1].rstrip("]"))
        assert own not in [r["index"] for r in record["results"]]
    index = RetrievalIndex.load(out / "index")
    assert len(index) == results["gallery"]["size"] == 18 * 3 and index.labels.shape == (54, 2)


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium (/usr/bin/chromium) is not installed")
def test_page_renders_in_headless_chromium(trained_search, tmp_path):
    out, _ = trained_search
    results = json.loads((out / "results.json").read_text())
    pixels = render_in_chromium(out / "results.html", tmp_path / "shot.png")
    levels = {r["relevance"] for q in results["queries"] for r in q["results"]}
    for level in levels:  # each relevance level present in the results is drawn as its border colour
        assert _has_colour(pixels, RELEVANCE_COLOURS[level]), level
    assert _has_colour(pixels, "#1f77b4")  # query borders
    assert pixels.std() > 10  # not a blank page


@pytest.mark.slow
def test_recipe_in_process_with_folder_queries(untrained_model, tmp_path, capsys):
    recipe = importlib.import_module("pml_suprank.recipes.search")
    folder = tmp_path / "queries" / "nested"
    folder.mkdir(parents=True)
    for i, colour in enumerate([(255, 0, 0), (0, 200, 0), (30, 30, 220)]):
        Image.new("RGB", (20, 20), colour).save(folder / f"img{i}.png")
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    argv = ["--model", str(untrained_model), "--gallery", "synthetic", "--num_per_class", "2", "--queries",
            str(tmp_path / "queries"), "--k", "3", "--output_dir", str(out), "--device", "cpu"]  # fmt: skip
    result = recipe.main(argv)
    check_outputs(out, 3, 3, labelled=False)
    assert [q["name"] for q in result["queries"]] == ["nested/img0.png", "nested/img1.png", "nested/img2.png"]
    assert result["relevance_counts"]["unknown"] == 9
    # default queries (drawn from the gallery), the exact backend's results equal the saved index's
    out2 = tmp_path / "out2"
    result = recipe.main(argv[:6] + ["--k", "4", "--num_queries", "3", "--output_dir", str(out2), "--save_index"])
    check_outputs(out2, 3, 4)
    index = RetrievalIndex.load(out2 / "index")
    for record in result["queries"]:
        own = int(record["name"].rsplit("[", 1)[1].rstrip("]"))
        _, indices = index.search(index.embeddings[own : own + 1], 5)
        assert [r["index"] for r in record["results"]] == [j for j in indices[0].tolist() if j != own][:4]
    with pytest.raises(SystemExit) as raised:
        recipe.main(argv[:2] + ["--gallery", "some/dataset", "--output_dir", str(out)])
    assert raised.value.code == 2 and "error: --label_columns is required" in capsys.readouterr().err


def test_label_columns_are_spelled_as_in_every_recipe(capsys):
    """``--label_columns fine coarse`` (space-separated, finest first) in search, evaluate and training alike; a
    bounded option refused with the flag named."""
    from _helpers import import_recipe

    search, evaluate = import_recipe("search"), import_recipe("evaluate")
    argv = ["--model", "m", "--output_dir", "o", "--gallery", "g", "--label_columns", "fine", "coarse"]
    assert search.parse_args(argv).label_columns == ["fine", "coarse"]
    spec = evaluate.parse_args(["--model", "m", "--label_columns", "fine", "coarse"])
    assert spec.label_columns == ["fine", "coarse"]
    with pytest.raises(SystemExit) as raised:
        search.parse_args(["--model", "m", "--output_dir", "o", "--k", "0"])
    assert raised.value.code == 2 and "--k must be an int in [1, 100000]; got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        search.parse_args(["--model", "m"])
    assert "--output_dir is required" in capsys.readouterr().err


def test_an_image_folder_gallery_is_shown_by_file_and_class_names(untrained_model, tmp_path, capsys):
    recipe = importlib.import_module("pml_suprank.recipes.search")
    gallery = tmp_path / "photos"
    for name, colour in [("cat", (220, 40, 40)), ("dog", (40, 200, 40))]:
        (gallery / "train" / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (18, 18), tuple(max(0, x - 30 * i) for x in colour)).save(
                gallery / "train" / name / f"{name}{i}.png"
            )
    out = tmp_path / "out"
    result = recipe.main(["--model", str(untrained_model), "--gallery", str(gallery), "--gallery_split", "train",
                          "--label_columns", "label", "--k", "2", "--num_queries", "4", "--output_dir", str(out),
                          "--device", "cpu", "--save_index"])  # fmt: skip
    names = {q["name"] for q in result["queries"]} | {r["name"] for q in result["queries"] for r in q["results"]}
    assert names and all(re_name.startswith(("train/cat/", "train/dog/")) for re_name in names), names
    for q in result["queries"]:
        assert q["class_name"] == q["name"].split("/")[1]
        assert all(r["class_name"] == r["name"].split("/")[1] for r in q["results"])
    page = parse_report((out / "results.html").read_text())
    assert "photos train (6 images), top 2" in page["title"] and str(tmp_path) not in page["title"]
    assert all("hits" in q["summary"] for q in page["queries"])
    table = capsys.readouterr().out
    assert "same class / 2" in table and "train/cat/" in table
    ids = RetrievalIndex.load(out / "index").ids  # saved with the index: the file of every gallery image
    assert sorted(ids) == sorted(f"train/{c}/{c}{i}.png" for c in ("cat", "dog") for i in range(3))
