"""Tiny benchmark archives in each native layout, generated in a temporary folder (a few small images per class).

Each ``make_<name>(root)`` writes the layout and returns the folder to pass to ``load_benchmark``.
"""

from __future__ import annotations

import json
import pickle
import zipfile
import zlib
from io import BytesIO
from pathlib import Path

import numpy as np
from PIL import Image


def image_bytes(seed: int, fmt: str = "JPEG", size: int = 8) -> bytes:
    """A small deterministic RGB image encoded as ``fmt``."""
    rng = np.random.default_rng(seed)
    buffer = BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


def write_image(path: Path, seed: int, fmt: str = "JPEG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image_bytes(seed, fmt))


# SOP: products 1-3 train (1, 2 bicycle; 3 chair), 4-5 test (4 bicycle, 5 chair); two images per product.
SOP_ROWS = {
    "train": [(1, 1), (1, 1), (2, 1), (2, 1), (3, 2), (3, 2)],
    "test": [(4, 1), (4, 1), (5, 2), (5, 2)],
}
_SOP_FOLDERS = {1: "bicycle_final", 2: "chair_final"}


def make_sop(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    image_id = 0
    for split, rows in SOP_ROWS.items():
        lines = ["image_id class_id super_class_id path"]
        for k, (cls, sup) in enumerate(rows):
            image_id += 1
            rel = f"{_SOP_FOLDERS[sup]}/{cls}_{k}.JPG"
            write_image(root / rel, image_id)
            lines.append(f"{image_id} {cls} {sup} {rel}")
        (root / f"Ebay_{split}.txt").write_text("\n".join(lines) + "\n")
    return root


CUB_CLASSES = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross", "004.Groove_billed_Ani"]


def make_cub(root: Path) -> Path:
    for c, name in enumerate(CUB_CLASSES):
        for k in range(2 + c % 2):  # 2, 3, 2, 3 images
            write_image(root / "CUB_200_2011" / "images" / name / f"{name.split('.')[1]}_{k:04d}.jpg", 10 * c + k)
    return root


# iNat: category id -> (supercategory, kingdom, phylum, class, order, family, genus); genus "Alpha" occurs in two
# families (a homonym that must stay two genera).
INAT_CATEGORIES = {
    10: ("Plantae", "Plantae", "Tracheophyta", "Magnoliopsida", "Rosales", "Rosaceae", "Rosa"),
    11: ("Plantae", "Plantae", "Tracheophyta", "Magnoliopsida", "Rosales", "Rosaceae", "Prunus"),
    20: ("Insecta", "Animalia", "Arthropoda", "Insecta", "Lepidoptera", "Nymphalidae", "Alpha"),
    21: ("Insecta", "Animalia", "Arthropoda", "Insecta", "Lepidoptera", "Pieridae", "Alpha"),
    22: ("Aves", "Animalia", "Chordata", "Aves", "Passeriformes", "Corvidae", "Corvus"),
}
INAT_SPLIT_CATEGORIES = {"train": [10, 20, 22], "test": [11, 21]}
_RANKS = ("kingdom", "phylum", "class", "order", "family", "genus")


def make_inat(root: Path) -> Path:
    (root / "Inat_dataset_splits").mkdir(parents=True, exist_ok=True)
    for split, cats in INAT_SPLIT_CATEGORIES.items():
        lines = []
        for cid in cats:
            for k in range(2):
                rel = f"train_val2018/{INAT_CATEGORIES[cid][0]}/{cid}/{cid}_{k}.jpg"
                write_image(root / rel, cid * 10 + k)
                lines.append(rel)
        (root / "Inat_dataset_splits" / f"Inaturalist_{split}_set1.txt").write_text("\n".join(lines) + "\n")
    categories = [
        {"id": cid, "name": f"species {cid}", "supercategory": t[0], **dict(zip(_RANKS, t[1:]))}
        for cid, t in INAT_CATEGORIES.items()
    ]
    (root / "train2018.json").write_text(json.dumps({"images": [], "annotations": [], "categories": categories}))
    return root


# DyML: train (fine, middle, coarse) with raw ids as in the release (not contiguous); benchmark sets per granularity.
DYML_TRAIN = [(7, 3, 1), (7, 3, 1), (9, 3, 1), (12, 5, 1), (12, 5, 1), (15, 8, 2)]
DYML_BMK = {"fine": ([30, 31, 31], [30, 30, 31, 31]), "middle": ([4, 6], [4, 6, 6]), "coarse": ([2, 0], [0, 2, 2])}
DYML_TEST = [(50, 20, 1), (50, 20, 1), (51, 21, 2)]


def make_dyml(root: Path, product: bool = False) -> Path:
    seed = 0

    def three_levels(folder: Path, rows: list[tuple[int, int, int]]) -> None:
        nonlocal seed
        lines = ["fname, fine_id0.jpg, middle_id, coarse_id"]
        for k, (f, m, c) in enumerate(rows):
            seed += 1
            write_image(folder / "imgs" / f"{k:04d}.jpg", seed)
            lines.append(f"{k:04d}.jpg, {f}, {m}, {c}")
        (folder / "label.csv").write_text("\n".join(lines) + "\n")

    three_levels(root / "train", DYML_TRAIN)
    for granularity, (query, gallery) in DYML_BMK.items():
        for kind, labels in (("query", query), ("gallery", gallery)):
            lines = ["fname, labels0.jpg"]
            for k, label in enumerate(labels):
                seed += 1
                write_image(root / f"bmk_{granularity}" / kind / f"{kind}_{k}.jpg", seed)
                lines.append(f"{kind}_{k}.jpg, {label}")
            (root / f"bmk_{granularity}" / f"{kind}.csv").write_text("\n".join(lines) + "\n")
    if product:
        three_levels(root / "mini-bmk_all_in_one", DYML_TEST)
    return root


# CIFAR-100: 2 coarse classes x 5 fine classes (fine = 5 * coarse + j), one image per class and split.
CIFAR_KEYS = [(5 * c + j, c) for c in range(2) for j in range(5)]


def make_cifar100(root: Path) -> Path:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for s, split in enumerate(("train", "test")):
        rng = np.random.default_rng(s)
        content = {
            b"filenames": [f"{split}_{i}.png".encode() for i in range(len(CIFAR_KEYS))],
            b"fine_labels": [f for f, _ in CIFAR_KEYS],
            b"coarse_labels": [c for _, c in CIFAR_KEYS],
            b"data": rng.integers(0, 256, (len(CIFAR_KEYS), 3072), dtype=np.uint8),
        }
        (folder / split).write_bytes(pickle.dumps(content, protocol=2))
    return root


# Omniglot: archive 1 has Latin (4 characters) and Greek (2); archive 2 repeats Greek (same files) and adds Tagalog (3).
OMNIGLOT_ARCHIVES = {
    "images_background_small1": {"Latin": 4, "Greek": 2},
    "images_background_small2": {"Greek": 2, "Tagalog": 3},
}


def make_omniglot(root: Path, zipped: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for archive, alphabets in OMNIGLOT_ARCHIVES.items():
        members = {}
        for a, (alphabet, n) in enumerate(sorted(alphabets.items())):
            for c in range(1, n + 1):
                for drawer in (1, 2):
                    name = f"{archive}/{alphabet}/character{c:02d}/{a:02d}{c:02d}_{drawer:02d}.png"
                    members[name] = image_bytes(zlib.crc32(f"{alphabet}{c}{drawer}".encode()), "PNG")
        if zipped:
            with zipfile.ZipFile(root / f"{archive}.zip", "w") as z:
                for name, data in members.items():
                    z.writestr(name, data)
        else:
            for name, data in members.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(data)
    return root


MAKERS = {
    "sop": make_sop,
    "cub": make_cub,
    "inat_base": make_inat,
    "inat_full": make_inat,
    "dyml_vehicle": make_dyml,
    "dyml_animal": make_dyml,
    "dyml_product": lambda root: make_dyml(root, product=True),
    "cifar100": make_cifar100,
    "omniglot": make_omniglot,
}


# H-GLDv2: landmarks with (cluster, overall_cluster); landmark 3 (train) and 12 (index) have no cluster and are
# left out. Image ids are 16 hex characters as in GLDv2; images at <folder>/a/b/c/<id>.jpg.
GLDV2_TRAIN = {1: 2, 2: 2, 3: 1, 4: 3}  # landmark -> number of images
GLDV2_TRAIN_CLUSTERS = {1: ("church", "human-made"), 2: ("castle", "human-made"), 4: ("lake", "natural")}
GLDV2_INDEX = {10: 3, 11: 2, 12: 2, 13: 1}  # landmark -> number of index images
GLDV2_INDEX_CLUSTERS = {10: ("bridge", "human-made"), 11: ("waterfall", "natural"), 13: ("bridge", "human-made")}
GLDV2_QUERIES = [10, 11, None, 12, 10]  # landmark of each test image (None: no ground truth)


def gldv2_id(kind: str, number: int) -> str:
    """A 16-character hex image id (deterministic)."""
    return f"{zlib.crc32(f'{kind}{number}'.encode()):08x}{number:08x}"


def _gldv2_image(folder: Path, image_id: str, seed: int) -> None:
    write_image(folder / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg", seed)


def make_gldv2(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    seed, lines = 0, ["landmark_id,images"]
    for landmark, count in GLDV2_TRAIN.items():
        ids = [gldv2_id("train", 10 * landmark + k) for k in range(count)]
        for image_id in ids:
            seed += 1
            _gldv2_image(root / "train", image_id, seed)
        lines.append(f"{landmark},{' '.join(ids)}")
    (root / "train_clean.csv").write_text("\n".join(lines) + "\n")
    lines, by_landmark = ["id,landmark_id"], {}
    for landmark, count in GLDV2_INDEX.items():
        for k in range(count):
            image_id = gldv2_id("index", 10 * landmark + k)
            by_landmark.setdefault(landmark, []).append(image_id)
            seed += 1
            _gldv2_image(root / "index", image_id, seed)
            lines.append(f"{image_id},{landmark}")
    (root / "index_image_to_landmark.csv").write_text("\n".join(lines) + "\n")
    lines = ["id,images,Usage"]
    for q, landmark in enumerate(GLDV2_QUERIES):
        image_id = gldv2_id("test", q)
        seed += 1
        _gldv2_image(root / "test", image_id, seed)
        usage = "Ignored" if landmark is None else ("Public" if q % 2 else "Private")
        solution = "None" if landmark is None else " ".join(by_landmark[landmark])
        lines.append(f"{image_id},{solution},{usage}")
    (root / "retrieval_solution_v2.1.csv").write_text("\n".join(lines) + "\n")
    for split, clusters, landmarks in (
        ("train", GLDV2_TRAIN_CLUSTERS, GLDV2_TRAIN),
        ("index", GLDV2_INDEX_CLUSTERS, GLDV2_INDEX),
    ):
        lines = ["landmark_id,category,cluster,overall_cluster"]  # an extra column, as the released files may have
        for landmark in landmarks:
            cluster, overall = clusters.get(landmark, ("", ""))
            lines.append(f'{landmark},"http://commons.wikimedia.org/wiki/Category:{landmark}, x",{cluster},{overall}')
        (root / f"{split}_label_to_subcategory_with_clusters.csv").write_text("\n".join(lines) + "\n")
    return root


# Revisited Oxford: 3 database images of two landmarks plus a distractor, 2 queries (also in the database).
REVISITED_IMLIST = ["all_souls_000001", "all_souls_000002", "radcliffe_camera_000001", "oxford_000100"]
REVISITED_QIMLIST = ["all_souls_000001", "radcliffe_camera_000001"]
REVISITED_GND = [
    {
        "easy": np.array([0, 1]),
        "hard": np.array([], dtype=np.int64),
        "junk": np.array([3]),
        "bbx": [1.0, 1.0, 7.0, 6.0],
    },
    {"easy": [2], "hard": [3], "junk": [], "bbx": np.array([0.0, 2.0, 5.0, 8.0])},
]


def make_revisited(root: Path, name: str = "roxford5k") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for k, image in enumerate(REVISITED_IMLIST):
        write_image(root / "jpg" / f"{image}.jpg", 100 + k)
    content = {"imlist": REVISITED_IMLIST, "qimlist": REVISITED_QIMLIST, "gnd": REVISITED_GND}
    (root / f"gnd_{name}.pkl").write_bytes(pickle.dumps(content, protocol=4))
    return root


MAKERS["gldv2_hier"] = make_gldv2
MAKERS["roxford5k"] = make_revisited
MAKERS["rparis6k"] = lambda root: make_revisited(root, "rparis6k")
