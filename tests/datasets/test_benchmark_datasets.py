"""load_benchmark on tiny archives in each native layout: lengths, levels, ids, the tree property, protocol splits,
the item contract, and bad layouts raising ValueError naming the file and line."""

from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pytest
import torch
from _benchmark_fixtures import (
    CIFAR_KEYS,
    CUB_CLASSES,
    MAKERS,
    make_cifar100,
    make_cub,
    make_dyml,
    make_inat,
    make_omniglot,
    make_sop,
)
from PIL import Image

from pml_suprank import data
from pml_suprank.data.benchmarks import BENCHMARKS, NativeImageDataset, benchmark_label_names, load_benchmark
from pml_suprank.relevance import check_tree


def _labels(ds) -> list[list[int]]:
    return ds.labels.tolist()


def test_load_benchmark_is_reexported_by_data():
    assert data.load_benchmark is load_benchmark
    assert "load_benchmark" in data.__all__


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_split_follows_the_retrieval_contract(name, tmp_path):
    root = MAKERS[name](tmp_path / name)
    for split in BENCHMARKS[name].splits:
        ds = load_benchmark(name, root, split)
        assert isinstance(ds, NativeImageDataset)
        assert ds.labels.dtype == torch.long and ds.labels.dim() == 2 and len(ds) > 0
        assert tuple(ds.label_names) == benchmark_label_names(name, split) and ds.num_levels == len(ds.label_names)
        check_tree(ds.labels)
        assert int(ds.labels.min()) >= 0
        item = ds[len(ds) - 1]
        assert set(item) == {"image", "labels", "index"} and item["index"] == len(ds) - 1
        assert item["image"].dtype == torch.float32 and item["image"].shape[0] == 3
        assert 0.0 <= float(item["image"].min()) and float(item["image"].max()) <= 1.0
        assert torch.equal(item["labels"], ds.labels[-1])
        assert ds.get_image(0).mode == "RGB"
        assert ds.image_record(0)["bytes"]


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_ids_are_contiguous_over_the_splits_sharing_a_label_space(name, tmp_path):
    root = MAKERS[name](tmp_path / name)
    groups: dict[tuple[str, ...], list[torch.Tensor]] = {}
    for split in BENCHMARKS[name].splits:
        if split.startswith("open_"):  # subsets of train / test
            continue
        key = split.split("_", 1)[1:] if name.startswith("dyml") else ["all"]
        groups.setdefault(tuple(key), []).append(load_benchmark(name, root, split).labels)
    for parts in groups.values():
        labels = torch.cat(parts)
        for c in range(labels.shape[1]):
            assert torch.unique(labels[:, c]).tolist() == list(range(int(labels[:, c].max()) + 1))


def test_transform_is_applied(tmp_path):
    root = make_sop(tmp_path)
    ds = load_benchmark("sop", root, "train", transform=lambda im: torch.full((3, 2, 2), float(im.size[0])))
    assert torch.equal(ds[0]["image"], torch.full((3, 2, 2), 8.0))


def test_sop_ids_are_one_based_in_the_archive(tmp_path):
    root = make_sop(tmp_path)
    train, test = load_benchmark("sop", root, "train"), load_benchmark("sop", root, "test")
    assert _labels(train) == [[0, 0], [0, 0], [1, 0], [1, 0], [2, 1], [2, 1]]
    assert _labels(test) == [[3, 0], [3, 0], [4, 1], [4, 1]]
    assert train.names[0] == "bicycle_final/1_0.JPG"
    data.check_disjoint_classes(train, test)


def test_cub_open_set_halves_sorted_classes(tmp_path):
    root = make_cub(tmp_path)
    train, test = load_benchmark("cub", root, "train"), load_benchmark("cub", root, "test")
    assert _labels(train) == [[0], [0], [1], [1], [1]]
    assert _labels(test) == [[2], [2], [3], [3], [3]]
    assert train.names[0].startswith(CUB_CLASSES[0])
    same = load_benchmark("cub", root / "CUB_200_2011", "test")  # the CUB_200_2011 folder itself
    assert torch.equal(same.labels, test.labels)


def test_inat_base_species_and_supercategory_from_the_path(tmp_path):
    root = make_inat(tmp_path)
    train, test = load_benchmark("inat_base", root, "train"), load_benchmark("inat_base", root, "test")
    # species 10, 11, 20, 21, 22 -> 0..4; supercategories Aves, Insecta, Plantae -> 0, 1, 2
    assert _labels(train) == [[0, 2], [0, 2], [2, 1], [2, 1], [4, 0], [4, 0]]
    assert _labels(test) == [[1, 2], [1, 2], [3, 1], [3, 1]]
    (root / "train2018.json").unlink()  # inat_base does not need the categories
    assert torch.equal(load_benchmark("inat_base", root, "test").labels, test.labels)


def test_inat_full_seven_levels_keep_homonym_genera_apart(tmp_path):
    root = make_inat(tmp_path)
    train, test = load_benchmark("inat_full", root, "train"), load_benchmark("inat_full", root, "test")
    labels = torch.cat([train.labels, test.labels])
    assert train.label_names == ["species", "genus", "family", "order", "class", "phylum", "kingdom"]
    assert [torch.unique(labels[:, c]).numel() for c in range(7)] == [5, 5, 4, 3, 3, 3, 2]
    genus_20, genus_21 = int(train.labels[2, 1]), int(test.labels[2, 1])  # both named "Alpha"
    assert genus_20 != genus_21
    assert int(train.labels[2, 3]) == int(test.labels[2, 3])  # same order Lepidoptera
    assert train.labels[:, 6].tolist() == [1, 1, 0, 0, 0, 0]  # Plantae, Animalia x 2
    data.check_disjoint_classes(train, test)


def test_dyml_train_and_per_granularity_sets(tmp_path):
    root = make_dyml(tmp_path, product=True)
    train = load_benchmark("dyml_vehicle", root, "train")
    assert train.label_names == ["fine", "middle", "coarse"]
    assert _labels(train) == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [2, 1, 0], [2, 1, 0], [3, 2, 1]]
    assert train.paths[0].endswith("train/imgs/0000.jpg")
    expected = {"fine": ([0, 1, 1], [0, 0, 1, 1]), "middle": ([0, 1], [0, 1, 1]), "coarse": ([1, 0], [0, 1, 1])}
    for granularity, (query, gallery) in expected.items():
        q = load_benchmark("dyml_animal", root, f"query_{granularity}")
        g = load_benchmark("dyml_animal", root, f"gallery_{granularity}")
        assert q.label_names == g.label_names == [granularity]
        assert q.labels[:, 0].tolist() == query and g.labels[:, 0].tolist() == gallery
        assert q.paths[0].endswith(f"bmk_{granularity}/query/query_0.jpg")
    assert _labels(load_benchmark("dyml_product", root, "test")) == [[0, 0, 0], [0, 0, 0], [1, 1, 1]]
    with pytest.raises(ValueError, match=r"split must be one of .* for dyml_vehicle; got 'test'"):
        load_benchmark("dyml_vehicle", root, "test")


def test_cifar100_local_pickles_and_open_set(tmp_path):
    root = make_cifar100(tmp_path)
    train = load_benchmark("cifar100", root, "train")
    assert _labels(train) == [list(k) for k in CIFAR_KEYS]
    with open(root / "cifar-100-python" / "train", "rb") as f:
        raw = pickle.load(f, encoding="bytes")[b"data"]
    np.testing.assert_array_equal(np.asarray(train.get_image(3)), raw[3].reshape(3, 32, 32).transpose(1, 2, 0))
    open_train = load_benchmark("cifar100", root / "cifar-100-python", "open_train")
    open_test = load_benchmark("cifar100", root, "open_test")
    assert sorted(set(open_train.labels[:, 0].tolist())) == [0, 1, 2, 5, 6, 7]
    assert sorted(set(open_test.labels[:, 0].tolist())) == [3, 4, 8, 9]
    assert open_test.names[0] == "test_3.png"
    data.check_disjoint_classes(open_train, open_test)


@pytest.mark.parametrize("zipped", [True, False], ids=["zips", "folders"])
def test_omniglot_merges_archives_and_holds_out_half_the_characters(tmp_path, zipped):
    root = make_omniglot(tmp_path, zipped=zipped)
    train, test = load_benchmark("omniglot", root, "train"), load_benchmark("omniglot", root, "test")
    assert len(train) == 10 and len(test) == 8  # Greek kept once: 2 + 4 + 3 characters x 2 drawers
    assert sorted(set(train.labels[:, 0].tolist())) == [0, 2, 3, 6, 7]
    assert sorted(set(test.labels[:, 0].tolist())) == [1, 4, 5, 8]
    assert sorted(set(test.labels[:, 1].tolist())) == [0, 1, 2]  # every alphabet on both sides
    assert test.names[0].endswith("Greek/character02/0002_01.png")
    copy = pickle.loads(pickle.dumps(train))  # DataLoader workers
    assert torch.equal(copy[4]["image"], train[4]["image"])


# ------------------------------------------------------------------------------------------------------------------
# bad layouts


def _rewrite(path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new, 1))


def test_sop_missing_list_file(tmp_path):
    root = make_sop(tmp_path)
    (root / "Ebay_test.txt").unlink()
    with pytest.raises(ValueError, match=r"Ebay_test\.txt: missing file"):
        load_benchmark("sop", root, "train")


def test_sop_wrong_columns(tmp_path):
    root = make_sop(tmp_path)
    _rewrite(root / "Ebay_train.txt", "super_class_id", "superclass_id")
    with pytest.raises(ValueError, match=r"Ebay_train\.txt, line 1: expected the columns"):
        load_benchmark("sop", root, "train")


def test_sop_image_that_does_not_exist(tmp_path):
    root = make_sop(tmp_path)
    (root / "bicycle_final" / "1_1.JPG").unlink()
    with pytest.raises(ValueError, match=r"Ebay_train\.txt, line 3: image .*1_1\.JPG does not exist"):
        load_benchmark("sop", root, "train")


def test_sop_product_in_two_categories(tmp_path):
    root = make_sop(tmp_path)
    _rewrite(root / "Ebay_train.txt", "2 1 1 bicycle_final/1_1.JPG", "2 1 2 bicycle_final/1_1.JPG")
    with pytest.raises(ValueError, match=r"Ebay_train\.txt, line 3: class_id 1 has super_class_id 2 but 1 at .*line 2"):
        load_benchmark("sop", root, "test")


def test_sop_zero_based_or_non_integer_ids(tmp_path):
    root = make_sop(tmp_path)
    _rewrite(root / "Ebay_test.txt", "7 4 1", "7 0 1")
    with pytest.raises(ValueError, match=r"Ebay_test\.txt, line 2: ids are 1-based"):
        load_benchmark("sop", root, "test")
    _rewrite(root / "Ebay_test.txt", "7 0 1", "7 x 1")
    with pytest.raises(ValueError, match=r"Ebay_test\.txt, line 2: column 'class_id' must be an integer"):
        load_benchmark("sop", root, "test")


def test_cub_without_images_folder(tmp_path):
    with pytest.raises(ValueError, match=r"missing folder CUB_200_2011/images"):
        load_benchmark("cub", tmp_path, "train")


def test_inat_malformed_path_and_unknown_category(tmp_path):
    root = make_inat(tmp_path)
    split_file = root / "Inat_dataset_splits" / "Inaturalist_test_set1.txt"
    _rewrite(split_file, "train_val2018/Insecta/21/21_0.jpg", "Insecta/21/21_0.jpg")
    with pytest.raises(ValueError, match=r"Inaturalist_test_set1\.txt, line 3: expected train_val2018/"):
        load_benchmark("inat_base", root, "train")
    _rewrite(split_file, "Insecta/21/21_0.jpg", "train_val2018/Insecta/99/21_0.jpg")
    with pytest.raises(ValueError, match=r"Inaturalist_test_set1\.txt, line 3: category id 99 is not in .*train2018"):
        load_benchmark("inat_full", root, "test")
    with pytest.raises(ValueError, match=r"Inaturalist_test_set1\.txt, line 3: image .*99/21_0\.jpg does not exist"):
        load_benchmark("inat_base", root, "test")


def test_inat_species_in_two_supercategories(tmp_path):
    root = make_inat(tmp_path)
    split_file = root / "Inat_dataset_splits" / "Inaturalist_test_set1.txt"
    _rewrite(split_file, "train_val2018/Insecta/21/21_1.jpg", "train_val2018/Aves/21/21_1.jpg")
    with pytest.raises(ValueError, match=r"Inaturalist_test_set1\.txt, line 4: species 21 has supercategory 'Aves'"):
        load_benchmark("inat_base", root, "train")


def test_inat_full_needs_the_categories(tmp_path):
    root = make_inat(tmp_path)
    (root / "train2018.json").write_text('{"categories": [{"id": 10, "name": "x"}]}')
    with pytest.raises(ValueError, match=r"train2018\.json, categories\[0\]: missing keys"):
        load_benchmark("inat_full", root, "train")


def test_dyml_columns_must_keep_their_leading_spaces(tmp_path):
    root = make_dyml(tmp_path)
    _rewrite(
        root / "train" / "label.csv", "fname, fine_id0.jpg, middle_id, coarse_id", "fname,fine_id,middle_id,coarse_id"
    )
    with pytest.raises(ValueError, match=r"label\.csv, line 1: expected the columns \['fname', ' fine_id0\.jpg'"):
        load_benchmark("dyml_vehicle", root, "train")


def test_dyml_bad_benchmark_rows(tmp_path):
    root = make_dyml(tmp_path)
    _rewrite(root / "bmk_middle" / "query.csv", "query_1.jpg, 6", "query_1.jpg, six")
    with pytest.raises(ValueError, match=r"bmk_middle/query\.csv, line 3: column ' labels0\.jpg' must be an integer"):
        load_benchmark("dyml_vehicle", root, "query_middle")
    (root / "bmk_fine" / "gallery.csv").unlink()
    with pytest.raises(ValueError, match=r"bmk_fine/gallery\.csv: missing file"):
        load_benchmark("dyml_vehicle", root, "query_fine")
    _rewrite(root / "train" / "label.csv", "0002.jpg, 9, 3, 1", "0002.jpg, 9, 3")
    with pytest.raises(ValueError, match=r"train/label\.csv, line 4: expected 4 cells"):
        load_benchmark("dyml_vehicle", root, "train")


def test_dyml_middle_class_in_two_coarse_classes(tmp_path):
    root = make_dyml(tmp_path)
    _rewrite(root / "train" / "label.csv", "0005.jpg, 15, 8, 2", "0005.jpg, 15, 3, 2")
    with pytest.raises(ValueError, match=r"label\.csv, line 7: middle 3 has coarse 2 but 1 at .*line 2"):
        load_benchmark("dyml_vehicle", root, "train")


class _Payload:
    def __reduce__(self):
        return (print, ("side effect",))


def test_cifar100_pickles_are_read_with_a_restricted_unpickler(tmp_path):
    root = make_cifar100(tmp_path)
    (root / "cifar-100-python" / "test").write_bytes(pickle.dumps({b"data": _Payload()}))
    with pytest.raises(ValueError, match=r"cifar-100-python/test: not a readable CIFAR-100 pickle .*not allowed"):
        load_benchmark("cifar100", root, "test")
    (root / "cifar-100-python" / "test").write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)}))
    with pytest.raises(ValueError, match=r"cifar-100-python/test: missing keys \['fine_labels', 'coarse_labels'\]"):
        load_benchmark("cifar100", root, "train")
    (root / "cifar-100-python" / "train").unlink()
    with pytest.raises(ValueError, match=r"cifar-100-python/train: missing file"):
        load_benchmark("cifar100", root, "test")


def test_omniglot_bad_layouts(tmp_path):
    with pytest.raises(ValueError, match=r"missing images_background\*\.zip"):
        load_benchmark("omniglot", tmp_path, "train")
    with zipfile.ZipFile(tmp_path / "images_background.zip", "w") as z:
        z.writestr("images_background/Latin/character01.png", b"")
    with pytest.raises(ValueError, match=r"images_background\.zip, entry images_background/Latin/character01\.png"):
        load_benchmark("omniglot", tmp_path, "train")


def test_registry_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"name must be one of .*'sop'.*got 'imagenet'"):
        load_benchmark("imagenet", tmp_path, "train")
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'test'\] for sop; got 'val'"):
        load_benchmark("sop", tmp_path, "val")
    with pytest.raises(ValueError, match=r"root .*nowhere.* of benchmark sop is not a folder"):
        load_benchmark("sop", tmp_path / "nowhere", "train")
    with pytest.raises(TypeError, match=r"root must be a path"):
        load_benchmark("sop", 3, "train")
    with pytest.raises(ValueError, match=r"split must be one of"):
        benchmark_label_names("omniglot", "val")
    assert benchmark_label_names("dyml_product", "query_coarse") == ("coarse",)


def test_images_are_decoded_lazily(tmp_path, monkeypatch):
    root = make_sop(tmp_path)
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    ds = load_benchmark("sop", root, "test")
    assert opened == [] and ds.labels.shape == (4, 2)
    ds[1]
    assert len(opened) == 1


def test_default_splits_are_splits():
    for spec in BENCHMARKS.values():
        assert spec.train_split in spec.splits
        assert spec.test_split is None or spec.test_split in spec.splits
    assert BENCHMARKS["dyml_vehicle"].test_split is None and BENCHMARKS["dyml_product"].test_split == "test"
    assert (BENCHMARKS["cifar100"].train_split, BENCHMARKS["cifar100"].test_split) == ("open_train", "open_test")


def test_cifar100_hub_id_goes_through_datasets(monkeypatch):
    """A Hub id (no local folder of that name) is read with ``datasets.load_dataset`` (mocked here: no network)."""
    import datasets

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)) for _ in CIFAR_KEYS]
    table = datasets.Dataset.from_dict(
        {"img": images, "fine_label": [f for f, _ in CIFAR_KEYS], "coarse_label": [c for _, c in CIFAR_KEYS]},
        features=datasets.Features(
            {"img": datasets.Image(), "fine_label": datasets.Value("int64"), "coarse_label": datasets.Value("int64")}
        ),
    )
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, split: calls.append((repo, split)) or table)
    full = load_benchmark("cifar100", "someone/cifar100-copy", "test")
    assert calls == [("someone/cifar100-copy", "test")]
    assert _labels(full) == [list(k) for k in CIFAR_KEYS]
    np.testing.assert_array_equal(np.asarray(full.get_image(2)), np.asarray(images[2]))
    assert full[2]["image"].shape == (3, 4, 4) and full.image_record(2)["bytes"]
    open_train = load_benchmark("cifar100", "someone/cifar100-copy", "open_train")
    assert calls[-1] == ("someone/cifar100-copy", "train")
    assert sorted(set(open_train.labels[:, 0].tolist())) == [0, 1, 2, 5, 6, 7]


def test_empty_split_is_an_error(tmp_path):
    root = make_sop(tmp_path)
    (root / "Ebay_test.txt").write_text("image_id class_id super_class_id path\n")
    with pytest.raises(ValueError, match=r"split 'test' of sop lists no image"):
        load_benchmark("sop", root, "test")
    assert len(load_benchmark("sop", root, "train")) == 6
