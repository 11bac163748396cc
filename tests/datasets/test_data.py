"""Tests for pml_suprank.data.loading: load_retrieval_dataset (image folder, parquet, save_to_disk, in-memory) with two
label columns, open-set class splits, build_transforms. Tiny data is built on the fly; nothing touches the network."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from pml_suprank.data import (  # noqa: E402
    build_transforms,
    check_disjoint_classes,
    collate,
    load_retrieval_dataset,
    open_set_classes,
)

# 2 coarse classes x 5 fine classes (CIFAR-100-like), 2 images per fine class per split
FINE = list(range(10))
COARSE = [f // 5 for f in FINE]


def _image(i: int):
    from PIL import Image

    rng = np.random.default_rng(i)
    return Image.fromarray(rng.integers(0, 256, size=(12, 10, 3), dtype=np.uint8))


def _records(split: str):
    offset = 0 if split == "train" else 1000
    return [(offset + 2 * f + k, f, COARSE[f]) for f in FINE for k in range(2)]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def hf_dict():
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value

    features = Features(
        {
            "img": Image(),
            "fine_label": ClassLabel(num_classes=10),
            "coarse_label": ClassLabel(num_classes=2),
            "id": Value("int64"),
        }
    )
    out = {}
    for split in ("train", "test"):
        recs = _records(split)
        out[split] = Dataset.from_dict(
            {
                "img": [_image(i) for i, _, _ in recs],
                "fine_label": [f for _, f, _ in recs],
                "coarse_label": [c for _, _, c in recs],
                "id": [i for i, _, _ in recs],
            },
            features=features,
        )
    return DatasetDict(out)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagefolder")
    for split in ("train", "test"):
        (root / split).mkdir()
        with open(root / split / "metadata.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["file_name", "fine_label", "coarse_label"])
            for i, fine, coarse in _records(split):
                _image(i).save(root / split / f"{i}.png")
                w.writerow([f"{i}.png", fine, coarse])
    return root


def _check_contract(ds, n=20, names=("fine_label", "coarse_label")):
    assert len(ds) == n
    assert ds.labels.shape == (n, 2) and ds.labels.dtype == torch.long
    assert ds.label_names == list(names)
    item = ds[3]
    assert item["image"].shape == (3, 12, 10) and item["image"].dtype == torch.float32
    torch.testing.assert_close(item["labels"], ds.labels[3])
    assert item["index"] == 3
    assert ds.get_image(0).mode == "RGB"


def _expected_labels(split):
    return torch.tensor([[f, c] for _, f, c in _records(split)])


@pytest.mark.slow
def test_image_folder_with_metadata(image_folder, tmp_path):
    for split in ("train", "test"):
        ds = load_retrieval_dataset(image_folder, ["fine_label", "coarse_label"], split=split, cache_dir=tmp_path)
        _check_contract(ds)
        # imagefolder may list files in any order: compare the multiset of label rows
        got = sorted(map(tuple, ds.labels.tolist()))
        assert got == sorted(map(tuple, _expected_labels(split).tolist()))


def test_parquet_files_and_folder(hf_dict, tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    for split, d in hf_dict.items():
        d.to_parquet(str(folder / f"{split}-00000.parquet"))
    ds = load_retrieval_dataset(
        str(folder / "train-00000.parquet"), ["fine_label", "coarse_label"], cache_dir=tmp_path / "c1"
    )
    _check_contract(ds)
    torch.testing.assert_close(ds.labels, _expected_labels("train"))
    test = load_retrieval_dataset(folder, ["fine_label", "coarse_label"], split="test", cache_dir=tmp_path / "c2")
    torch.testing.assert_close(test.labels, _expected_labels("test"))
    files = {"train": str(folder / "train-00000.parquet"), "test": str(folder / "test-00000.parquet")}
    via_files = load_retrieval_dataset(
        "parquet", ["fine_label", "coarse_label"], "test", data_files=files, cache_dir=tmp_path / "c3"
    )
    torch.testing.assert_close(via_files.labels, test.labels)


@pytest.mark.parametrize(
    ("column", "values", "row"),
    [
        ("fine_label", [0.0, 1.0, float("nan"), 1.0], 2),  # a parquet integer column with a gap turns float + NaN
        ("fine_label", ["a", None, "b", "a"], 1),  # a string column with a null
        ("coarse_label", [0, 1, 1, None], 3),  # an integer column with a null
    ],
)
def test_missing_labels_are_refused_by_column_and_row(tmp_path, column, values, row):
    from datasets import Dataset, DatasetDict

    other = "coarse_label" if column == "fine_label" else "fine_label"
    table = {"img": [_image(i) for i in range(4)], column: values, other: [0, 0, 1, 1]}
    Dataset.from_dict(table).to_parquet(str(tmp_path / "train.parquet"))
    with pytest.raises(ValueError, match=rf"label column '{column}' of split 'train' .* at row {row}"):
        load_retrieval_dataset(str(tmp_path / "train.parquet"), ["fine_label", "coarse_label"], cache_dir=tmp_path)
    # the same in memory, and in a split other than the one loaded (string ids are computed over every split)
    with pytest.raises(ValueError, match=rf"label column '{column}' of split 'test' .* at row {row}"):
        clean = Dataset.from_dict({**table, column: values[:1] * 4})
        both = DatasetDict({"train": clean, "test": Dataset.from_dict(table)})
        load_retrieval_dataset(both, ["fine_label", "coarse_label"])


def test_float_label_columns_are_read_as_ids_by_both_readers():
    """An integral float column (parquet's integer column with a gap) holds ids, one label or lists; fractions are
    refused the same way."""
    from datasets import Dataset

    one = Dataset.from_dict({"img": [_image(i) for i in range(3)], "y": [2.0, 10.0, 2.0]})
    assert load_retrieval_dataset(one, "y").labels[:, 0].tolist() == [2, 10, 2]
    lists = Dataset.from_dict({"img": [_image(i) for i in range(3)], "y": [[2.0], [10.0, 2.0], [2.0]]})
    assert load_retrieval_dataset(lists, "y").labels.tolist() == [[2, -1], [10, 2], [2, -1]]
    for frac in (one.map(lambda r: {"y": r["y"] + 0.5}), lists.map(lambda r: {"y": [v + 0.5 for v in r["y"]]})):
        with pytest.raises(ValueError, match="label column 'y' of split 'train' .* non-integer labels"):
            load_retrieval_dataset(frac, "y")


def test_save_to_disk_dict_and_single(hf_dict, tmp_path):
    hf_dict.save_to_disk(str(tmp_path / "dd"))
    ds = load_retrieval_dataset(tmp_path / "dd", ["fine_label", "coarse_label"], split="test")
    _check_contract(ds)
    torch.testing.assert_close(ds.labels, _expected_labels("test"))
    assert ds.class_names[0] == "0"  # ClassLabel names
    hf_dict["train"].save_to_disk(str(tmp_path / "single"))
    single = load_retrieval_dataset(str(tmp_path / "single"), ["fine_label", "coarse_label"])
    torch.testing.assert_close(single.labels, _expected_labels("train"))


def test_in_memory_and_string_labels_consistent_across_splits(hf_dict):
    from datasets import DatasetDict

    names = ["apple", "bee", "cat", "dog", "eel", "fig", "gnu", "hen", "ibis", "jay"]
    d = DatasetDict(
        {
            k: v.map(lambda ex: {"name": names[ex["fine_label"]], "group": "AB"[ex["coarse_label"]]})
            for k, v in hf_dict.items()
        }
    )
    # the test split only holds half of the names: ids must still agree with the train split
    d["test"] = d["test"].filter(lambda ex: ex["fine_label"] >= 5)
    tr = load_retrieval_dataset(d, ["name", "group"], "train")
    te = load_retrieval_dataset(d, ["name", "group"], "test")
    assert tr.labels[:, 0].tolist() == [names.index(n) for n in d["train"]["name"]]
    assert te.labels[:, 0].tolist() == [names.index(n) for n in d["test"]["name"]]
    assert tr.class_names[2] == "cat"
    _check_contract(tr, names=("name", "group"))


def test_open_set_per_coarse_like_cifar100(hf_dict):
    cols = ["fine_label", "coarse_label"]
    tr = load_retrieval_dataset(hf_dict, cols, "train", open_set="train", train_classes_per_coarse=3)
    te = load_retrieval_dataset(hf_dict, cols, "test", open_set="test", train_classes_per_coarse=3)
    assert sorted(set(tr.labels[:, 0].tolist())) == [0, 1, 2, 5, 6, 7]
    assert sorted(set(te.labels[:, 0].tolist())) == [3, 4, 8, 9]
    assert len(tr) == 12 and len(te) == 8
    check_disjoint_classes(tr, te)
    # items keep their images: the selected rows are the original ones
    assert tr.hf_dataset["id"] == [i for i, f, _ in _records("train") if f in (0, 1, 2, 5, 6, 7)]


def test_open_set_fraction_like_cub():
    labels = torch.tensor([[f, 0] for f in range(6) for _ in range(2)])
    train, test = open_set_classes(labels, train_class_fraction=0.5)
    assert train.tolist() == [0, 1, 2] and test.tolist() == [3, 4, 5]


def test_open_set_with_overlapping_predefined_splits_raises(hf_dict):
    with pytest.raises(ValueError, match="10 fine classes appear in both"):
        load_retrieval_dataset(hf_dict, ["fine_label", "coarse_label"], "train", open_set="train")
    with pytest.raises(ValueError, match="appear in both"):
        check_disjoint_classes(torch.tensor([1, 2]), torch.tensor([[2, 0], [3, 0]]))


def test_open_set_predefined_disjoint_is_accepted(hf_dict):
    from datasets import DatasetDict

    d = DatasetDict(
        {
            "train": hf_dict["train"].filter(lambda e: e["fine_label"] < 5),
            "test": hf_dict["test"].filter(lambda e: e["fine_label"] >= 5),
        }
    )
    te = load_retrieval_dataset(d, ["fine_label", "coarse_label"], "test", open_set="test")
    assert len(te) == 10


def test_errors(hf_dict, tmp_path):
    cols = ["fine_label", "coarse_label"]
    with pytest.raises(ValueError, match=r"label column\(s\) \['superclass'\] not found.*available columns"):
        load_retrieval_dataset(hf_dict, ["fine_label", "superclass"])
    with pytest.raises(ValueError, match="available splits"):
        load_retrieval_dataset(hf_dict, cols, "validation")
    with pytest.raises(ValueError, match="image_column='photo' not found"):
        load_retrieval_dataset(hf_dict, cols, image_column="photo")
    with pytest.raises(ValueError, match="not a tree"):
        load_retrieval_dataset(hf_dict, ["coarse_label", "fine_label"])
    with pytest.raises(ValueError, match="need open_set"):
        load_retrieval_dataset(hf_dict, cols, train_classes_per_coarse=3)
    with pytest.raises(ValueError, match="open_set must be one of"):
        load_retrieval_dataset(hf_dict, cols, open_set="val", train_classes_per_coarse=3)
    with pytest.raises(ValueError, match="would leave none for testing"):
        load_retrieval_dataset(hf_dict, cols, open_set="train", train_classes_per_coarse=5)
    with pytest.raises(ValueError, match="exactly one rule"):
        open_set_classes(torch.tensor([[0, 0]]), train_classes_per_coarse=1, train_class_fraction=0.5)
    with pytest.raises(ValueError, match="label_columns"):
        load_retrieval_dataset(hf_dict, [])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_retrieval_dataset(str(tmp_path / "nothing" / "here"), cols)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither a save_to_disk dataset"):
        load_retrieval_dataset(tmp_path / "empty", cols)
    with pytest.raises(TypeError, match="source must be"):
        load_retrieval_dataset(42, cols)


def test_transforms_and_collate(hf_dict):
    cfg = {"input_size": (3, 8, 8), "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25), "crop_pct": 0.875}
    ds = load_retrieval_dataset(hf_dict, ["fine_label", "coarse_label"], transform=build_transforms(cfg, train=True))
    batch = collate([ds[i] for i in range(4)])
    assert batch["image"].shape == (4, 3, 8, 8) and batch["labels"].shape == (4, 2)
    assert batch["index"].tolist() == [0, 1, 2, 3]
    # the test pipeline is deterministic and normalised: a constant image maps to (v - mean) / std
    from PIL import Image

    test_tf = build_transforms(cfg, train=False)
    out = test_tf(Image.new("RGB", (20, 30), (255, 255, 255)))
    assert out.shape == (3, 8, 8)
    torch.testing.assert_close(out, torch.full((3, 8, 8), 2.0))
    torch.testing.assert_close(test_tf(_image(1)), test_tf(_image(1)))


@pytest.mark.parametrize(
    "cfg, kwargs, match",
    [
        ({"mean": (0,) * 3, "std": (1,) * 3}, {}, "missing"),
        ({"input_size": (3, 8), "mean": (0,) * 3, "std": (1,) * 3}, {}, "input_size"),
        ({"input_size": (3, 8, 8), "mean": (0,) * 3, "std": (1,) * 3}, {"scale": (0.5, 2.0)}, "scale"),
        ({"input_size": (3, 8, 8), "mean": (0,) * 3, "std": (1,) * 3}, {"hflip": 2.0}, "hflip"),
    ],
)
def test_build_transforms_errors(cfg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_transforms(cfg, train=True, **kwargs)
    with pytest.raises(TypeError, match="data_config must be a dict"):
        build_transforms(None, train=False)


def test_hub_dataset_id_goes_through_load_dataset(hf_dict, monkeypatch):
    """A Hub id is handed to datasets.load_dataset (here replaced: tests never download)."""
    calls = []

    def fake_load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return hf_dict

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = load_retrieval_dataset(
        "uoft-cs/cifar100",
        ["fine_label", "coarse_label"],
        "test",
        revision="main",
        open_set="test",
        train_classes_per_coarse=3,
    )
    assert calls == [("uoft-cs/cifar100", {"cache_dir": None, "revision": "main", "token": None})]
    assert sorted(set(ds.labels[:, 0].tolist())) == [3, 4, 8, 9]


def test_array_image_column():
    from datasets import Array3D, Dataset, Features, Value

    pixels = np.full((2, 5, 4, 3), 255, dtype=np.uint8)
    feats = Features({"pixels": Array3D(shape=(5, 4, 3), dtype="uint8"), "y": Value("int64")})
    d = Dataset.from_dict({"pixels": pixels, "y": [0, 1]}, features=feats)
    ds = load_retrieval_dataset(d, "y", image_column="pixels")
    torch.testing.assert_close(ds[1]["image"], torch.ones(3, 5, 4))
    assert ds.labels.shape == (2, 1) and ds.label_names == ["y"]
