"""Your own images in one command (``recipes/train_happier.py --dataset FOLDER``): the three folder layouts (train/ +
test/ class folders, a metadata.csv of label levels, one folder of class folders split by class), the batch fitted to
a small training set or refused with values that work, the short-run warning, and the ``--report_to`` trackers
(TensorBoard events read back)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import import_recipe

pytest.importorskip("accelerate")
pytest.importorskip("timm")
pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

from pml_suprank.data import class_split, image_folder_layout  # noqa: E402
from pml_suprank.data.batch_fit import fit_batch, short_run_warning  # noqa: E402

TINY = [
    "--backbone", "test_resnet", "--image_size", "16", "--embedding_size", "16", "--eval_batch_size", "64",
    "--cpu", "--max_train_steps", "2", "--no_plots",
]  # fmt: skip
COLOURS = {"cat": (220, 40, 40), "dog": (40, 200, 40), "fox": (40, 40, 220), "owl": (200, 200, 40),
           "elk": (200, 40, 200), "yak": (40, 200, 200)}  # fmt: skip


def _png(path: Path, colour, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(colour)[None, None] + rng.integers(-30, 30, (12, 12, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)


def _class_folders(root: Path, classes, per_class: int, seed: int = 0) -> Path:
    for k, name in enumerate(classes):
        for i in range(per_class):
            _png(root / name / f"{i}.png", COLOURS[name], seed + 100 * k + i)
    return root


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def _split_folders(root: Path) -> Path:
    _class_folders(root / "train", ["cat", "dog", "fox"], 4)
    _class_folders(root / "test", ["owl", "elk", "yak"], 3, seed=7)
    return root


def _metadata_folder(root: Path) -> Path:
    rows = []
    for k, (name, family) in enumerate([("cat", 1), ("owl", 2), ("dog", 1), ("fox", 1), ("elk", 3), ("yak", 3)]):
        for i in range(3):
            _png(root / "images" / f"{name}{i}.png", COLOURS[name], 10 * k + i)
            rows.append([f"images/{name}{i}.png", name, family])
    with (root / "metadata.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["file_name", "species", "family"], *rows])
    return root


def _train(tmp_path, dataset, *extra, recipe="train_happier"):
    out = tmp_path / "run"
    summary = import_recipe(recipe).main([*TINY, "--dataset", str(dataset), "--output_dir", str(out), *extra])
    return out, summary


# ------------------------------------------------------------------------------------------------------------------
# layouts, class split, batch fit (no training)
# ------------------------------------------------------------------------------------------------------------------
def test_the_layout_of_a_folder_is_read_from_its_names_and_metadata_header(tmp_path):
    a = image_folder_layout(_split_folders(tmp_path / "a"))
    assert (a.kind, a.label_columns, a.splits, a.needs_class_split) == ("split_folders", ("label",), ("train", "test"),
                                                                        False)  # fmt: skip
    b = image_folder_layout(_metadata_folder(tmp_path / "b"))
    assert (b.kind, b.label_columns, b.needs_class_split) == ("metadata", ("species", "family"), True)
    for part in ("train", "test"):  # a metadata file per split folder
        _png(tmp_path / "bs" / part / "x.png", (0, 0, 0), 0)
        (tmp_path / "bs" / part / "metadata.csv").write_text("file_name,species,family\nx.png,cat,1\n")
    bs = image_folder_layout(tmp_path / "bs")
    assert (bs.kind, bs.label_columns, bs.splits) == ("metadata", ("species", "family"), ("train", "test"))
    c = image_folder_layout(_class_folders(tmp_path / "c", ["cat", "dog"], 1))
    assert (c.kind, c.label_columns, c.splits) == ("class_folders", ("label",), ("train",))
    assert "no split" in c.describe() and "species, family" in b.describe()
    assert image_folder_layout(tmp_path / "missing") is None
    _png(tmp_path / "loose" / "x.png", (0, 0, 0), 0)
    with pytest.raises(ValueError, match="outside a class folder and there is no metadata.csv"):
        image_folder_layout(tmp_path / "loose")
    (tmp_path / "bad").mkdir()
    _png(tmp_path / "bad" / "x.png", (0, 0, 0), 0)
    (tmp_path / "bad" / "metadata.csv").write_text("path,species\nx.png,cat\n")
    with pytest.raises(ValueError, match="no 'file_name' column"):
        image_folder_layout(tmp_path / "bad")


def test_the_class_split_is_seeded_disjoint_and_covers_every_class():
    labels = torch.arange(10).repeat_interleave(3)
    train, test = class_split(labels, seed=3)
    assert len(train) == len(test) == 5
    assert torch.equal(torch.sort(torch.cat([train, test])).values, torch.arange(10))
    again, _ = class_split(labels[:, None], seed=3)
    other = {tuple(class_split(labels, seed=s)[0].tolist()) for s in range(6)}
    assert torch.equal(train, again) and len(other) > 1
    assert class_split(torch.tensor([0, 1, 2]), seed=0)[0].numel() == 2  # at least one class on each side
    with pytest.raises(ValueError, match="at least 2 classes"):
        class_split(torch.zeros(4, dtype=torch.long), seed=0)


def test_the_batch_is_fitted_to_the_classes_and_images_of_the_data():
    six_of_three = torch.arange(6).repeat_interleave(3)
    fit = fit_batch(six_of_three, batch_size=64, samples_per_class=4)
    assert (fit.batch_size, fit.samples_per_class, fit.changed, fit.fits) == (18, 3, True, False)
    assert fit.describe_data() == "6 classes (3 images each)"
    roomy = fit_batch(torch.arange(40).repeat_interleave(8), batch_size=64, samples_per_class=4)
    assert (roomy.batch_size, roomy.samples_per_class, roomy.changed, roomy.fits) == (64, 4, False, True)
    two_procs = fit_batch(torch.arange(6).repeat_interleave(5), batch_size=32, samples_per_class=4, num_processes=2)
    assert (two_procs.batch_size, two_procs.samples_per_class) == (12, 4)  # 2 x 3 classes per step
    with pytest.raises(ValueError, match="at least 2 classes"):
        fit_batch(torch.zeros(5, dtype=torch.long), batch_size=8, samples_per_class=2)


def test_a_short_run_is_named_with_the_epochs_or_steps_that_reach_200():
    assert short_run_warning(18, 216, epochs=12, max_train_steps=None) is None
    line = short_run_warning(2, 24, epochs=12, max_train_steps=None)
    assert "only 24 optimizer steps" in line and "--epochs 100 would reach 200" in line and "\n" not in line
    capped = short_run_warning(50, 20, epochs=12, max_train_steps=20)
    assert capped.endswith("--max_train_steps 200 would reach 200")


def test_nested_folders_take_the_open_set_rule_per_group(tmp_path, hf_cache):
    from pml_suprank.data.source import data_option_errors, dataset_source

    folder = tmp_path / "scripts"
    for g, group in enumerate(["latin", "greek"]):
        for k, item in enumerate(["c1", "c2", "c3"]):
            for i in range(2):  # two images a class: a folder of single-image classes is refused
                _png(folder / group / item / f"{i}.png", COLOURS["cat"], 10 * g + k + 100 * i)
    section = {"dataset": str(folder), "open_set": True, "train_classes_per_coarse": 1}
    assert data_option_errors(section) == []  # the folder's two levels count as label columns
    train, test = (dataset_source(section, part).load() for part in ("train", "test"))
    assert sorted(train.class_names[int(c)] for c in train.labels[:, 0].unique()) == ["greek/c1", "latin/c1"]
    assert sorted(test.class_names[int(c)] for c in test.labels[:, 0].unique()) == [
        "greek/c2", "greek/c3", "latin/c2", "latin/c3"
    ]  # fmt: skip
    flat = _class_folders(tmp_path / "flat", ["cat", "dog"], 1)
    assert data_option_errors({**section, "dataset": str(flat)}) == [
        "'data.train_classes_per_coarse' needs at least two label_columns (fine and coarse)"
    ]


def test_empty_label_columns_are_a_folders_levels_and_refused_for_a_hub_dataset(tmp_path):
    """``label_columns: []`` with ``label_names``: a local folder's levels are recorded; a Hub id has none to infer,
    and the section is refused naming the key, what it must be and the value (it was a bare ``TypeError``)."""
    from pml_suprank.data.data_spec import data_spec
    from pml_suprank.data.source import data_option_errors, dataset_source

    hub = {"dataset": "org/products", "label_columns": []}
    assert data_option_errors(hub) == [
        "'data.label_columns' is required unless data.dataset is 'synthetic', a benchmark name or a local image "
        "folder (class folders or a metadata.csv)"
    ]
    refused = r"'data.label_columns' must be a non-empty list of column names.*'org/products'.*; got \[\]$"
    with pytest.raises(ValueError, match=refused):
        dataset_source(hub, "test")
    with pytest.raises(ValueError, match=refused):
        data_spec(hub, seed=0, k_values=[1], alpha=1.0, label_names=["fine_label"])
    with pytest.raises(ValueError, match=r"got \[3\]$"):
        dataset_source({"dataset": "org/products", "label_columns": [3]}, "train")
    one = dataset_source({"dataset": "org/products", "label_columns": "fine_label"}, "train")
    assert one.options["label_columns"] == ["fine_label"]  # one column by its name, not split into letters
    folder = {"dataset": str(_class_folders(tmp_path / "pets", ["cat", "dog"], 2)), "label_columns": []}
    assert data_option_errors(folder) == [] and dataset_source(folder, "test").options["label_columns"] == ["label"]
    spec = data_spec(folder, seed=3, k_values=[1], alpha=1.0, label_names=["label"])
    assert spec["data"] == {"dataset": "pets", "label_columns": ["label"]} and spec["local_dataset"] is True


# ------------------------------------------------------------------------------------------------------------------
# the one command on each layout
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_local_path_that_does_not_exist_is_refused_as_such(tmp_path, capsys):
    """A dataset that can only be a path (absolute, ``./``, ``~``, ``a/b/c``, ``.parquet``) and is not there: "no such
    folder or file" naming ``--dataset``, not a request for ``--label_columns``; ``org/name`` stays a Hub id."""
    from _helpers import parse_recipe, recipe_parser

    from pml_suprank.data.source import data_option_errors, missing_path_problem

    for path in (str(tmp_path / "nowhere"), "./nowhere", "~/nowhere-pml", "a/b/c", "nowhere.parquet", "pets/"):
        assert missing_path_problem(path) == (
            f"no such folder or file: {path} (a local path; a Hub dataset id has the form 'org/name')"
        )
        assert data_option_errors({"dataset": path, "label_columns": ["label"]}) == [missing_path_problem(path)]
    for name in ("org/name", "name", "synthetic", "data/*.parquet", str(tmp_path)):
        assert missing_path_problem(name) is None
    with pytest.raises(SystemExit) as exit_info:
        parse_recipe(recipe_parser("train_happier")[1], ["--dataset", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert f"error: --dataset {tmp_path / 'nowhere'}: no such folder or file: " in capsys.readouterr().err


def test_train_and_test_class_folders_train_in_one_command(tmp_path, hf_cache, capsys):
    out, summary = _train(tmp_path, _split_folders(tmp_path / "pets"), "--report_to", "none")
    printed = capsys.readouterr().out
    assert summary["steps"] == 2 and all(np.isfinite(v) for v in summary["after"].values())
    assert "(train/ and test/ class folders): training 12 images, 3 classes; test 9 images, 3 classes" in printed
    assert "batch fitted to the data (3 classes (4 images each)): --batch_size 12 --samples_per_class 4" in printed
    assert "warning: only 2 optimizer steps" in printed and "would reach 200" in printed
    assert not (out / "class_split.json").exists()
    assert json.loads((out / "run.json").read_text())["config"]["training"]["batch_size"] == 12


@pytest.mark.slow
def test_metadata_label_columns_become_the_levels_without_label_columns(tmp_path, hf_cache, capsys):
    out, summary = _train(tmp_path, _metadata_folder(tmp_path / "zoo"), "--with_tracking", "false")
    printed = capsys.readouterr().out
    assert "label levels species, family (finest first)" in printed
    assert summary["steps"] == 2 and "ap_level1" in summary["after"]  # two levels: fine species, coarse family
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["training"]["label_names"] == ["species", "family"]


@pytest.mark.slow
def test_a_folder_without_split_is_split_by_class_seeded_and_recorded(tmp_path, hf_cache, capsys):
    folder = _class_folders(tmp_path / "six", list(COLOURS), 3)
    out, summary = _train(tmp_path, folder, "--with_tracking", "false", "--seed", "5", recipe="train_roadmap")
    printed = capsys.readouterr().out
    split = json.loads((out / "class_split.json").read_text())
    assert split["seed"] == 5 and len(split["train_classes"]) == len(split["test_classes"]) == 3
    assert sorted(split["train_classes"] + split["test_classes"]) == sorted(COLOURS)
    assert f"into 3 training and 3 test classes (open set), written to {out / 'class_split.json'}" in printed
    assert "training 9 images, 3 classes; test 9 images, 3 classes" in printed
    assert summary["steps"] == 2


@pytest.mark.slow
def test_nested_class_folders_train_as_classes_within_groups(tmp_path, hf_cache, capsys):
    folder = tmp_path / "scripts"  # alphabet/characterNN/*: the item names repeat in every group
    for g, group in enumerate(["latin", "greek"]):
        for k, (item, colour) in enumerate(zip(["c1", "c2", "c3"], list(COLOURS.values()), strict=False)):
            for i in range(3):
                _png(folder / group / item / f"{i}.png", colour, 100 * g + 10 * k + i)
    out, summary = _train(tmp_path, folder, "--with_tracking", "false")
    printed = capsys.readouterr().out
    assert "class folders <group>/<class>, label levels label, group (finest first)" in printed
    assert "training 9 images, 3 classes; test 9 images, 3 classes" in printed  # 6 classes, not 3 merged names
    split = json.loads((out / "class_split.json").read_text())
    assert sorted(split["train_classes"] + split["test_classes"]) == [
        f"{g}/{c}" for g in ("greek", "latin") for c in ("c1", "c2", "c3")
    ]
    assert summary["steps"] == 2 and "ap_level1" in summary["after"]  # two levels: class within its group
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["training"]["label_names"] == ["label", "group"]


# ------------------------------------------------------------------------------------------------------------------
# refusals: exit status 2 and a message, no traceback
# ------------------------------------------------------------------------------------------------------------------
def test_an_explicit_batch_the_data_cannot_fill_is_refused_with_values_that_work(tmp_path, hf_cache, capsys):
    folder = _split_folders(tmp_path / "pets")
    with pytest.raises(SystemExit) as exit_info:
        _train(tmp_path, folder, "--batch_size", "32", "--samples_per_class", "4", "--with_tracking", "false")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --batch_size 32 --samples_per_class 4 need 8 classes per batch (1 process(es))" in err
    assert "3 classes (4 images each); values that would work: --batch_size 12 --samples_per_class 4" in err


def test_unusable_images_are_refused_before_the_first_step_listing_them(tmp_path, hf_cache, capsys):
    folder = _class_folders(tmp_path / "pets", ["cat", "dog", "fox"], 4)
    (folder / "dog" / "fake.jpg").write_text("a text file")
    with pytest.raises(SystemExit) as exit_info:
        _train(tmp_path, folder, "--with_tracking", "false")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --dataset {folder}: '{folder}', split 'train': 1 of 13 images cannot be used" in err
    assert f"{folder / 'dog' / 'fake.jpg'}: not an image" in err
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "final").exists()


def test_evaluating_a_split_the_folder_lacks_names_the_splits_and_the_flag(tmp_path, hf_cache, capsys):
    from pml_suprank.models import RetrievalModel

    model = tmp_path / "model"
    RetrievalModel("test_resnet", embedding_size=8, image_size=16).save_pretrained(model)
    folder = _class_folders(tmp_path / "pets", ["cat", "dog"], 2)
    argv = ["--model", str(model), "--dataset", str(folder), "--label_columns", "label", "--cpu", "--no_plots",
            "--split", "validation"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        import_recipe("evaluate").main(argv)  # a folder of class folders has 'train' only
    message = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "(--split validation): split='validation' is not in" in message
    assert "available splits: ['train'] (choose one: split= of the loader, --split / --test_split" in message


def test_a_folder_whose_labels_cannot_be_read_is_a_command_line_error(tmp_path, capsys):
    _png(tmp_path / "loose" / "x.png", (0, 0, 0), 0)
    with pytest.raises(SystemExit) as exit_info:
        _train(tmp_path, tmp_path / "loose")
    assert exit_info.value.code == 2
    assert "outside a class folder and there is no metadata.csv" in capsys.readouterr().err


def test_a_requested_tracker_that_is_not_installed_is_refused(tmp_path, capsys):
    from accelerate.utils import is_wandb_available

    if is_wandb_available():
        pytest.skip("wandb is installed")
    with pytest.raises(SystemExit) as exit_info:
        _train(tmp_path, "synthetic", "--report_to", "wandb")
    assert exit_info.value.code == 2
    assert "--report_to wandb needs the wandb package: pip install wandb" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# trackers
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_tensorboard_events_hold_the_metrics_the_config_and_the_plots(tmp_path, hf_cache):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = _class_folders(tmp_path / "six", list(COLOURS), 3)
    out, summary = _train(tmp_path, folder, "--report_to", "tensorboard", "--no_plots", "false")
    logs = out / "logs" / "pml_suprank"
    events = EventAccumulator(str(logs), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    assert "train/loss" in tags["scalars"]
    h_ap = events.Scalars("eval/h_ap")
    assert [e.step for e in h_ap] == [0, 2]
    assert h_ap[-1].value == pytest.approx(summary["after"]["h_ap"], abs=1e-6)
    text = events.Tensors("run_spec/text_summary")[0].tensor_proto.string_val[0].decode()
    config = json.loads(text.replace("\n    ", "\n"))
    assert config["report_to"] == "tensorboard" and config["dataset"] == str(folder)
    assert config["batch_size"] == 9 and config["samples_per_class"] == 3  # the fitted batch is what is recorded
    assert any(tag.startswith("plots/") for tag in tags["images"])
    hparams = list(logs.glob("*/hparams.yml"))  # Accelerate's copy of the config next to the events
    assert hparams and "report_to: tensorboard" in hparams[0].read_text()


def test_metadata_csv_at_the_root_above_train_and_test_is_read(tmp_path, hf_cache):
    """The documented layout ``metadata.csv`` + ``train/`` + ``test/`` (file names ``train/...``): its label columns
    were "not found" (the imagefolder builder does not pair a root metadata file with split folders)."""
    from pml_suprank.data import load_retrieval_dataset

    root, rows = tmp_path / "shop", []
    for split, names in (("train", ["cat", "dog", "fox"]), ("test", ["owl", "elk"])):
        for k, name in enumerate(names):
            for i in range(2):
                _png(root / split / f"{name}{i}.png", COLOURS[name], 10 * k + i)
                rows.append([f"{split}/{name}{i}.png", name, k % 2])
    with (root / "metadata.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["file_name", "species", "family"], *rows])
    layout = image_folder_layout(root)
    assert layout.kind == "metadata" and layout.splits == ("train", "test")
    train = load_retrieval_dataset(str(root), None, split="train")
    test = load_retrieval_dataset(str(root), None, split="test")
    assert (len(train), len(test)) == (6, 4) and train.labels.shape == (6, 2)
    assert sorted(train.class_names[int(c)] for c in train.labels[:, 0].unique()) == ["cat", "dog", "fox"]
    assert train.item_path(0).startswith(str(root / "train"))


def test_a_folder_where_every_class_has_one_image_is_refused(tmp_path, hf_cache):
    """Single-image classes gave no training pair and NaN metrics in final/; now refused before any training."""
    from pml_suprank.data import load_retrieval_dataset

    root = _class_folders(tmp_path / "singles", list(COLOURS), 1)
    with pytest.raises(ValueError, match=r"every class \(\d\) has a single image"):
        load_retrieval_dataset(str(root), None, split="train")
    _class_folders(tmp_path / "some", ["cat", "dog", "fox"], 2)
    _class_folders(tmp_path / "some", ["owl"], 1)
    with pytest.warns(UserWarning, match="1 of 4 classes have a single image"):
        assert len(load_retrieval_dataset(str(tmp_path / "some"), None, split="train")) == 7
