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
