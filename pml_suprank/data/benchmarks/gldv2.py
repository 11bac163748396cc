"""H-GLDv2: Google Landmarks v2 (Weyand et al., CVPR 2020) with the hierarchical labels of SupRank (TPAMI Sec. VI),
landmark → cluster (78 supercategories) → overall_cluster (human-made / natural); evaluated (TPAMI Table VII) with
:func:`pml_suprank.metrics.landmark.landmark_map_at_k` and the hierarchical metrics.

Layout under ``root`` (csv files as distributed): ``train_clean.csv``, ``index_image_to_landmark.csv``,
``retrieval_solution_v2.1.csv``, ``{train,index}_label_to_subcategory_with_clusters.csv`` and images at
``{train,index,test}/a/b/c/<id>.jpg``. Splits: ``train``, ``query`` (test images with ground truth, labelled by their
solution images' one landmark) and ``gallery`` (the index set); images whose landmark has no cluster are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..paths import PathConfiner
from ._native import FileImageDataset, Record, file_split, layout_error, parse_int, read_table

__all__ = ["GLDV2_LABEL_NAMES", "GLDV2_SPLITS", "gldv2_image_path", "load_gldv2", "read_subcategories"]

GLDV2_LABEL_NAMES = ("landmark_id", "cluster", "overall_cluster")
GLDV2_SPLITS = ("train", "query", "gallery")
_TRAIN_COLUMNS = ("landmark_id", "images")
_INDEX_COLUMNS = ("id", "landmark_id")
_SOLUTION_COLUMNS = ("id", "images", "Usage")
_HIERARCHY_COLUMNS = ("landmark_id", "cluster", "overall_cluster")
_NO_GROUND_TRUTH = "None"


def gldv2_image_path(folder: str | Path, image_id: str) -> Path:
    """``folder/a/b/c/<id>.jpg`` with ``a``, ``b``, ``c`` the first three characters of ``image_id``."""
    return Path(folder) / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg"


def _image_id(value: str, path: Path, line: int) -> str:
    image_id = value.strip()
    if len(image_id) < 3 or not image_id.isalnum():
        raise layout_error(path, line, f"image id {value!r} must be an alphanumeric string (at least 3 characters)")
    return image_id


def read_subcategories(path: Path) -> dict[int, tuple[str, str]]:
    """``landmark_id → (cluster, overall_cluster)`` of an H-GLDv2 ``*_label_to_subcategory_with_clusters.csv``
    (landmarks without both cells left out). ``ValueError``: missing file or columns, a non-integer landmark id, a
    landmark with two clusters or a cluster under two overall clusters (naming the file and both lines)."""
    mapping: dict[int, tuple[str, str]] = {}
    seen_landmark: dict[int, int] = {}
    parent: dict[str, tuple[str, int]] = {}
    for line, row in read_table(path, _HIERARCHY_COLUMNS, exact=False):
        landmark = parse_int(row["landmark_id"], path, line, "landmark_id")
        cluster, overall = row["cluster"].strip(), row["overall_cluster"].strip()
        if not cluster or not overall or cluster.lower() == "nan" or overall.lower() == "nan":
            continue
        if landmark in mapping and mapping[landmark] != (cluster, overall):
            raise layout_error(
                path,
                line,
                f"landmark_id {landmark} has cluster {cluster!r} / {overall!r} but {mapping[landmark]} at line "
                f"{seen_landmark[landmark]}; a landmark must belong to exactly one cluster (a tree)",
            )
        known = parent.setdefault(cluster, (overall, line))
        if known[0] != overall:
            raise layout_error(
                path,
                line,
                f"cluster {cluster!r} has overall_cluster {overall!r} but {known[0]!r} at line {known[1]}; a cluster "
                "must belong to exactly one overall_cluster (a tree)",
            )
        mapping[landmark] = (cluster, overall)
        seen_landmark.setdefault(landmark, line)
    return mapping


def _train_records(root: Path) -> list[Record]:
    confine = PathConfiner(root)
    path = root / "train_clean.csv"
    hierarchy = read_subcategories(root / "train_label_to_subcategory_with_clusters.csv")
    out = []
    for line, row in read_table(path, _TRAIN_COLUMNS):
        landmark = parse_int(row["landmark_id"], path, line, "landmark_id")
        if landmark not in hierarchy:
            continue
        key, where = (landmark, *hierarchy[landmark]), f"{path}, line {line}"
        for image in row["images"].split():
            out.append((confine(gldv2_image_path("train", _image_id(image, path, line)), where=where), key, where))
    return out


def _query_gallery_records(root: Path) -> dict[str, list[Record]]:
    confine = PathConfiner(root)
    hierarchy = read_subcategories(root / "index_label_to_subcategory_with_clusters.csv")
    index_path, landmark_of, gallery = root / "index_image_to_landmark.csv", {}, []
    for line, row in read_table(index_path, _INDEX_COLUMNS):
        image = _image_id(row["id"], index_path, line)
        landmark_of[image] = landmark = parse_int(row["landmark_id"], index_path, line, "landmark_id")
        if landmark in hierarchy:
            key, where = (landmark, *hierarchy[landmark]), f"{index_path}, line {line}"
            gallery.append((confine(gldv2_image_path("index", image), where=where), key, where))
    path = root / "retrieval_solution_v2.1.csv"
    query = []
    for line, row in read_table(path, _SOLUTION_COLUMNS):
        relevant = row["images"].split()
        if relevant == [_NO_GROUND_TRUTH] or not relevant:
            continue
        unknown = [image for image in relevant if image not in landmark_of]
        if unknown:
            raise layout_error(path, line, f"solution image {unknown[0]!r} is not in {index_path.name}")
        landmarks = sorted({landmark_of[image] for image in relevant})
        if len(landmarks) != 1:
            raise layout_error(path, line, f"the solution images depict several landmarks {landmarks}; expected one")
        if landmarks[0] in hierarchy:
            image = _image_id(row["id"], path, line)
            key = (landmarks[0], *hierarchy[landmarks[0]])
            where = f"{path}, line {line}"
            query.append((confine(gldv2_image_path("test", image), where=where), key, where))
    return {"query": query, "gallery": gallery}


def load_gldv2(root: str | Path, split: str, transform: Callable | None = None) -> FileImageDataset:
    """H-GLDv2 ``split`` (``"train"``, ``"query"``, ``"gallery"``) of the GLDv2 folder ``root``: labels ``(N, 3)`` =
    (landmark, cluster, overall_cluster), contiguous (query and gallery share their ids). ``ValueError`` naming the
    file and line: a missing or malformed csv (a query whose solution images are not in the index or depict several
    landmarks), a missing image, a landmark / cluster with two parents."""
    root = Path(root)
    records = {"train": _train_records(root)} if split == "train" else _query_gallery_records(root)
    return file_split(records, split, GLDV2_LABEL_NAMES, root, benchmark="gldv2_hier", transform=transform)
