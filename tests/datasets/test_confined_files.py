"""Files stay inside their dataset folder, and loader errors name the file and line (issue 20, items 2 and 6).

Every reproduction here read a file outside the dataset or failed without naming the file before the change.
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _benchmark_fixtures import MAKERS, image_bytes, make_cifar100, make_dyml, make_inat, make_omniglot, make_sop
from PIL import Image

from pml_suprank.data import load_retrieval_dataset
from pml_suprank.data.benchmarks import BENCHMARKS, load_benchmark
from pml_suprank.data.paths import PathConfiner, is_inside

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"password=hunter2\n"


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(SECRET)
    return path


def _append(path: Path, line: str) -> int:
    """Append ``line`` to a list file; return its 1-based line number."""
    lines = path.read_text().rstrip("\n").split("\n") + [line]
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


# --- the shared helper ------------------------------------------------------------------------------------------


def test_confined_path_joins_relative_parts(tmp_path):
    assert PathConfiner(tmp_path)("a", "b/c.jpg", where="list.txt, line 2") == str(tmp_path / "a" / "b" / "c.jpg")
    assert is_inside(tmp_path, tmp_path / "a") and not is_inside(tmp_path / "a", tmp_path)
    assert not is_inside(tmp_path / "ab", tmp_path / "abc" / "x")  # a sibling sharing a prefix is outside


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (("/etc/passwd",), r"list\.txt, line 2: path '/etc/passwd' is absolute"),
        (("imgs", "/etc/passwd"), r"list\.txt, line 2: path '/etc/passwd' is absolute"),
        (("../x.jpg",), r"list\.txt, line 2: path '\.\./x\.jpg' has a '\.\.' component"),
        (("a/../../x.jpg",), r"'\.\.' component"),
        (("a/../b.jpg",), r"'\.\.' component"),  # refused even when it would stay inside
    ],
)
def test_confined_path_refuses_absolute_and_dotdot(tmp_path, parts, message):
    with pytest.raises(ValueError, match=message):
        PathConfiner(tmp_path)(*parts, where="list.txt, line 2")


def test_confined_path_symlinks(tmp_path):
    root = tmp_path / "root"
    (root / "imgs").mkdir(parents=True)
    (root / "imgs" / "real.jpg").write_bytes(b"x")
    (root / "imgs" / "inside.jpg").symlink_to(root / "imgs" / "real.jpg")
    (root / "imgs" / "outside.jpg").symlink_to(_secret(tmp_path))
    (root / "linked").symlink_to(tmp_path / "outside", target_is_directory=True)
    assert PathConfiner(root)("imgs/inside.jpg", where="w").endswith("inside.jpg")
    with pytest.raises(ValueError, match=r"w: path .*outside\.jpg' leads outside .*secret\.txt"):
        PathConfiner(root)("imgs/outside.jpg", where="w")
    with pytest.raises(ValueError, match="leads outside"):
        PathConfiner(root)("linked", "secret.txt", where="w")
    # an absolute path is accepted only on request and only inside the root
    inside = str(root / "imgs" / "real.jpg")
    assert PathConfiner(root)(inside, where="w", allow_absolute=True) == inside
    with pytest.raises(ValueError, match="is absolute"):
        PathConfiner(root)(str(_secret(tmp_path)), where="w", allow_absolute=True)
    # a root reached through a symbolic link is fine
    (tmp_path / "alias").symlink_to(root, target_is_directory=True)
    assert PathConfiner(tmp_path / "alias")("imgs/real.jpg", where="w").endswith("real.jpg")


def test_one_confiner_for_many_paths_still_checks_every_file(tmp_path):
    root = tmp_path / "root"
    (root / "imgs").mkdir(parents=True)
    (root / "imgs" / "a.jpg").write_bytes(b"x")
    (root / "imgs" / "b.jpg").symlink_to(_secret(tmp_path))
    (root / "up").symlink_to(tmp_path / "outside", target_is_directory=True)
    confine = PathConfiner(root)
    assert confine("imgs/a.jpg", where="w") == str(root / "imgs" / "a.jpg")  # the folder is now resolved and cached
    with pytest.raises(ValueError, match=r"w: path .*b\.jpg' leads outside"):
        confine("imgs", "b.jpg", where="w")
    assert confine("imgs/missing.jpg", where="w").endswith("missing.jpg")  # existence is checked elsewhere
    with pytest.raises(ValueError, match="leads outside"):
        confine("up/secret.txt", where="w")


# --- the reproduction: an SOP list line naming a file outside the dataset -----------------------------------------


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink"])
def test_sop_list_line_outside_the_root_is_refused(tmp_path, kind):
    root = make_sop(tmp_path / "Stanford_Online_Products")
    secret = _secret(tmp_path)
    if kind == "absolute":
        listed, match = str(secret), "is absolute"
    elif kind == "dotdot":
        listed, match = "../outside/secret.txt", "'..' component"
    else:
        (root / "bicycle_final" / "2_9.JPG").symlink_to(secret)
        listed, match = "bicycle_final/2_9.JPG", "leads outside"
    line = _append(root / "Ebay_train.txt", f"99 2 1 {listed}")
    with pytest.raises(ValueError, match=rf"Ebay_train\.txt, line {line}: path .*{match}"):
        ds = load_benchmark("sop", root, "train")
        assert ds.image_record(len(ds) - 1)["bytes"] != SECRET  # what happened before: the secret was read


_FOLDER_BENCHMARKS = sorted(n for n in BENCHMARKS if n not in ("cifar100", "omniglot")) + ["omniglot_folders"]


@pytest.mark.parametrize("name", _FOLDER_BENCHMARKS)
def test_every_file_reader_refuses_a_symlink_leaving_the_root(name, tmp_path):
    """Every reader of image files: replace one listed image by a symbolic link to a file outside the root."""
    bench = "omniglot" if name == "omniglot_folders" else name
    make = (lambda r: make_omniglot(r, zipped=False)) if name == "omniglot_folders" else MAKERS[name]
    root = make(tmp_path / "native")
    split = BENCHMARKS[bench].splits[-1]
    target = Path(load_benchmark(bench, root, split).paths[0])
    secret = tmp_path / "outside.jpg"
    secret.write_bytes(image_bytes(7))
    target.unlink()
    target.symlink_to(secret)
    with pytest.raises(ValueError, match=r"leads outside .*outside\.jpg"):
        load_benchmark(bench, root, split)


def test_dyml_inat_and_revisited_list_entries_outside_the_root(tmp_path):
    secret = _secret(tmp_path)
    root = make_dyml(tmp_path / "dyml")
    line = _append(root / "train" / "label.csv", f"{secret}, 7, 3, 1")
    with pytest.raises(ValueError, match=rf"label\.csv, line {line}: path .* is absolute"):
        load_benchmark("dyml_vehicle", root, "train")
    root = make_inat(tmp_path / "inat")
    line = _append(root / "Inat_dataset_splits" / "Inaturalist_train_set1.txt", "train_val2018/../10/x.jpg")
    with pytest.raises(ValueError, match=rf"Inaturalist_train_set1\.txt, line {line}: path .*'\.\.' component"):
        load_benchmark("inat_base", root, "train")
    root = MAKERS["roxford5k"](tmp_path / "roxford")
    with open(root / "gnd_roxford5k.pkl", "rb") as f:
        content = pickle.load(f)
    content["imlist"][3] = "../../outside/secret_1"
    (root / "gnd_roxford5k.pkl").write_bytes(pickle.dumps(content, protocol=4))
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl, imlist\[3\]: path .*'\.\.' component"):
        load_benchmark("roxford5k", root, "gallery")


# --- Hugging Face sources: images stored by path ------------------------------------------------------------------


def _parquet_with_image_paths(folder: Path, paths: list[str]) -> Path:
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    rows = {"image": [{"bytes": None, "path": p} for p in paths], "label": [i % 2 for i in range(len(paths))]}
    out = folder / "train-0.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(out))
    return out


def test_parquet_image_paths_must_stay_in_the_source_folder(tmp_path):
    secret = tmp_path / "outside.png"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(secret)
    folder = tmp_path / "parquet"
    (folder / "imgs").mkdir(parents=True)
    inside = []
    for i in range(4):
        Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(folder / "imgs" / f"{i}.png")
        inside.append(str(folder / "imgs" / f"{i}.png"))
    ok = load_retrieval_dataset(str(_parquet_with_image_paths(folder, inside)), "label", "train")
    assert len(ok) == 4 and ok[3]["image"].shape == (3, 4, 4)
    _parquet_with_image_paths(folder, [*inside[:3], str(secret)])
    with pytest.raises(ValueError, match=r"split 'train', row 3 of the image column 'image': path .* is absolute"):
        load_retrieval_dataset(str(folder / "train-0.parquet"), "label", "train")
    (folder / "imgs" / "3.png").unlink()
    (folder / "imgs" / "3.png").symlink_to(secret)
    _parquet_with_image_paths(folder, inside)
    with pytest.raises(ValueError, match=r"row 3 of the image column 'image': path .* leads outside"):
        load_retrieval_dataset(str(folder / "*.parquet"), "label", "train")


def test_imagefolder_symlink_leaving_the_folder_is_refused(tmp_path):
    folder = tmp_path / "folder"
    (folder / "train").mkdir(parents=True)
    lines = ["file_name,label"]
    for i in range(4):
        Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(folder / "train" / f"{i}.png")
        lines.append(f"{i}.png,{i % 2}")
    (folder / "train" / "metadata.csv").write_text("\n".join(lines) + "\n")
    assert len(load_retrieval_dataset(str(folder), "label", "train")) == 4
    secret = tmp_path / "outside.png"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(secret)
    (folder / "train" / "1.png").unlink()
    (folder / "train" / "1.png").symlink_to(secret)
    # refused where the path is read: the metadata row naming it
    with pytest.raises(ValueError, match=r"metadata\.csv, row 2 \(column 'file_name'\): path .*1\.png' leads outside"):
        load_retrieval_dataset(str(folder), "label", "train", cache_dir=str(tmp_path / "cache"))


# --- errors that name the file ------------------------------------------------------------------------------------


def test_truncated_omniglot_zip_names_the_archive(tmp_path):
    root = make_omniglot(tmp_path)
    archive = sorted(root.glob("*.zip"))[0]
    archive.write_bytes(archive.read_bytes()[:-40])  # the end-of-central-directory record is gone
    with pytest.raises(ValueError, match=rf"{archive.name}: not a readable zip archive"):
        load_benchmark("omniglot", root, "train")


def test_corrupt_zip_member_names_archive_and_entry(tmp_path):
    root = make_omniglot(tmp_path)
    ds = load_benchmark("omniglot", root, "train")
    archive, member = ds.members[0]
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo(member)
    data = bytearray(Path(archive).read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + 20 : start + 30] = bytes(10)  # damage the stored data: CRC mismatch
    Path(archive).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{Path(archive).name}, entry {member}: cannot read the zip member"):
        load_benchmark("omniglot", root, "train")[0]


def test_non_utf8_list_file_names_file_and_line(tmp_path):
    root = make_sop(tmp_path)
    path = root / "Ebay_train.txt"
    path.write_bytes(path.read_bytes() + b"9 1 1 bicycle_final/\xff\xfe.JPG\n")
    with pytest.raises(ValueError, match=r"Ebay_train\.txt, line 8: not UTF-8 text"):
        load_benchmark("sop", root, "train")
    root = make_inat(tmp_path / "inat")
    (root / "Inat_dataset_splits" / "Inaturalist_test_set1.txt").write_bytes(b"\xe9t\xe9\n")
    with pytest.raises(ValueError, match=r"Inaturalist_test_set1\.txt, line 1: not UTF-8 text"):
        load_benchmark("inat_base", root, "test")


@pytest.mark.parametrize("bad", ["3", 1.5, None, True])
def test_non_integer_cifar_label_names_file_and_item(tmp_path, bad):
    root = make_cifar100(tmp_path)
    path = root / "cifar-100-python" / "test"
    with open(path, "rb") as f:
        content = pickle.load(f, encoding="bytes")
    content[b"coarse_labels"][4] = bad
    path.write_bytes(pickle.dumps(content, protocol=2))
    with pytest.raises(ValueError, match=r"cifar-100-python/test, coarse_labels\[4\]: labels must be integers"):
        load_benchmark("cifar100", root, "train")


def test_corrupt_image_fails_naming_the_file(tmp_path):
    root = make_sop(tmp_path)
    ds = load_benchmark("sop", root, "train")
    Path(ds.paths[2]).write_bytes(image_bytes(3)[:60])  # a truncated JPEG
    with pytest.raises(ValueError, match=r"sop train item 2 \(.*bicycle_final/2_2\.JPG\): cannot decode the image"):
        ds[2]
    Path(ds.paths[3]).write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"item 3 \(.*2_3\.JPG\): cannot decode the image \(UnidentifiedImageError"):
        ds.get_image(3)


def test_corrupt_image_of_a_datasets_copy_names_the_row(tmp_path):
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    good = image_bytes(1, "PNG")
    rows = {"image": [{"bytes": good, "path": "a.png"}, {"bytes": b"garbage", "path": "b.png"}], "label": [0, 1]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "copy"))
    ds = load_retrieval_dataset(str(tmp_path / "copy"), "label", "train")
    assert ds[0]["image"].shape == (3, 8, 8)
    with pytest.raises(ValueError, match=r"row 1 of the image column 'image' \(b\.png\): cannot decode the image"):
        ds[1]


def test_batch_sampler_passed_as_sampler_gets_a_hint(tmp_path):
    ds = load_benchmark("sop", make_sop(tmp_path), "train")
    with pytest.raises(TypeError, match=r"got list; .*DataLoader\(batch_sampler=\.\.\.\)"):
        ds[[0, 1]]


# --- prepare_dataset.py decodes every image before writing it -----------------------------------------------------


def _import_prepare():
    from pml_suprank.recipes import prepare_dataset

    return prepare_dataset


@pytest.mark.parametrize("content", [SECRET, b"", image_bytes(5)[:100]], ids=["text", "empty", "truncated"])
def test_prepare_dataset_refuses_a_non_image(tmp_path, content, capsys):
    prepare = _import_prepare()
    root = make_sop(tmp_path / "native")
    bad = root / "chair_final" / "3_4.JPG"
    bad.write_bytes(content)
    out = tmp_path / "copy"
    with pytest.raises(SystemExit) as e:  # one error line, exit 2
        prepare.main(["sop", "--root", str(root), "--output_dir", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(r"error: sop train item 4 \(.*chair_final/3_4\.JPG\): not a decodable image", err)
    assert not (out / "dataset_dict.json").exists() and not (out / "benchmark.json").exists()


def test_check_image_accepts_images_and_names_the_source():
    prepare = _import_prepare()
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((3, 3, 3), np.uint8)).save(buffer, format="PNG")
    prepare.check_image(buffer.getvalue(), "x.png")
    with pytest.raises(ValueError, match=r"^x\.png: not a decodable image"):
        prepare.check_image(b"GIF89a" + bytes(10), "x.png")
