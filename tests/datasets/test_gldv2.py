"""H-GLDv2 (gldv2_hier) and revisited Oxford / Paris (roxford5k, rparis6k) on tiny archives in their native layouts:
labels, protocol splits, query crops, the ground truth, bad layouts naming file and line, malicious pickles refused."""

from __future__ import annotations

import importlib
import io
import pickle
from pathlib import Path

import _hub_helpers
import numpy as np
import pytest
import torch
from _benchmark_fixtures import (
    GLDV2_QUERIES,
    REVISITED_GND,
    REVISITED_IMLIST,
    REVISITED_QIMLIST,
    gldv2_id,
    make_gldv2,
    make_revisited,
)
from PIL import Image

from pml_suprank.data.benchmarks import BENCHMARKS, load_benchmark
from pml_suprank.data.benchmarks.cifar100 import load_restricted_pickle
from pml_suprank.data.benchmarks.roxford import RevisitedQueryDataset, read_revisited_gnd
from pml_suprank.metrics.landmark import landmark_map_at_k, revisited_map
from pml_suprank.relevance import check_tree
from pml_suprank.training import hub_config


def _rewrite(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


# ------------------------------------------------------------------------------------------------------------------
# H-GLDv2


def test_gldv2_train_levels_and_landmarks_without_cluster_left_out(tmp_path):
    root = make_gldv2(tmp_path)
    train = load_benchmark("gldv2_hier", root, "train")
    assert train.label_names == ["landmark_id", "cluster", "overall_cluster"]
    # landmarks 1, 2, 4 (3 has no cluster); clusters castle, church, lake -> 0, 1, 2; human-made, natural -> 0, 1
    assert train.labels.tolist() == [[0, 1, 0]] * 2 + [[1, 0, 0]] * 2 + [[2, 2, 1]] * 3
    image_id = gldv2_id("train", 10)
    assert train.names[0] == f"train/{image_id[0]}/{image_id[1]}/{image_id[2]}/{image_id}.jpg"
    check_tree(train.labels)


def test_gldv2_query_and_gallery_share_one_label_space(tmp_path):
    root = make_gldv2(tmp_path)
    query = load_benchmark("gldv2_hier", root, "query")
    gallery = load_benchmark("gldv2_hier", root, "gallery")
    # gallery: landmarks 10 (x3), 11 (x2), 13 (x1); 12 has no cluster. bridge, waterfall -> 0, 1
    assert gallery.labels.tolist() == [[0, 0, 0]] * 3 + [[1, 1, 1]] * 2 + [[2, 0, 0]]
    # queries: test images 0 (landmark 10), 1 (11) and 4 (10); 2 has no ground truth, 3 is landmark 12 (no cluster)
    assert query.labels.tolist() == [[0, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert [n.rsplit("/", 1)[1] for n in query.names] == [f"{gldv2_id('test', q)}.jpg" for q in (0, 1, 4)]
    assert all(n.startswith("test/") for n in query.names) and all(n.startswith("index/") for n in gallery.names)
    assert len(GLDV2_QUERIES) == 5
    spec = BENCHMARKS["gldv2_hier"]
    assert spec.splits == ("train", "query", "gallery") and spec.test_split is None


def test_gldv2_map_at_100_on_the_fixture(tmp_path):
    root = make_gldv2(tmp_path)
    query = load_benchmark("gldv2_hier", root, "query")
    gallery = load_benchmark("gldv2_hier", root, "gallery")
    positives = query.labels[:, None, 0] == gallery.labels[None, :, 0]
    perfect = positives.float()  # an oracle embedding: every positive above every negative
    assert landmark_map_at_k(perfect, positives).tolist() == [1.0, 1.0, 1.0]
    coarse_only = (query.labels[:, None, 1] == gallery.labels[None, :, 1]).float()  # landmark 13 ties with 10
    # query of landmark 10: 3 positives tied with the one other bridge -> pessimistic ranks 2, 3, 4
    assert landmark_map_at_k(coarse_only, positives)[0].item() == pytest.approx((1 / 2 + 2 / 3 + 3 / 4) / 3)


def test_gldv2_missing_file_and_wrong_columns(tmp_path):
    root = make_gldv2(tmp_path)
    (root / "retrieval_solution_v2.1.csv").unlink()
    with pytest.raises(ValueError, match=r"retrieval_solution_v2\.1\.csv: missing file"):
        load_benchmark("gldv2_hier", root, "gallery")
    assert len(load_benchmark("gldv2_hier", root, "train")) == 7
    _rewrite(root / "train_clean.csv", "landmark_id,images", "landmark,images")
    with pytest.raises(ValueError, match=r"train_clean\.csv, line 1: expected the columns \['landmark_id', 'images'\]"):
        load_benchmark("gldv2_hier", root, "train")
    hierarchy = root / "index_label_to_subcategory_with_clusters.csv"
    _rewrite(hierarchy, "overall_cluster", "overall")
    with pytest.raises(
        ValueError, match=r"index_label_to_subcategory_with_clusters\.csv, line 1: expected columns incl"
    ):
        load_benchmark("gldv2_hier", root, "query")


def test_gldv2_bad_rows_name_file_and_line(tmp_path):
    root = make_gldv2(tmp_path)
    index = root / "index_image_to_landmark.csv"
    _rewrite(index, f"{gldv2_id('index', 101)},10", f"{gldv2_id('index', 101)},ten")
    with pytest.raises(ValueError, match=r"index_image_to_landmark\.csv, line 3: column 'landmark_id' must be an int"):
        load_benchmark("gldv2_hier", root, "gallery")
    _rewrite(index, f"{gldv2_id('index', 101)},ten", f"{gldv2_id('index', 101)},10,x")
    with pytest.raises(ValueError, match=r"index_image_to_landmark\.csv, line 3: expected 2 cells"):
        load_benchmark("gldv2_hier", root, "gallery")
    _rewrite(index, f"{gldv2_id('index', 101)},10,x", f"{gldv2_id('index', 101)},11")
    with pytest.raises(ValueError, match=r"retrieval_solution_v2\.1\.csv, line 2: the solution images depict several"):
        load_benchmark("gldv2_hier", root, "query")
    _rewrite(index, f"{gldv2_id('index', 101)},11", "-/x,10")
    with pytest.raises(
        ValueError, match=r"index_image_to_landmark\.csv, line 3: image id '-/x' must be an alphanumeric"
    ):
        load_benchmark("gldv2_hier", root, "gallery")


def test_gldv2_solution_image_not_in_the_index(tmp_path):
    root = make_gldv2(tmp_path)
    _rewrite(root / "retrieval_solution_v2.1.csv", gldv2_id("index", 110), "0123456789abcdef")
    with pytest.raises(ValueError, match=r"retrieval_solution_v2\.1\.csv, line 3: solution image '0123456789abcdef'"):
        load_benchmark("gldv2_hier", root, "query")


def test_gldv2_image_that_does_not_exist(tmp_path):
    root = make_gldv2(tmp_path)
    image_id = gldv2_id("train", 20)
    (root / "train" / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg").unlink()
    with pytest.raises(ValueError, match=rf"train_clean\.csv, line 3: image .*{image_id}\.jpg does not exist"):
        load_benchmark("gldv2_hier", root, "train")


def test_gldv2_hierarchy_must_be_a_tree(tmp_path):
    root = make_gldv2(tmp_path)
    train_hierarchy = root / "train_label_to_subcategory_with_clusters.csv"
    _rewrite(train_hierarchy, ",lake,natural", ",church,natural")
    with pytest.raises(
        ValueError, match=r"with_clusters\.csv, line 5: cluster 'church' has overall_cluster 'natural' "
    ):
        load_benchmark("gldv2_hier", root, "train")
    _rewrite(train_hierarchy, ",church,natural", ",lake,natural")
    train_hierarchy.write_text(train_hierarchy.read_text() + "1,x,castle,human-made\n")
    with pytest.raises(ValueError, match=r"with_clusters\.csv, line 6: landmark_id 1 has cluster 'castle'.* at line 2"):
        load_benchmark("gldv2_hier", root, "train")


# ------------------------------------------------------------------------------------------------------------------
# revisited Oxford / Paris


@pytest.mark.parametrize("name", ["roxford5k", "rparis6k"])
def test_revisited_query_and_gallery(name, tmp_path):
    root = make_revisited(tmp_path / name, name)
    query, gallery = load_benchmark(name, root, "query"), load_benchmark(name, root, "gallery")
    assert isinstance(query, RevisitedQueryDataset) and query.label_names == ["landmark"]
    # all_souls, oxford, radcliffe_camera -> 0, 1, 2 over query and gallery
    assert gallery.labels[:, 0].tolist() == [0, 0, 2, 1] and query.labels[:, 0].tolist() == [0, 2]
    assert gallery.names == [f"jpg/{n}.jpg" for n in REVISITED_IMLIST]
    assert query.names == [f"jpg/{n}.jpg" for n in REVISITED_QIMLIST]
    assert [g["easy"].tolist() for g in query.gnd] == [[0, 1], [2]]
    assert query.gnd[1]["hard"].dtype == np.int64 and query.gnd[0]["bbx"] == (1.0, 1.0, 7.0, 6.0)
    assert BENCHMARKS[name].test_split is None and BENCHMARKS[name].train_split == "gallery"


def test_revisited_queries_are_cropped_to_their_bbx(tmp_path):
    root = make_revisited(tmp_path)
    query = load_benchmark("roxford5k", root, "query")
    full = Image.open(root / "jpg" / "all_souls_000001.jpg").convert("RGB")
    crop = query.get_image(0)
    assert crop.size == (6, 5)
    np.testing.assert_array_equal(np.asarray(crop), np.asarray(full)[1:6, 1:7])
    assert query[1]["image"].shape == (3, 6, 5)  # bbx [0, 2, 5, 8] of an 8x8 image
    assert Image.open(io.BytesIO(query.image_record(0)["bytes"])).size == (6, 5)
    gallery = load_benchmark("roxford5k", root, "gallery")
    assert gallery[0]["image"].shape == (3, 8, 8)


def test_revisited_evaluation_from_the_loaded_ground_truth(tmp_path):
    root = make_revisited(tmp_path)
    query = load_benchmark("roxford5k", root, "query")
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.8], [0.1, 0.2, 0.9, 0.3]])
    out = revisited_map(scores, query.gnd, kappas=(1,))
    # query 0, easy {0, 1}, junk {3}: kept ranking 0, 2, 1 -> positives at 0 and 2: (1 + (1/2 + 2/3) / 2) / 2
    # query 1, easy {2}, hard {3}: Easy ranking (3 ignored) 2, 1, 0 -> AP 1; Hard ranking (2 ignored) 3, 1, 0 -> 1
    assert out["easy_map"] == pytest.approx(((1 + 7 / 12) / 2 + 1) / 2)
    assert out["hard_map"] == pytest.approx(1.0)
    assert out["medium_map"] == pytest.approx(((1 + 7 / 12) / 2 + 1) / 2)


class _Payload:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_malicious_ground_truth_pickle_is_refused(tmp_path):
    root = make_revisited(tmp_path)
    target = tmp_path / "pwned"
    content = {"imlist": REVISITED_IMLIST, "qimlist": REVISITED_QIMLIST, "gnd": [_Payload(str(target))]}
    (root / "gnd_roxford5k.pkl").write_bytes(pickle.dumps(content))
    with pytest.raises(
        ValueError,
        match=r"gnd_roxford5k\.pkl: not a readable revisited ground-truth pickle \(global io\.open is not allowed",
    ):
        load_benchmark("roxford5k", root, "query")
    assert not target.exists()
    with pytest.raises(ValueError, match=r"evil\.pkl: missing file \(x\)"):
        load_restricted_pickle(tmp_path / "evil.pkl", "x")


def test_revisited_bad_ground_truth_names_file_and_entry(tmp_path):
    root = make_revisited(tmp_path)
    path = root / "gnd_roxford5k.pkl"

    def write(**changes):
        content = {"imlist": REVISITED_IMLIST, "qimlist": REVISITED_QIMLIST, "gnd": REVISITED_GND} | changes
        path.write_bytes(pickle.dumps(content))

    write(gnd=REVISITED_GND[:1])
    with pytest.raises(
        ValueError, match=r"gnd_roxford5k\.pkl, gnd: expected one dict per query \(2 in qimlist\); got 1"
    ):
        read_revisited_gnd(path)
    write(gnd=[REVISITED_GND[0], {**REVISITED_GND[1], "hard": [4]}])
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl, gnd\[1\]\['hard'\]: indices must lie in \[0, 4\)"):
        load_benchmark("roxford5k", root, "gallery")
    write(gnd=[REVISITED_GND[0], {**REVISITED_GND[1], "bbx": [5, 2, 0, 8]}])
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl, gnd\[1\]\['bbx'\]: bbx must be \[x1, y1, x2, y2\]"):
        load_benchmark("roxford5k", root, "query")
    write(gnd=[REVISITED_GND[0], {"easy": [2], "bbx": [0, 0, 1, 1]}])
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl, gnd\[1\]: expected a dict with easy, hard, junk, bbx"):
        load_benchmark("roxford5k", root, "query")
    path.write_bytes(pickle.dumps({"imlist": REVISITED_IMLIST}))
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl: missing keys \['qimlist', 'gnd'\]"):
        load_benchmark("roxford5k", root, "query")
    write(imlist=["all_souls"] + REVISITED_IMLIST[1:])
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl, imlist\[0\]: image name 'all_souls' does not end in"):
        load_benchmark("roxford5k", root, "gallery")
    write()
    (root / "jpg" / "oxford_000100.jpg").unlink()
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl, imlist\[3\]: image .*oxford_000100\.jpg does not exist"):
        load_benchmark("roxford5k", root, "gallery")
    path.unlink()
    with pytest.raises(ValueError, match=r"gnd_roxford5k\.pkl: missing file"):
        load_benchmark("roxford5k", root, "query")
    with pytest.raises(ValueError, match=r"gnd_rparis6k\.pkl: missing file"):
        load_benchmark("rparis6k", root, "query")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["roadmap_gldv2", "happier_gldv2"])
def test_gldv2_hub_configs_read_a_prepared_copy(config, tmp_path):
    """The label columns and splits of the shipped configs fit a prepared copy: only ``dataset`` changes."""
    repo = Path(__file__).resolve().parents[2]
    prepare = importlib.import_module("pml_suprank.recipes.prepare_dataset")
    root = make_gldv2(tmp_path / "native")
    prepare.prepare("gldv2_hier", root, tmp_path / "copy")
    cfg = hub_config.load_hub_config(repo / "pml_suprank" / "hub_configs" / f"{config}.yaml")
    assert cfg["model"]["pooling"] == "gem" and cfg["training"]["max_train_steps"] == 55000
    cfg["data"]["dataset"] = str(tmp_path / "copy")
    for part, split in (("train", "train"), ("test", "query")):
        built = _hub_helpers.build_dataset(cfg, part)
        assert torch.equal(built.labels, load_benchmark("gldv2_hier", root, split).labels), (config, part)
