"""data.build_transforms: timm's create_transform from the model's data config — crop_pct / crop_mode honoured at
evaluation, RandAugment and random erasing at training, seeded per (seed, epoch, item) by the training loop's
SeededAugmentation, and model folders saved without the crop keys still load."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data.auto_augment import RandAugment
from timm.data.random_erasing import RandomErasing
from torchvision import transforms as T

from pml_suprank import data
from pml_suprank.models import RetrievalModel
from pml_suprank.training import SeededAugmentation

CFG = {"input_size": (3, 16, 16), "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25), "crop_pct": 0.8}


def _image(seed: int = 0, w: int = 40, h: int = 24) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _reference_eval(cfg: dict, resize) -> T.Compose:
    """The evaluation pipeline written out with torchvision: resize, center crop, ToTensor, Normalize."""
    size = cfg["input_size"][1:]
    return T.Compose([T.Resize(resize), T.CenterCrop(size), T.ToTensor(), T.Normalize(cfg["mean"], cfg["std"])])


def test_crop_mode_and_crop_pct_are_honoured_on_a_non_square_image():
    img = _image()  # 40 x 24 (W x H)
    scaled = math.floor(16 / 0.8)  # 20
    center = data.build_transforms({**CFG, "crop_mode": "center"}, train=False)(img)
    squash = data.build_transforms({**CFG, "crop_mode": "squash"}, train=False)(img)
    default = data.build_transforms(CFG, train=False)(img)
    assert center.shape == squash.shape == (3, 16, 16)
    # center: the short side to size / crop_pct, aspect ratio kept (the pipeline of before, outputs unchanged)
    torch.testing.assert_close(center, _reference_eval(CFG, scaled)(img))
    torch.testing.assert_close(default, center)
    # squash: both sides to size / crop_pct, the whole width in view
    torch.testing.assert_close(squash, _reference_eval(CFG, (scaled, scaled))(img))
    assert (center - squash).abs().max() > 0.5
    # crop_pct: 1.0 keeps the whole short side
    full = data.build_transforms({**CFG, "crop_pct": 1.0}, train=False)(img)
    torch.testing.assert_close(full, _reference_eval(CFG, 16)(img))
    assert (full - center).abs().max() > 0.5
    # border: the long side to size / crop_pct, padded (the corners of a wide image are fill)
    border_tf = data.build_transforms({**CFG, "crop_mode": "border", "crop_pct": 1.0}, train=False)
    border, other = border_tf(img), border_tf(_image(9))
    assert torch.equal(border[:, 0], other[:, 0]) and not torch.equal(border[:, 8], other[:, 8])


def test_model_crop_overrides_reach_the_transforms_and_the_saved_config(tmp_path):
    img = _image(1)
    base = RetrievalModel("test_resnet", embedding_size=8, image_size=16)
    squash = RetrievalModel("test_resnet", embedding_size=8, image_size=16, crop_mode="squash", crop_pct=0.8)
    assert base.data_config["crop_mode"] == "center" and "crop_mode" not in base.get_config()
    assert squash.data_config["crop_mode"] == "squash" and squash.data_config["crop_pct"] == 0.8
    out = data.build_transforms(squash.data_config, train=False)(img)
    torch.testing.assert_close(out, _reference_eval(squash.data_config, (20, 20))(img))
    assert (out - data.build_transforms(base.data_config, train=False)(img)).abs().max() > 0.5

    squash.save_pretrained(tmp_path / "squash")
    config = json.loads((tmp_path / "squash" / "config.json").read_text())
    assert config["model_args"]["crop_mode"] == "squash" and config["model_args"]["crop_pct"] == 0.8
    assert config["pretrained_cfg"]["crop_mode"] == "squash" and config["pretrained_cfg"]["crop_pct"] == 0.8
    loaded = RetrievalModel.from_pretrained(tmp_path / "squash")
    assert loaded.data_config == squash.data_config
    torch.testing.assert_close(data.build_transforms(loaded.data_config, train=False)(img), out)
    for name, value in (("crop_mode", "diagonal"), ("crop_pct", 1.5), ("crop_pct", 0.0), ("crop_pct", True)):
        with pytest.raises(ValueError, match=name):
            RetrievalModel("test_resnet", embedding_size=8, **{name: value})


def test_a_model_folder_without_the_crop_keys_still_loads(tmp_path):
    """A folder saved before the crop options (no crop keys in model_args, no crop_mode in pretrained_cfg) loads
    and evaluates with the backbone's own crop."""
    model = RetrievalModel("test_resnet", embedding_size=8, image_size=16)
    model.save_pretrained(tmp_path / "old")
    path = tmp_path / "old" / "config.json"
    config = json.loads(path.read_text())
    assert not {"crop_pct", "crop_mode"} & set(config["model_args"])  # default: config.json as before
    for key in ("crop_pct", "crop_mode"):
        config["pretrained_cfg"].pop(key, None)
    path.write_text(json.dumps(config))
    loaded = RetrievalModel.from_pretrained(tmp_path / "old")
    assert loaded.data_config == model.data_config
    assert loaded.data_config["crop_mode"] == "center"
    x = data.build_transforms(loaded.data_config, train=False)(_image(2)).unsqueeze(0)
    torch.testing.assert_close(loaded(x), model.eval()(x))


def test_randaugment_and_random_erasing_are_in_the_training_transform():
    plain = data.build_transforms(CFG, train=True)
    strong = data.build_transforms(CFG, train=True, auto_augment="rand-m9-mstd0.5", re_prob=1.0, re_mode="const")
    assert not any(isinstance(t, (RandAugment, RandomErasing)) for t in plain.transforms)
    kinds = [type(t) for t in strong.transforms]
    assert RandAugment in kinds and RandomErasing in kinds and kinds.index(RandAugment) < kinds.index(RandomErasing)
    rand_aug = next(t for t in strong.transforms if isinstance(t, RandAugment))
    assert rand_aug.num_layers == 2 and all(op.magnitude == 9 and op.magnitude_std == 0.5 for op in rand_aug.ops)
    erase = next(t for t in strong.transforms if isinstance(t, RandomErasing))
    assert erase.probability == 1.0 and erase.mode == "const"
    # erasing acts on the normalised tensor: with the same draws before it, a const-erased rectangle of zeros
    only_erase = data.build_transforms(CFG, train=True, re_prob=1.0, re_mode="const")
    outs = []
    for tf in (plain, only_erase):
        random.seed(3)
        torch.manual_seed(3)
        outs.append(tf(_image(4)))
    changed = (outs[0] != outs[1]).any(0)
    assert changed.any() and (outs[1][:, changed] == 0).all()
    # the default training pipeline: random resized crop + flip, no colour jitter (as before)
    names = [type(t).__name__ for t in plain.transforms]
    assert names == ["RandomResizedCropAndInterpolation", "RandomHorizontalFlip", "MaybeToTensor", "Normalize"]
    assert plain.transforms[0].scale == (0.16, 1.0)
    augmix = data.build_transforms(CFG, train=True, auto_augment="augmix-m5-w4-d2")
    assert "AugMixAugment" in [type(t).__name__ for t in augmix.transforms]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"auto_augment": "rand-q9"}, "auto_augment"),
        ({"auto_augment": "policy-of-nothing"}, "auto_augment"),
        ({"auto_augment": ""}, "auto_augment"),
        ({"re_prob": 1.5}, "re_prob"),
        ({"re_mode": "blur"}, "re_mode"),
        ({"re_count": 0}, "re_count"),
        ({"color_jitter": -0.1}, "color_jitter"),
        ({"ratio": (2.0, 1.0)}, "ratio"),
    ],
)
def test_training_option_errors_name_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.build_transforms(CFG, train=True, **kwargs)


def test_eval_config_errors_name_the_key():
    for key, value in (("crop_mode", "diagonal"), ("crop_pct", 1.5), ("interpolation", "sinc")):
        with pytest.raises(ValueError, match=key):
            data.build_transforms({**CFG, key: value}, train=False)


class _Images(torch.utils.data.Dataset):
    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return {"image": self.transform(_image(i)), "index": i}


def test_timm_augmentation_is_seeded_per_seed_epoch_and_item():
    """RandAugment, the random crop and random erasing draw from the global random / torch generators, which
    SeededAugmentation seeds per (seed, epoch, index): any load order (workers, resume) gives the same images, and
    the caller's random state is untouched."""
    tf = data.build_transforms(CFG, train=True, auto_augment="rand-m9-mstd0.5", re_prob=0.5)
    ds = SeededAugmentation(_Images(tf), seed=7)
    ds.set_epoch(2)
    random.seed(0)
    torch.manual_seed(0)
    state = (random.getstate(), torch.get_rng_state())
    forward = [ds[i]["image"] for i in range(4)]
    backward = [ds[i]["image"] for i in reversed(range(4))][::-1]
    assert random.getstate() == state[0] and torch.equal(torch.get_rng_state(), state[1])
    for a, b in zip(forward, backward, strict=True):
        assert torch.equal(a, b)
    again = SeededAugmentation(_Images(data.build_transforms(CFG, train=True, auto_augment="rand-m9-mstd0.5",
                                                                  re_prob=0.5)), seed=7)  # fmt: skip
    again.set_epoch(2)
    assert all(torch.equal(again[i]["image"], forward[i]) for i in range(4))
    ds.set_epoch(3)
    assert any(not torch.equal(ds[i]["image"], forward[i]) for i in range(4))
