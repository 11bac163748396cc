"""Tests of benchmarks/real_hierarchical_retrieval.py on a tiny generated archive in the Omniglot layout (no real
data): decoding, the training loop of every loss, the table, the JSON output and the command line."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm")
pytest.importorskip("pytorch_metric_learning")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "real_hierarchical_retrieval.py"


@pytest.fixture(scope="module")
def bench():
    import pml_suprank.training  # noqa: F401  (one-time import cost, seconds on a busy CPU: not the tests' own)

    spec = importlib.util.spec_from_file_location("real_hierarchical_retrieval", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _png(seed: int) -> bytes:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = (255 * (torch.rand(105, 105, generator=g) > 0.2)).to(torch.uint8)  # white paper, dark ink
    buf = io.BytesIO()
    Image.fromarray(pixels.numpy(), mode="L").save(buf, format="PNG")
    return buf.getvalue()


def _archive(root: Path, characters: int, drawers: int) -> Path:
    """``images_background_small1.zip`` with 2 alphabets of ``characters`` characters × ``drawers`` images."""
    root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(root / "images_background_small1.zip", "w") as z:
        for a, alphabet in enumerate(("Alpha", "Beta")):
            for c in range(characters):
                for d in range(drawers):
                    name = f"images_background_small1/{alphabet}/character{c + 1:02d}/{c:04d}_{d + 1:02d}.png"
                    z.writestr(name, _png(1000 * a + 10 * c + d))
    return root


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    return _archive(tmp_path_factory.mktemp("omniglot_small"), characters=4, drawers=4)


def test_load_split_decodes_and_relabels(bench, small_root):
    images, labels = bench.load_split(small_root, "train", 16)
    assert images.shape == (16, 1, 16, 16) and images.dtype == torch.float32
    assert 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    assert float(images.mean()) < 0.5  # ink = 1 on a white page: mostly background
    # 2 of the 4 characters of each alphabet in the training half, relabelled 0..C-1 per level
    assert sorted(labels[:, 0].unique().tolist()) == [0, 1, 2, 3]
    assert sorted(labels[:, 1].unique().tolist()) == [0, 1]
    for c in range(4):  # a tree: every character in one alphabet
        assert labels[labels[:, 0] == c, 1].unique().numel() == 1
    test_images, test_labels = bench.load_split(small_root, "test", 16)
    assert test_images.shape == (16, 1, 16, 16) and test_labels.shape == (16, 2)


def test_random_shift_translates_each_image(bench):
    grey = torch.zeros(3, 1, 8, 8)
    grey[:, :, 4, 4] = 1.0
    out = bench.random_shift(grey, 2, torch.Generator().manual_seed(0))
    assert out.shape == grey.shape
    assert torch.all(out.sum((1, 2, 3)) == 1.0)  # the ink stays inside (shift <= 2 < border)
    assert bench.random_shift(grey, 0, torch.Generator()) is grey


def _tiny_run(bench, root):
    protocol = bench.Protocol(image_size=16, embedding_size=8, batch_size=8, samples_per_class=2, eval_batch_size=8)
    return protocol, bench.load_split(root, "train", 16), bench.load_split(root, "test", 16)


def test_one_loss_is_reproducible(bench, small_root):
    protocol, train, test = _tiny_run(bench, small_root)
    first = bench.run_benchmark(train, test, ["happier"], [0], 1, protocol, log=lambda _: None)
    again = bench.run_benchmark(train, test, ["happier"], [0], 1, protocol, log=lambda _: None)
    assert [r["loss"] for r in first] == ["untrained", "happier"]
    assert first[1]["h_ap"] == again[1]["h_ap"] and first[1]["final_train_loss"] == again[1]["final_train_loss"]
    other = bench.run_benchmark(train, test, ["happier"], [1], 1, protocol, log=lambda _: None)
    assert other[1]["final_train_loss"] != first[1]["final_train_loss"]  # the seed changes init and batches


@pytest.mark.slow
def test_every_loss_trains_and_evaluates(bench, small_root):
    protocol, train, test = _tiny_run(bench, small_root)
    logged = []
    records = bench.run_benchmark(train, test, list(bench.LOSSES), [0], 2, protocol, log=logged.append)
    assert [r["loss"] for r in records] == ["untrained", *bench.LOSSES]
    assert len(logged) == len(bench.LOSSES)
    for r in records:
        for key, _ in bench.METRICS:
            assert 0.0 <= r[key] <= 1.0, (r["loss"], key, r[key])
        if r["loss"] != "untrained":
            assert r["steps"] == 2 and torch.isfinite(torch.tensor(r["final_train_loss"]))


def test_unknown_loss_is_a_value_error(bench, small_root):
    data = (torch.zeros(4, 1, 16, 16), torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="losses must be among"):
        bench.run_benchmark(data, data, ["nope"], [0], 1)


def test_summary_and_table(bench):
    base = {key: 0.5 for key, _ in bench.METRICS}
    records = [
        {"loss": "a", "seed": 0, "wall_s": 1.0, **base},
        {"loss": "a", "seed": 1, "wall_s": 3.0, **{**base, "h_ap": 0.7}},
        {"loss": "b", "seed": 0, "wall_s": 2.0, **base},
    ]
    summary = bench.summarize(records)
    mean, std = summary["a"]["h_ap"]
    assert mean == pytest.approx(0.6) and std == pytest.approx(0.1414213, rel=1e-5)
    assert summary["b"]["h_ap"] == (0.5, 0.0) and summary["a"]["wall_s"][0] == 2.0
    table = bench.markdown_table(summary).splitlines()
    assert table[0].startswith("| loss | fine AP | coarse AP | H-AP | NDCG | ASI | R@1 |")
    assert "60.00 ± 14.14" in table[2] and table[3].startswith("| b | 50.00 ± 0.00")


def test_command_line_defaults_and_errors(bench, capsys):
    args = bench.parse_args([])
    assert args.seeds == [0, 1, 2] and args.threads == 1 and args.losses == list(bench.LOSSES)
    assert Path(args.data_root) == SCRIPT.parents[2] / "shared" / "data" / "omniglot_small"
    for flag in ("--steps", "--threads"):
        with pytest.raises(SystemExit):
            bench.parse_args([flag, "0"])
        assert flag in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--losses", "nope"])


@pytest.mark.slow
def test_main_writes_results(bench, tmp_path, capsys):
    root = _archive(tmp_path / "data", characters=16, drawers=4)  # 8 training characters per alphabet: a full batch
    out = tmp_path / "out"
    bench.main(["--data_root", str(root), "--seeds", "0", "1", "--steps", "2", "--losses", "happier",
                "pml_smooth_ap", "--output_dir", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "| happier |" in printed and "| pml_smooth_ap |" in printed and "| untrained |" in printed
    result = json.loads((out / "results.json").read_text())
    assert len(result["records"]) == 6 and result["args"]["steps"] == 2
    assert set(result["summary"]) == {"untrained", "happier", "pml_smooth_ap"}
    assert result["protocol"]["backbone"] == "test_resnet" and result["table"] in printed
