"""Tests for pml_suprank.data.synthetic_multishapes.SyntheticMultiShapes (several shapes per image, (N, M) labels padded
with -1, the fine → family hierarchy table) and the name-based constructor synthetic_dataset; SyntheticShapes stays
bit-identical."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest
import torch

from pml_suprank.data import collate
from pml_suprank.data.synthetic_multishapes import (
    SYNTHETIC_DATASETS,
    SyntheticMultiShapes,
    hierarchy_table,
    synthetic_dataset,
)
from pml_suprank.data.synthetic_shapes import COLOURS, FAMILIES, SyntheticShapes
from pml_suprank.relevance import Hierarchy, multilabel_relevance
from pml_suprank.samplers import MultiLabelSampler


def _sets(ds) -> list[set[int]]:
    return [set(r[r >= 0].tolist()) for r in ds.labels]


def test_contract_labels_and_hierarchy():
    ds = SyntheticMultiShapes("train", num_per_class=3, image_size=32, max_labels=3)
    assert ds.multilabel and ds.labels.dtype == torch.long and ds.labels.shape[1] == 3
    assert ds.label_names == ["fine_label", "coarse_label"] and ds.num_levels == 2
    assert torch.equal(ds.hierarchy, SyntheticShapes.hierarchy())
    Hierarchy(ds.hierarchy)  # a valid tree table
    counts = ds.num_labels()
    assert int(counts.min()) >= 1 and int(counts.max()) <= 3 and set(counts.tolist()) == {1, 2, 3}
    for row, n in zip(ds.labels, counts.tolist()):
        used = row[:n]
        assert bool((row[n:] == -1).all()) and torch.equal(used, torch.sort(used).values)
        assert len(set(used.tolist())) == n  # a set: no class twice in an image
    # balanced: every one of the 36 training classes is shown in exactly num_per_class images
    occurrences = Counter(ds.labels[ds.labels >= 0].tolist())
    assert len(occurrences) == 36 and set(occurrences.values()) == {3}
    item = ds[4]
    assert set(item) == {"image", "labels", "index"} and item["image"].shape == (3, 32, 32)
    assert torch.equal(item["labels"], ds.labels[4]) and item["index"] == 4
    batch = collate([ds[i] for i in range(5)])
    assert torch.equal(batch["labels"], ds.labels[:5]) and batch["image"].shape == (5, 3, 32, 32)
    assert all(name.split("/")[0] in FAMILIES for name in ds.class_names.values())


def test_three_levels_and_table():
    ds = SyntheticMultiShapes("test", num_per_class=1, image_size=16, levels=3)
    assert ds.label_names == ["fine_label", "variant_label", "coarse_label"] and ds.num_levels == 3
    table = hierarchy_table(3)
    assert torch.equal(ds.hierarchy, table) and table.shape == (54, 3)
    assert torch.equal(table[:, 1], torch.arange(54) // 3) and torch.equal(table[:, 2], torch.arange(54) // 9)


def test_open_set_classes_as_single_label_dataset():
    tr = SyntheticMultiShapes("train", num_per_class=2, image_size=16)
    te = SyntheticMultiShapes("test", num_per_class=2, image_size=16)
    single_tr = set(SyntheticShapes("train", num_per_class=1, image_size=16).labels[:, 0].tolist())
    single_te = set(SyntheticShapes("test", num_per_class=1, image_size=16).labels[:, 0].tolist())
    assert set().union(*_sets(tr)) == single_tr and set().union(*_sets(te)) == single_te
    everything = SyntheticMultiShapes("all", num_per_class=2, image_size=16)
    assert len(everything) == len(tr) + len(te)
    assert torch.equal(everything.labels, torch.cat([tr.labels, te.labels]))
    closed = SyntheticMultiShapes("test", num_per_class=1, image_size=16, open_set=False)
    assert set().union(*_sets(closed)) == set(range(54))
    sub = SyntheticMultiShapes("train", num_per_class=2, image_size=16, families=["star", 0])
    assert {f // 9 for f in set().union(*_sets(sub))} == {0, FAMILIES.index("star")}


def test_deterministic_and_independent_of_access_order():
    a = SyntheticMultiShapes("train", num_per_class=1, image_size=24, seed=3)
    b = SyntheticMultiShapes("train", num_per_class=1, image_size=24, seed=3, cache=False)
    assert torch.equal(a.labels, b.labels)
    for i in [5, 0, 5, 2]:
        np.testing.assert_array_equal(np.asarray(a.get_image(i)), np.asarray(b.get_image(i)))
    c = SyntheticMultiShapes("train", num_per_class=1, image_size=24, seed=4)
    assert not torch.equal(a.labels, c.labels) or not np.array_equal(np.asarray(a.get_image(0)), c.render(0))
    te = SyntheticMultiShapes("test", num_per_class=1, image_size=24, seed=3, open_set=False)
    tr = SyntheticMultiShapes("train", num_per_class=1, image_size=24, seed=3, open_set=False)
    assert not np.array_equal(te.render(0), tr.render(0))


def test_every_shape_is_drawn_in_its_colour():
    """Without noise, jitter or casts, every shape's palette colour is the exact colour of some pixels."""
    ds = SyntheticMultiShapes(
        "all",
        num_per_class=1,
        image_size=48,
        max_labels=4,
        noise=0.0,
        clutter=0,
        colour_jitter=0,
        illumination=0.0,
        colour_cast=0.0,
    )
    assert ds.labels.shape[1] == 4
    for i in range(0, len(ds), 3):
        img = np.asarray(ds.get_image(i)).reshape(-1, 3).astype(int)
        for fine in ds.labels[i][ds.labels[i] >= 0].tolist():
            family = FAMILIES[fine // 9]
            rgb = np.array(list(COLOURS[family].values())[fine % 3])
            assert (np.abs(img - rgb).max(1) <= 1).sum() >= 4, (i, fine)


def test_relevance_of_images_sharing_shapes():
    """multilabel_relevance (thesis Algorithm 1) on the dataset's labels and hierarchy: 1 when the item shows every
    shape of the query, partial for shared shapes or shared families only, 0 with nothing in common."""
    ds = SyntheticMultiShapes("train", num_per_class=4, image_size=16, max_labels=3)
    rel = multilabel_relevance(ds.labels, ds.labels, ds.hierarchy, dtype=torch.float64)
    sets = _sets(ds)
    for q in range(0, len(ds), 5):
        for k in range(len(ds)):
            expected = sum(max(2 if a == b else (1 if a // 9 == b // 9 else 0) for b in sets[k]) for a in sets[q]) / (
                2 * len(sets[q])
            )
            assert rel[q, k].item() == pytest.approx(expected, abs=1e-12)
            assert (rel[q, k].item() == 1.0) == sets[q].issubset(sets[k])
            assert (rel[q, k].item() == 0.0) == (not {a // 9 for a in sets[q]} & {b // 9 for b in sets[k]})
    assert bool((rel.diagonal() == 1).all())
    flat = multilabel_relevance(ds.labels, ds.labels)  # no hierarchy: fraction of the query's shapes shown
    n = len(ds)
    pairs = [(q, k) for q in range(n) for k in range(n) if len(sets[q]) == 2 and len(sets[q] & sets[k]) == 1]
    q, k = pairs[0]
    assert flat[q, k].item() == 0.5


def test_multilabel_sampler_batches_have_positives():
    ds = SyntheticMultiShapes("train", num_per_class=4, image_size=16)
    sampler = MultiLabelSampler(ds.labels, m=2, batch_size=16, seed=0)
    for batch in list(sampler)[:5]:
        sets = [set(ds.labels[i][ds.labels[i] >= 0].tolist()) for i in batch]
        assert all(any(sets[j] & s for j in range(len(sets)) if j != i) for i, s in enumerate(sets))


def test_synthetic_dataset_by_name():
    ds = synthetic_dataset("synthetic_multilabel", "test", num_per_class=1, image_size=16, max_labels=2)
    assert isinstance(ds, SyntheticMultiShapes) and ds.max_labels == 2
    single = synthetic_dataset("synthetic", "train", num_per_class=1, image_size=16)
    assert type(single) is SyntheticShapes and not single.multilabel
    assert set(SYNTHETIC_DATASETS) == {"synthetic", "synthetic_multilabel"}
    with pytest.raises(ValueError, match="name"):
        synthetic_dataset("shapes", "train")
    with pytest.raises(ValueError, match="split"):
        synthetic_dataset("synthetic_multilabel", "val")
    with pytest.raises(TypeError):
        SYNTHETIC_DATASETS["other"] = SyntheticShapes  # read-only


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_labels": 0}, "max_labels"),
        ({"max_labels": 10}, "max_labels"),
        ({"max_labels": True}, "max_labels"),
        ({"num_per_class": 0}, "num_per_class"),
        ({"image_size": 4}, "image_size"),
        ({"levels": 4}, "levels"),
        ({"scale": (0.4, 0.2)}, "scale"),
        ({"families": ["hexagon"]}, "families"),
    ],
)
def test_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SyntheticMultiShapes("train", **kwargs)


def test_single_label_synthetic_shapes_unchanged():
    """The single-label images are pixel-identical to the renderer the README numbers were produced with."""
    ds = SyntheticShapes("train", num_per_class=2, image_size=32)
    h = hashlib.sha256()
    for i in range(0, len(ds), 7):
        h.update(np.asarray(ds.get_image(i)).tobytes())
    assert h.hexdigest() == "9f7e2246e75b6b179540a8950767ead3ceb1aa2d65b776f6fa4b10cc6007e41f"
    assert not ds.multilabel and callable(ds.hierarchy)  # the staticmethod, not a multi-label table
