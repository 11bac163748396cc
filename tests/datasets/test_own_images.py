"""A user's own image folder read as the user means it: nested class folders give label levels (never the innermost
names merged across groups), every image is checked before it is used (one error listing the bad files), and the
loader's refusals are messages (a metadata path, ``label_columns=None``, a missing split)."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

from pml_suprank.data import image_folder_layout, load_retrieval_dataset  # noqa: E402

OMNIGLOT = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "omniglot_small"


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def _png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3)).astype(np.uint8)
    Image.fromarray(pixels).save(path)


def _nested(root: Path, groups=("alpha", "beta"), items=("c1", "c2", "c3"), per_item: int = 2) -> Path:
    for g, group in enumerate(groups):
        for i, item in enumerate(items):
            for k in range(per_item):
                _png(root / group / item / f"{k}.png", 100 * g + 10 * i + k)
    return root


def _bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A valid PNG header announcing ``width x height`` pixels (a decompression bomb), a few bytes on disk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IDAT", zlib.compress(b"\0" * 64))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + body + chunk(b"IEND", b"")


# ------------------------------------------------------------------------------------------------------------------
# nested class folders
# ------------------------------------------------------------------------------------------------------------------
def test_nested_class_folders_are_two_levels_not_the_innermost_names_merged(tmp_path):
    root = _nested(tmp_path / "omni")  # alpha/c1..c3 and beta/c1..c3: 6 leaf folders, item names repeated
    layout = image_folder_layout(root)
    assert (layout.kind, layout.depth, layout.label_columns) == ("class_folders", 2, ("label", "group"))
    assert "<group>/<class>, label levels label, group" in layout.describe()
    ds = load_retrieval_dataset(root, None)
    assert ds.label_names == ["label", "group"] and len(ds) == 12
    assert torch.unique(ds.labels[:, 0]).numel() == 6 and torch.unique(ds.labels[:, 1]).numel() == 2
    names = sorted(ds.class_names.values())
    assert names == ["alpha/c1", "alpha/c2", "alpha/c3", "beta/c1", "beta/c2", "beta/c3"]
    for i in range(len(ds)):  # each item's levels are its own folder path and its group
        path = Path(ds.describe_item(i).split("(")[-1].rstrip(")"))
        assert ds.class_names[int(ds.labels[i, 0])] == f"{path.parent.parent.name}/{path.parent.name}"
    group_of = {int(f): int(g) for f, g in ds.labels.tolist()}  # a tree: one group per class
    assert len(group_of) == 6 and sorted(group_of.values()) == [0, 0, 0, 1, 1, 1]
    assert ds[0]["image"].shape == (3, 8, 8)


def test_nested_folders_under_train_and_test_and_deeper_nesting(tmp_path):
    root = tmp_path / "split"
    _nested(root / "train", items=("c1", "c2"))
    _nested(root / "test", items=("c3",))
    layout = image_folder_layout(root)
    assert (layout.kind, layout.splits) == ("split_folders", ("train", "test"))
    assert layout.label_columns == ("label", "group")
    train, test = load_retrieval_dataset(root, None, "train"), load_retrieval_dataset(root, None, "test")
    assert sorted(train.class_names[int(c)] for c in torch.unique(train.labels[:, 0])) == [
        "alpha/c1", "alpha/c2", "beta/c1", "beta/c2"
    ]  # fmt: skip
    assert sorted(test.class_names[int(c)] for c in torch.unique(test.labels[:, 0])) == ["alpha/c3", "beta/c3"]
    assert set(test.labels[:, 0].tolist()).isdisjoint(train.labels[:, 0].tolist())  # ids agree over the splits
    assert set(test.labels[:, 1].tolist()) == set(train.labels[:, 1].tolist())  # the same two groups
    deep = tmp_path / "deep"
    for top in ("x", "y"):
        _nested(deep / top, items=("c1",), per_item=2)  # one image a class is refused
    three = image_folder_layout(deep)
    assert (three.depth, three.label_columns) == (3, ("label", "group_1", "group_2"))
    ds = load_retrieval_dataset(deep, None)
    assert torch.unique(ds.labels, dim=0).shape == (4, 3)  # x/alpha/c1, x/beta/c1, y/alpha/c1, y/beta/c1
    assert torch.unique(ds.labels[:, 1]).numel() == 4 and torch.unique(ds.labels[:, 2]).numel() == 2


def test_a_lone_train_folder_is_a_split_not_a_group(tmp_path):
    root = tmp_path / "only_train"
    _nested(root / "train", groups=("alpha",), items=("c1", "c2"))
    layout = image_folder_layout(root)  # train/alpha/c1/*: group alpha, classes alpha/c1 and alpha/c2
    assert (layout.kind, layout.depth, layout.splits) == ("class_folders", 2, ("train",))
    ds = load_retrieval_dataset(root, None)
    assert sorted(ds.class_names.values()) == ["alpha/c1", "alpha/c2"] and torch.unique(ds.labels[:, 1]).numel() == 1
    flat = tmp_path / "flat_train"
    for name in ("cat", "dog"):
        _png(flat / "train" / name / "0.png", 0)
    assert image_folder_layout(flat).label_columns == ("label",)  # train/<class>/*: one level, as before


def test_images_at_different_depths_are_refused_naming_the_layouts_that_work(tmp_path):
    root = _nested(tmp_path / "mixed")
    _png(root / "gamma" / "0.png", 1)  # a class folder beside the group folders
    depths = r"different folder depths .*gamma/0\.png: 1 folder\(s\) deep.*layouts that work"
    with pytest.raises(ValueError, match=depths):
        image_folder_layout(root)
    with pytest.raises(ValueError, match=r"nested class folders <group>/<class>/\*"):
        load_retrieval_dataset(root, None)


@pytest.mark.slow
def test_omniglot_small_characters_stay_apart_across_alphabets(tmp_path):
    archive = OMNIGLOT / "images_background_small1.zip"
    if not archive.is_file():
        pytest.skip(f"{archive} is not on this machine")
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp_path)
    root = tmp_path / "images_background_small1"
    ds = load_retrieval_dataset(root, None)
    assert len(ds) == 2720 and ds.label_names == ["label", "group"]
    assert torch.unique(ds.labels[:, 0]).numel() == 136  # the merged innermost names were 40 classes
    assert torch.unique(ds.labels[:, 1]).numel() == 5
    assert {name.split("/")[0] for name in ds.class_names.values()} == {
        "Balinese", "Early_Aramaic", "Greek", "Korean", "Latin"
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------------------------
# every image checked before use
# ------------------------------------------------------------------------------------------------------------------
def test_a_text_file_and_a_decompression_bomb_are_listed_before_any_image_is_used(tmp_path):
    root = _nested(tmp_path / "bad")
    (root / "alpha" / "c1" / "fake.jpg").write_text("not an image")
    (root / "beta" / "c2" / "big.png").write_bytes(_bomb_png())
    with pytest.raises(ValueError) as info:
        load_retrieval_dataset(root, None)
    message = str(info.value)
    assert "split 'train': 2 of 14 images cannot be used" in message
    assert f"{root / 'alpha' / 'c1' / 'fake.jpg'}: not an image" in message
    assert f"{root / 'beta' / 'c2' / 'big.png'}: over the decompression-bomb limit" in message
    assert "900000000 pixels" in message and "PIL.Image.MAX_IMAGE_PIXELS" in message


def test_a_bomb_reached_without_the_check_names_its_file(tmp_path):
    import datasets

    from pml_suprank.data import HFRetrievalDataset

    (tmp_path / "big.png").write_bytes(_bomb_png())
    table = datasets.Dataset.from_dict({"image": [str(tmp_path / "big.png")], "label": [0]})
    ds = HFRetrievalDataset(table.cast_column("image", datasets.Image()), ["label"], "image", torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"row 0 of the image column 'image' \(.*big\.png\): cannot decode the image "):
        ds.get_image(0)


def test_corrupt_files_are_found_by_the_header_verify_and_a_decode_when_cheap(tmp_path):
    from pml_suprank.data.image_check import bad_images_message, check_image_files

    good = tmp_path / "good.png"
    _png(good, 0)
    data = good.read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])  # truncated: verify() hits the end of the file
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3)).astype(np.uint8)).save(buffer, "JPEG")
    jpeg = buffer.getvalue()
    (tmp_path / "good.jpg").write_bytes(jpeg)
    (tmp_path / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 2])  # truncated JPEG: only a decode finds it
    (tmp_path / "empty.png").write_bytes(b"")
    over = tmp_path / "over.png"  # just over PIL's limit: PIL itself would only warn and then decode it
    over.write_bytes(_bomb_png(Image.MAX_IMAGE_PIXELS // 1000 + 1, 1000))
    names = ["good.png", "cut.png", "good.jpg", "cut.jpg", "empty.png", "over.png"]
    found = {}
    for decode in (False, True, None):  # None: these few pixels are decoded fully
        message = bad_images_message([(n, tmp_path / n) for n in names], what="mine", decode=decode)
        found[decode] = sorted(line.split(":")[0].strip() for line in message.splitlines()[1:-1])
        assert message.startswith(f"mine: {len(found[decode])} of 6 images cannot be used")
    assert found[True] == found[None] == ["cut.jpg", "cut.png", "empty.png", "over.png"]
    assert found[False] == ["cut.png", "empty.png", "over.png"]  # header and verify() only: the JPEG's data is unread
    check_image_files([good, tmp_path / "good.jpg"], what="fine")  # usable images pass
    assert bad_images_message([("bytes", data), ("junk", b"junk")], what="b").count("not an image") == 1


def test_the_error_lists_the_first_bad_files_and_counts_the_others(tmp_path):
    from pml_suprank.data.image_check import MAX_LISTED, check_image_files

    paths = []
    for i in range(MAX_LISTED + 5):
        paths.append(tmp_path / f"{i:02d}.jpg")
        paths[-1].write_text("text")
    with pytest.raises(ValueError) as info:
        check_image_files(paths, what="--queries q")
    lines = str(info.value).splitlines()
    assert lines[0] == f"--queries q: {MAX_LISTED + 5} of {MAX_LISTED + 5} images cannot be used (checked before " \
        "training or searching):"  # fmt: skip
    assert sum(line.endswith("not an image (PIL cannot identify its format)") for line in lines) == MAX_LISTED
    assert "  ... and 5 more" in lines


def test_search_queries_with_a_bad_file_are_refused_before_the_search(tmp_path):
    from pml_suprank.search.image_files import ImageFiles

    _png(tmp_path / "q" / "a.png", 0)
    (tmp_path / "q" / "sub").mkdir()
    (tmp_path / "q" / "sub" / "fake.jpg").write_text("text")
    with pytest.raises(ValueError) as info:
        ImageFiles(tmp_path / "q", what=f"--queries {tmp_path / 'q'}")
    assert f"--queries {tmp_path / 'q'}: 1 of 2 images cannot be used" in str(info.value)
    assert f"{tmp_path / 'q' / 'sub' / 'fake.jpg'}: not an image" in str(info.value)


# ------------------------------------------------------------------------------------------------------------------
# the loader's refusals are messages
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("file_name", "expected"),
    [
        ("../outside.png", r"row 3 \(column 'file_name'\): path '../outside.png' has a '..' component"),
        ("/abs/outside.png", r"row 3 \(column 'file_name'\): path '/abs/outside.png' is absolute"),
        ("missing.png", r"row 3 \(column 'file_name'\): 'missing.png' does not exist"),
        ("notes.txt", r"row 3 \(column 'file_name'\): 'notes.txt' is not an image file"),
    ],
)
def test_a_metadata_path_that_is_not_an_image_inside_the_folder_is_a_message(tmp_path, file_name, expected):
    root = tmp_path / "meta"
    for i in range(2):
        _png(root / f"a{i}.png", i)
    _png(tmp_path / "outside.png", 9)
    (root / "notes.txt").write_text("x")
    (root / "metadata.csv").write_text(f"file_name,label\na0.png,x\na1.png,y\n{file_name},z\n")
    with pytest.raises(ValueError, match=r"meta/metadata\.csv, " + expected):
        load_retrieval_dataset(root, ["label"])
    jsonl = tmp_path / "jsonl"
    _png(jsonl / "a0.png", 0)
    (jsonl / "metadata.jsonl").write_text('{"file_name": "a0.png", "label": "x"}\n[1]\n')
    with pytest.raises(ValueError, match=r"metadata\.jsonl, line 2: not a JSON object \(got list\)"):
        load_retrieval_dataset(jsonl, ["label"])


def test_label_columns_none_takes_a_folders_levels_and_is_refused_elsewhere(tmp_path):
    import datasets

    root = tmp_path / "flat"
    for name in ("cat", "dog"):
        for i in range(2):
            _png(root / name / f"{i}.png", i)
    ds = load_retrieval_dataset(root, None)
    assert ds.label_names == ["label"] and sorted(ds.class_names.values()) == ["cat", "dog"]
    table = datasets.Dataset.from_dict({"image": [np.zeros((2, 2, 3), np.uint8)] * 2, "label": [0, 1]})
    with pytest.raises(ValueError, match=r"label_columns=None: the label columns of Dataset .* must be named"):
        load_retrieval_dataset(table, None)
    with pytest.raises(ValueError, match=r"label_columns must be a non-empty list of column names .* got 3"):
        load_retrieval_dataset(table, 3)


def test_a_missing_split_names_the_splits_and_the_option_to_change(tmp_path):
    root = _nested(tmp_path / "nosplit")
    with pytest.raises(ValueError, match=r"split='test' is not in .*available splits: \['train'\] .*--split"):
        load_retrieval_dataset(root, None, "test")
