"""Tests for pml_suprank/data/synthetic_shapes.py: SyntheticShapes and SyntheticNoise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pml_suprank.data.synthetic_shapes import COLOURS, FAMILIES, SHADES, SyntheticNoise, SyntheticShapes
from pml_suprank.relevance import check_tree


def test_sizes_labels_and_contract():
    ds = SyntheticShapes("train", num_per_class=3, image_size=32)
    te = SyntheticShapes("test", num_per_class=2, image_size=32)
    assert len(ds) == 36 * 3 and len(te) == 18 * 2
    assert ds.labels.shape == (108, 2) and ds.labels.dtype == torch.long
    assert ds.label_names == ["fine_label", "coarse_label"]
    item = ds[5]
    assert set(item) == {"image", "labels", "index"}
    assert item["image"].shape == (3, 32, 32) and item["image"].dtype == torch.float32
    assert 0.0 <= float(item["image"].min()) and float(item["image"].max()) <= 1.0
    torch.testing.assert_close(item["labels"], ds.labels[5])
    assert item["index"] == 5
    # coarse = family, fine ids are global over the 54 classes
    assert set(ds.labels[:, 1].tolist()) == set(range(len(FAMILIES)))
    assert int(ds.labels[:, 0].max()) < SyntheticShapes.num_fine_classes() == 54
    torch.testing.assert_close(ds.labels[:, 1], ds.labels[:, 0] // 9)


def test_open_set_split_is_disjoint_and_covers_all_classes():
    tr = SyntheticShapes("train", num_per_class=1, image_size=16)
    te = SyntheticShapes("test", num_per_class=1, image_size=16)
    train_fine, test_fine = set(tr.labels[:, 0].tolist()), set(te.labels[:, 0].tolist())
    assert not train_fine & test_fine
    assert train_fine | test_fine == set(range(54))
    # every family has 6 train and 3 test classes; every variant and every colour of every family is seen in training
    for f in range(len(FAMILIES)):
        assert sum(1 for c in test_fine if c // 9 == f) == 3
        assert {c % 3 for c in train_fine if c // 9 == f} == set(range(len(SHADES)))
    assert {(c // 3) for c in train_fine} == set(range(18))  # all (family, variant)
    closed = SyntheticShapes("test", num_per_class=1, image_size=16, open_set=False)
    assert set(closed.labels[:, 0].tolist()) == set(range(54))
    everything = SyntheticShapes("all", num_per_class=1, image_size=16)
    assert len(everything) == 54


def test_hierarchy_is_a_tree_and_three_levels():
    ds = SyntheticShapes("train", num_per_class=1, image_size=16, levels=3)
    assert ds.label_names == ["fine_label", "variant_label", "coarse_label"]
    check_tree(ds.labels)
    torch.testing.assert_close(ds.labels[:, 1], ds.labels[:, 0] // 3)
    torch.testing.assert_close(ds.labels[:, 2], ds.labels[:, 0] // 9)
    check_tree(SyntheticShapes.hierarchy())
    assert SyntheticShapes.fine_class_name(4) == "circle/ring/red"
    assert SyntheticShapes.fine_class_name(53) == "arrow/double_arrow/dark_magenta"


def test_deterministic_and_independent_of_access_order():
    a = SyntheticShapes("train", num_per_class=2, image_size=24, seed=3)
    b = SyntheticShapes("train", num_per_class=2, image_size=24, seed=3, cache=False)
    for i in [7, 0, 7, 3]:
        np.testing.assert_array_equal(np.asarray(a.get_image(i)), np.asarray(b.get_image(i)))
    c = SyntheticShapes("train", num_per_class=2, image_size=24, seed=4)
    assert not np.array_equal(np.asarray(a.get_image(0)), np.asarray(c.get_image(0)))
    # the same class/instance renders identically whatever the family subset
    sub = SyntheticShapes("train", num_per_class=2, image_size=24, seed=3, families=["triangle"])
    j = int(torch.nonzero(a.labels[:, 0] == sub.labels[0, 0])[0])
    np.testing.assert_array_equal(np.asarray(a.get_image(j)), np.asarray(sub.get_image(0)))


def test_train_and_test_images_differ_in_closed_set():
    tr = SyntheticShapes("train", num_per_class=1, image_size=24, open_set=False)
    te = SyntheticShapes("test", num_per_class=1, image_size=24, open_set=False)
    assert torch.equal(tr.labels, te.labels)
    assert not np.array_equal(np.asarray(tr.get_image(0)), np.asarray(te.get_image(0)))


def test_families_subset_for_ood():
    ds = SyntheticShapes("all", num_per_class=1, image_size=16, families=["star", 0])
    assert sorted(set(ds.labels[:, 1].tolist())) == [0, FAMILIES.index("star")]
    assert len(ds) == 18
    assert all(name.split("/")[0] in ("circle", "star") for name in ds.class_names.values())


def test_images_show_a_shape_of_the_right_colour():
    """The shape colour (a shade of the family's own hue) dominates the pixels that differ most from the background
    median: the nearest of the 18 palette colours is the item's colour, or at least one of its family."""
    ds = SyntheticShapes("all", num_per_class=4, image_size=48, noise=0.0, clutter=0, colour_cast=0.0)
    colours = np.array([rgb for f in FAMILIES for rgb in COLOURS[f].values()], dtype=float)  # index = fine % 9
    correct = same_family = 0
    for i in range(0, len(ds), 4):
        img = np.asarray(ds.get_image(i), dtype=float)
        diff = np.abs(img - np.median(img.reshape(-1, 3), axis=0)).sum(-1)
        fg = img[diff >= np.quantile(diff, 0.9)].mean(0)
        nearest = int(np.argmin(((colours - fg) ** 2).sum(1)))
        fine = int(ds.labels[i, 0])
        correct += int(nearest == (fine // 9) * 3 + fine % 3)
        same_family += int(nearest // 3 == fine // 9)
    assert correct / (len(ds) // 4) > 0.8
    assert same_family / (len(ds) // 4) > 0.95


def test_families_have_their_own_palette():
    """A family is visually coherent: its three colours are shades of one hue, distinct from every other family's."""
    import colorsys

    assert set(COLOURS) == set(FAMILIES) and all(len(p) == len(SHADES) == 3 for p in COLOURS.values())
    hues = {
        f: {round(colorsys.rgb_to_hsv(*(np.array(c) / 255.0))[0] * 360) % 360 for c in p.values()}
        for f, p in COLOURS.items()
    }
    for f, h in hues.items():
        assert max(h) - min(h) <= 2, (f, h)  # one hue per family (rounding)
    assert len({min(h) for h in hues.values()}) == len(FAMILIES)
    names = [n for p in COLOURS.values() for n in p]
    assert len(set(names)) == len(names) == 18


def test_set_transform_and_non_tensor_transform():
    from PIL import Image

    ds = SyntheticShapes("train", num_per_class=1, image_size=32)
    ds.set_transform(lambda im: im.resize((16, 16), Image.BILINEAR))  # returns PIL -> converted
    assert ds[0]["image"].shape == (3, 16, 16)
    ds.set_transform(None)
    assert ds[0]["image"].shape == (3, 32, 32)
    with pytest.raises(TypeError, match="transform must be callable"):
        ds.set_transform(3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"split": "val"}, "split must be one of"),
        ({"num_per_class": 0}, "num_per_class"),
        ({"image_size": 4}, "image_size"),
        ({"families": ["hexagon"]}, "families must be one of"),
        ({"families": []}, "at least one family"),
        ({"families": [0, 0]}, "must not repeat"),
        ({"levels": 4}, "levels must be one of"),
        ({"scale": (0.4, 0.2)}, "scale"),
        ({"noise": -1}, "noise"),
        ({"illumination": 1.0}, "illumination"),
        ({"colour_cast": -0.1}, "colour_cast"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SyntheticShapes(**kwargs)


def test_index_errors():
    ds = SyntheticShapes("test", num_per_class=1, image_size=16)
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert ds[-1]["index"] == len(ds) - 1


@pytest.mark.parametrize("kind", ["uniform", "gaussian", "blobs"])
def test_noise_dataset(kind):
    ds = SyntheticNoise(4, image_size=24, kind=kind, seed=1)
    item = ds[2]
    assert item["image"].shape == (3, 24, 24)
    assert ds.labels.shape == (4, 2) and bool((ds.labels == -1).all())
    np.testing.assert_array_equal(np.asarray(ds.get_image(1)), np.asarray(SyntheticNoise(4, 24, 1, kind).get_image(1)))
    with pytest.raises(ValueError, match="kind must be one of"):
        SyntheticNoise(2, kind="perlin")


@pytest.mark.slow
def test_nuisances_defeat_raw_pixels_and_an_untrained_network():
    """'Hard enough': raw pixels and a randomly initialised CNN retrieve the open-set test classes poorly (the main job
    trains the same tiny CNN to H-AP ≈ 0.7, fine AP ≈ 0.6; see the README). Families are coherent by design (one hue
    each), so raw colour finds the right family more often than the right class: H-AP is bounded a little higher than
    the fine-level AP and R@1."""
    from pml_suprank.metrics import RetrievalEvaluator
    from pml_suprank.models import RetrievalModel

    te = SyntheticShapes("test", num_per_class=8, image_size=32)
    x = torch.stack([te[i]["image"] for i in range(len(te))])
    evaluator = RetrievalEvaluator(k_values=(1,))
    flat = x.flatten(1)
    raw = torch.nn.functional.normalize(flat - flat.mean(1, keepdim=True), dim=1)
    torch.manual_seed(0)
    model = RetrievalModel("test_resnet", embedding_size=64, image_size=32).eval()
    with torch.no_grad():
        untrained = model((x - 0.5) / 0.5)
    for emb in (raw, untrained):
        metrics = evaluator.evaluate(emb, te.labels)
        assert metrics["ap"] < 0.35 and metrics["recall_at_1"] < 0.45 and metrics["h_ap"] < 0.4, metrics
