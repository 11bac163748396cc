"""Tests for the multi-label data contract: load_retrieval_dataset on list-valued label columns (Sequence(ClassLabel),
Sequence(int) in parquet, Sequence(string)), the hierarchy from aligned columns or hierarchy=, open-set sides, the
refusals (by column, split and row), collate of padded / ragged label rows, pad_label_sets / check_label_sets and the
RetrievalDatasetBase checks. Tiny data is built on the fly; nothing touches the network."""

from __future__ import annotations

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from pml_suprank.data import (  # noqa: E402
    check_label_sets,
    collate,
    load_retrieval_dataset,
    pad_label_sets,
)
from pml_suprank.data.retrieval_dataset import RetrievalDatasetBase  # noqa: E402
from pml_suprank.relevance import multilabel_relevance  # noqa: E402

# 8 fine classes in 4 families (family = fine // 2); train rows use classes 0-3 (+ some 4-7), test rows 4-7
TRAIN_FINE = [[0, 2], [1], [3, 0, 2], [2], [1, 3], [0]]
TEST_FINE = [[4, 6], [5], [7, 4], [6]]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _images(n: int, offset: int = 0) -> list[np.ndarray]:
    return [np.random.default_rng(offset + i).integers(0, 256, size=(6, 5, 3), dtype=np.uint8) for i in range(n)]


def _split(fine: list[list[int]], offset: int = 0, coarse: bool = True, strings: bool = False):
    from datasets import ClassLabel, Dataset, Features, Image, Sequence, Value

    names = [f"class{i}" for i in range(8)]
    columns = {"image": Image(), "labels": Sequence(ClassLabel(names=names))}
    data = {"image": _images(len(fine), offset), "labels": fine}
    if coarse:
        columns["families"] = Sequence(ClassLabel(names=["a", "b", "c", "d"]))
        data["families"] = [[f // 2 for f in row] for row in fine]
    if strings:
        columns["tags"] = Sequence(Value("string"))
        data["tags"] = [[names[f][-1] + "x" for f in row] for row in fine]
    return Dataset.from_dict(data, features=Features(columns))


@pytest.fixture(scope="module")
def hf_multi():
    return datasets.DatasetDict({"train": _split(TRAIN_FINE), "test": _split(TEST_FINE, 100)})


def test_sequence_classlabel_with_aligned_family_column(hf_multi):
    ds = load_retrieval_dataset(hf_multi, ["labels", "families"], "train")
    assert ds.multilabel and ds.labels.shape == (6, 3) and ds.labels.dtype == torch.long
    assert ds.labels.tolist() == [[0, 2, -1], [1, -1, -1], [3, 0, 2], [2, -1, -1], [1, 3, -1], [0, -1, -1]]
    # the hierarchy table is read over all splits: fine 0..7 → family fine // 2
    assert ds.hierarchy.tolist() == [[f, f // 2] for f in range(8)]
    assert ds.label_names == ["labels", "families"] and ds.num_levels == 2
    assert ds.class_names[3] == "class3"
    item = ds[2]
    assert item["labels"].tolist() == [3, 0, 2] and item["image"].shape == (3, 6, 5)
    batch = collate([ds[i] for i in range(4)])
    assert torch.equal(batch["labels"], ds.labels[:4])
    rel = multilabel_relevance(ds.labels, ds.labels, ds.hierarchy, dtype=torch.float64)
    assert rel[1, 4].item() == 1.0  # {1} ⊂ {1, 3}
    assert rel[3, 1].item() == 0.0  # {2} vs {1}: other family
    assert rel[4, 1].item() == 0.5  # {1, 3} vs {1}: label 1 found (l* = 2), label 3 not even its family (0): 2 / 4
    test = load_retrieval_dataset(hf_multi, ["labels", "families"], "test")
    assert test.labels.shape == (4, 2) and torch.equal(test.hierarchy, ds.hierarchy)


def test_flat_and_given_hierarchy(hf_multi):
    flat = load_retrieval_dataset(hf_multi, "labels", "test")
    assert flat.hierarchy is None and flat.num_levels == 1 and flat.label_names == ["labels"]
    table = [[f, f // 4] for f in range(8)]
    given = load_retrieval_dataset(hf_multi, ["labels"], "test", hierarchy=table)
    assert given.hierarchy.tolist() == table and given.label_names == ["labels", "level_1"]
    with pytest.raises(ValueError, match="no row in the hierarchy"):
        load_retrieval_dataset(hf_multi, ["labels"], "test", hierarchy=[[f, 0] for f in range(5)])
    with pytest.raises(ValueError, match="not both"):
        load_retrieval_dataset(hf_multi, ["labels", "families"], "test", hierarchy=table)
    with pytest.raises(ValueError, match="hierarchy"):
        load_retrieval_dataset(hf_multi, ["labels"], "test", hierarchy=[[0, 0], [0, 1]])  # row 1 starts with 0


def test_parquet_list_column_of_ints(tmp_path):
    import pandas as pd

    df = pd.DataFrame(
        {
            "image": [{"bytes": _png(i), "path": None} for i in range(4)],
            "fine": [[5, 2], [2], [7, 5, 2], [7]],
            "coarse": [[1, 0], [0], [1, 1, 0], [1]],
        }
    )
    df.to_parquet(tmp_path / "train-0.parquet")
    ds = load_retrieval_dataset(str(tmp_path / "train-0.parquet"), ["fine", "coarse"], image_column="image")
    assert ds.labels.tolist() == [[5, 2, -1], [2, -1, -1], [7, 5, 2], [7, -1, -1]]
    assert ds.hierarchy[[2, 5, 7]].tolist() == [[2, 0], [5, 1], [7, 1]] and bool((ds.hierarchy[[0, 1, 3]] == -1).all())
    assert ds.get_image(1).size == (5, 6)


def _png(i: int) -> bytes:
    from io import BytesIO

    from PIL import Image

    buf = BytesIO()
    Image.fromarray(_images(1, i)[0]).save(buf, format="PNG")
    return buf.getvalue()


def test_string_lists_get_ids_agreeing_between_splits():
    d = datasets.DatasetDict({"train": _split(TRAIN_FINE, strings=True), "test": _split(TEST_FINE, 9, strings=True)})
    tr = load_retrieval_dataset(d, "tags", "train")
    te = load_retrieval_dataset(d, "tags", "test")
    vocab = sorted(f"{i}x" for i in range(8))
    assert tr.class_names == te.class_names == dict(enumerate(vocab))
    assert [tr.class_names[int(v)] for v in tr.labels[2] if v >= 0] == ["3x", "0x", "2x"]


@pytest.mark.parametrize(
    "rows, match",
    [
        ([[0], [], [1]], r"'labels' of split 'train'.*no label \(an empty list or a null\) at row 1"),
        ([[0], [1], None], r"'labels' of split 'train'.*missing .* at row 2"),
        ([[0], [1, None]], r"'labels' of split 'train'.*missing \(null / NaN\) label in the list at row 1"),
    ],
)
def test_empty_and_null_labels_are_refused_by_column_split_and_row(rows, match):
    from datasets import Dataset, Features, Image, Sequence, Value

    d = Dataset.from_dict(
        {"image": _images(len(rows)), "labels": rows},
        features=Features({"image": Image(), "labels": Sequence(Value("int64"))}),
    )
    with pytest.raises(ValueError, match=match):
        load_retrieval_dataset(d, "labels")


def test_other_refusals(hf_multi):
    from datasets import Dataset, Features, Image, Sequence, Value

    feats = Features({"image": Image(), "labels": Sequence(Value("int64")), "fam": Sequence(Value("int64"))})
    neg = Dataset.from_dict({"image": _images(2), "labels": [[0], [1, -1]], "fam": [[0], [0, 0]]}, features=feats)
    with pytest.raises(ValueError, match=r"'labels' of split 'train'.*negative id -1"):
        load_retrieval_dataset(neg, "labels")
    short = Dataset.from_dict({"image": _images(2), "labels": [[0], [1, 2]], "fam": [[0], [0]]}, features=feats)
    with pytest.raises(ValueError, match=r"'labels' and 'fam' of split 'train'.*not aligned: row 1"):
        load_retrieval_dataset(short, ["labels", "fam"])
    not_tree = Dataset.from_dict({"image": _images(2), "labels": [[0], [0, 1]], "fam": [[0], [1, 1]]}, features=feats)
    with pytest.raises(ValueError, match="not a tree"):
        load_retrieval_dataset(not_tree, ["labels", "fam"])
    scalar = hf_multi["train"].add_column("family", [0] * 6)
    with pytest.raises(ValueError, match="'family' .* not list-valued"):
        load_retrieval_dataset(scalar, ["labels", "family"])
    single = Dataset.from_dict(
        {"image": _images(2), "y": [0, 1]}, features=Features({"image": Image(), "y": Value("int64")})
    )
    with pytest.raises(ValueError, match="hierarchy= is for multi-label data"):
        load_retrieval_dataset(single, "y", hierarchy=[[0], [1]])


def test_open_set_sides():
    # one split holding every class; items mixing the two sides of the class partition belong to neither
    rows = [[0, 1], [1], [2, 3], [3], [4, 5], [5], [6, 7], [7], [1, 6]]
    d = _split(rows)
    tr = load_retrieval_dataset(d, ["labels", "families"], open_set="train", train_class_fraction=0.5)
    te = load_retrieval_dataset(d, ["labels", "families"], open_set="test", train_class_fraction=0.5)
    assert tr.labels.tolist() == [[0, 1], [1, -1], [2, 3], [3, -1]]
    assert te.labels.tolist() == [[4, 5], [5, -1], [6, 7], [7, -1]]
    per_family = load_retrieval_dataset(d, ["labels", "families"], open_set="test", train_classes_per_coarse=1)
    assert set(per_family.labels[per_family.labels >= 0].tolist()) == {1, 3, 5, 7}
    with pytest.raises(ValueError, match="at least two label columns"):
        load_retrieval_dataset(d, "labels", open_set="train", train_classes_per_coarse=1)


def test_open_set_with_predefined_splits(hf_multi):
    ds = load_retrieval_dataset(hf_multi, ["labels", "families"], "test", open_set="test")
    assert ds.labels.shape == (4, 2)
    overlapping = datasets.DatasetDict({"train": _split(TRAIN_FINE), "test": _split([[4], [0, 5]], 50)})
    with pytest.raises(ValueError, match="fine classes appear in both"):
        load_retrieval_dataset(overlapping, "labels", "test", open_set="test")


def test_collate_pads_ragged_rows_and_keeps_equal_rows():
    img = torch.zeros(3, 2, 2)
    items = [
        {"image": img, "labels": [4, 1], "index": 0},
        {"image": img, "labels": 7, "index": 1},
        {"image": img, "labels": torch.tensor([2, 3, 5], dtype=torch.int32), "index": 2},
    ]
    batch = collate(items)
    assert batch["labels"].tolist() == [[4, 1, -1], [7, -1, -1], [2, 3, 5]] and batch["labels"].dtype == torch.long
    same = collate([{"image": img, "labels": torch.tensor([3, 0]), "index": i} for i in range(2)])
    assert same["labels"].tolist() == [[3, 0], [3, 0]] and same["index"].tolist() == [0, 1]


def test_pad_and_check_label_sets():
    assert pad_label_sets([[1], [2, 3]]).tolist() == [[1, -1], [2, 3]]
    assert pad_label_sets([[1]], width=3).tolist() == [[1, -1, -1]]
    with pytest.raises(ValueError, match="width"):
        pad_label_sets([[1, 2]], width=1)
    assert check_label_sets(torch.tensor([3, 4])).tolist() == [[3], [4]]
    with pytest.raises(ValueError, match="labels row 1 has no label"):
        check_label_sets(torch.tensor([[0, -1], [-1, -1]]))
    with pytest.raises(ValueError, match="my_labels row 0 holds"):
        check_label_sets(torch.tensor([[0, -2]]), name="my_labels")
    with pytest.raises(TypeError, match="integer"):
        check_label_sets(torch.tensor([[0.5]]))


class _Plain(RetrievalDatasetBase):
    def get_image(self, index):
        from PIL import Image

        return Image.new("RGB", (4, 4))


def test_base_contract_checks():
    table = [[0, 0], [1, 0], [2, 1]]
    ds = _Plain(torch.tensor([[0, 2], [1, -1]]), ["fine", "coarse"], multilabel=True, hierarchy=table)
    assert ds.multilabel and ds.num_levels == 2 and ds.hierarchy.dtype == torch.long
    assert ds[1]["labels"].tolist() == [1, -1]
    with pytest.raises(ValueError, match="label_names must name the 2 label levels"):
        _Plain(torch.tensor([[0]]), ["fine"], multilabel=True, hierarchy=[[0, 0]])
    with pytest.raises(ValueError, match="fine label 3, which has no row"):
        _Plain(torch.tensor([[3]]), ["fine", "coarse"], multilabel=True, hierarchy=[[0, 0]])
    with pytest.raises(ValueError, match="labels row 0 has no label"):
        _Plain(torch.tensor([[-1]]), ["fine"], multilabel=True)
    with pytest.raises(ValueError, match="hierarchy= is for multi-label"):
        _Plain(torch.tensor([[0]]), ["fine"], hierarchy=[[0]])
    single = _Plain(torch.tensor([[0, 1]]), ["fine", "coarse"])
    assert not single.multilabel and single.num_levels == 2 and not hasattr(single, "hierarchy")


def test_open_set_rule_with_a_given_table(hf_multi):
    table = [[f, f // 4] for f in range(8)]
    kw = {"open_set": "train", "train_classes_per_coarse": 2}
    tr = load_retrieval_dataset(hf_multi, "labels", "train", hierarchy=table, **kw)
    assert set(tr.labels[tr.labels >= 0].tolist()) == {0, 1} and tr.hierarchy.tolist() == table
    with pytest.raises(ValueError, match="fine label 4, which has no row"):
        load_retrieval_dataset(
            hf_multi,
            "labels",
            "train",
            open_set="train",
            train_class_fraction=0.5,
            hierarchy=[[f, 0] for f in range(4)],
        )
    with pytest.raises(ValueError, match="no row in the hierarchy"):
        _Plain(torch.tensor([[0]]), ["fine", "coarse"], multilabel=True, hierarchy=torch.zeros(0, 2, dtype=torch.long))
