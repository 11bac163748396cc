"""RetrievalIndex.load refuses tampered, swapped, incomplete or inconsistent folders with errors naming the file."""

from __future__ import annotations

import json

import pytest
import torch

from pml_suprank.hub.serialization import sha256_file
from pml_suprank.search import RetrievalIndex
from pml_suprank.search.storage import JSON_NAME, TENSORS_NAME

pytest.importorskip("safetensors")


@pytest.fixture
def saved(tmp_path):
    g = torch.Generator().manual_seed(0)
    index = RetrievalIndex(
        torch.randn(12, 4, generator=g), labels=torch.arange(12) % 3, ids=[f"i{j}" for j in range(12)]
    )
    return index.save(tmp_path / "idx")


def _edit_json(folder, **changes):
    meta = json.loads((folder / JSON_NAME).read_text())
    meta.update(changes)
    (folder / JSON_NAME).write_text(json.dumps(meta))


def _rewrite_tensors(folder, tensors):
    from safetensors.torch import save_file

    save_file(tensors, str(folder / TENSORS_NAME))
    _edit_json(folder, sha256=sha256_file(folder / TENSORS_NAME))  # a consistent checksum: only the content is wrong


def test_round_trip_keeps_everything(saved):
    loaded = RetrievalIndex.load(saved)
    assert len(loaded) == 12 and loaded.ids[3] == "i3" and loaded.labels.tolist() == [j % 3 for j in range(12)]
    meta = json.loads((saved / JSON_NAME).read_text())
    assert meta["format"] == "pml_suprank.RetrievalIndex" and meta["label_shape"] == [] and meta["dim"] == 4


def test_modified_tensor_file_is_refused(saved):
    data = bytearray((saved / TENSORS_NAME).read_bytes())
    data[-3] ^= 0xFF
    (saved / TENSORS_NAME).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the sha256 recorded"):
        RetrievalIndex.load(saved)


def test_wrong_shapes_names_and_values_are_refused(saved):
    _rewrite_tensors(saved, {"embeddings": torch.zeros(12, 5), "labels": torch.zeros(12, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"'embeddings' has shape .*; dimension 1 must be 4 \(D, as index\.json\)"):
        RetrievalIndex.load(saved)
    _rewrite_tensors(saved, {"embeddings": torch.zeros(12, 4)})
    with pytest.raises(ValueError, match=r"has no tensor 'labels'"):
        RetrievalIndex.load(saved)
    _rewrite_tensors(saved, {"embeddings": torch.full((12, 4), float("nan")), "labels": torch.zeros(12).long()})
    with pytest.raises(ValueError, match="'embeddings' holds NaN or infinite values"):
        RetrievalIndex.load(saved)
    _rewrite_tensors(saved, {"embeddings": torch.zeros(12, 4).double(), "labels": torch.zeros(12).long()})
    with pytest.raises(ValueError, match="'embeddings' must be torch.float32 as .*index.json says; got torch.float64"):
        RetrievalIndex.load(saved)
    _rewrite_tensors(saved, {"embeddings": torch.zeros(12, 4), "labels": torch.zeros(12, dtype=torch.int32)})
    with pytest.raises(ValueError, match="'labels' must be torch.int64 as .*index.json says; got torch.int32"):
        RetrievalIndex.load(saved)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "other"}, "'format' must be"),
        ({"extra": 1}, r"unknown keys \['extra'\]"),
        ({"backend": "annoy"}, "'backend' must be one of"),
        ({"dim": -1}, "'dim' must be an int >= 1"),
        ({"num_items": True}, "'num_items' must be an int >= 1; got bool"),
        ({"dtype": "float16"}, "'dtype' must be one of"),
        ({"options": {"nlist": 4}}, "'options': nlist applies to backend='faiss-ivf'; got backend='torch'"),
        ({"ids": ["a"]}, "ids must have one id per embedding"),
        ({"label_shape": [0]}, "'label_shape' must be null"),
        ({"format_version": 2}, "unsupported format_version"),
    ],
)
def test_inconsistent_json_is_refused(saved, changes, message):
    _edit_json(saved, **changes)
    with pytest.raises(ValueError, match=message):
        RetrievalIndex.load(saved)


def test_missing_or_unreadable_files(saved, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        RetrievalIndex.load(tmp_path / "nowhere")
    (saved / JSON_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON file"):
        RetrievalIndex.load(saved)
    (saved / TENSORS_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="index.safetensors is missing"):
        RetrievalIndex.load(saved)


def _edit_options(folder, **changes):
    meta = json.loads((folder / JSON_NAME).read_text())
    meta["options"].update(changes)
    (folder / JSON_NAME).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("backend", "changes", "message"),
    [
        ("faiss-ivf", {"nlist": 10**12}, "nlist must be <= 2147483647; got 1000000000000"),
        ("faiss-ivf", {"nlist": 13}, "backend='faiss-ivf' needs at least nlist=13 embeddings to train its 13 cells"),
        ("faiss-ivf", {"nprobe": 4}, "nprobe must be <= nlist=3; got 4"),
        ("faiss-hnsw", {"hnsw_m": 10**7}, "hnsw_m must be <= 512; got 10000000"),
        ("faiss-hnsw", {"hnsw_m": 2**40}, "hnsw_m must be <= 512; got 1099511627776"),
        ("faiss-hnsw", {"ef_search": 2**31}, "ef_search must be <= 65536; got 2147483648"),
        ("faiss-hnsw", {"ef_construction": 1.5}, "ef_construction must be an int >= 1; got float 1.5"),
        ("faiss-hnsw", {"nlist": 4}, "nlist applies to backend='faiss-ivf'; got backend='faiss-hnsw'"),
    ],
)
def test_tampered_options_are_refused_before_faiss_allocates(tmp_path, backend, changes, message):
    pytest.importorskip("faiss")
    g = torch.Generator().manual_seed(1)
    options = {"nlist": 3, "nprobe": 2} if backend == "faiss-ivf" else {"hnsw_m": 4}
    folder = RetrievalIndex(torch.randn(12, 4, generator=g), backend=backend, **options).save(tmp_path / "idx")
    _edit_options(folder, **changes)
    with pytest.raises(ValueError, match=rf"index\.json: 'options': {message}"):
        RetrievalIndex.load(folder)


@pytest.mark.parametrize("shape", [5, "L", {"L": 2}, [2, 3], [True]])
def test_label_shape_of_the_wrong_type_is_refused(saved, shape):
    _edit_json(saved, label_shape=shape)
    with pytest.raises(ValueError, match=r"index\.json: 'label_shape' must be null, \[\] or \[L\]"):
        RetrievalIndex.load(saved)


def test_tensor_file_linked_from_outside_the_folder_is_refused(saved, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    (saved / TENSORS_NAME).rename(outside)
    before = outside.read_bytes()
    (saved / TENSORS_NAME).symlink_to(outside)
    with pytest.raises(ValueError, match=r"index\.safetensors is a symbolic link to .*outside the index folder"):
        RetrievalIndex.load(saved)
    with pytest.raises(ValueError, match="outside the index folder"):  # save does not write through it either
        RetrievalIndex(torch.zeros(2, 4)).save(saved)
    assert outside.read_bytes() == before


def test_link_inside_the_folder_is_accepted(saved):
    (saved / "data.safetensors").write_bytes((saved / TENSORS_NAME).read_bytes())
    (saved / TENSORS_NAME).unlink()
    (saved / TENSORS_NAME).symlink_to("data.safetensors")
    assert len(RetrievalIndex.load(saved)) == 12
