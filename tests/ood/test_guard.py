"""The OOD guard of a model: calibration rule, storage inside the model folder, refusal of foreign weights / feature
kinds, exposure through ``RetrievalModel.from_pretrained``."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from pml_suprank import ood
from pml_suprank.models import RetrievalModel
from pml_suprank.ood.guard import (
    GUARD_KEYS,
    GuardMismatchError,
    OODGuard,
    calibrate_threshold,
    weights_sha256,
)

TINY = "test_resnet"


def _batches(x: torch.Tensor, labels: torch.Tensor | None = None, size: int = 16):
    out = []
    for i in range(0, len(x), size):
        b = {"image": x[i : i + size]}
        if labels is not None:
            b["labels"] = labels[i : i + size]
        out.append(b)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("final")
    RetrievalModel(TINY, embedding_size=8, image_size=32).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1)
    train = torch.rand(48, 3, 32, 32, generator=g) * 0.5
    labels = torch.arange(48) % 3
    train[:, 0] += labels[:, None, None] * 0.2  # three classes of images
    heldout = torch.rand(40, 3, 32, 32, generator=g) * 0.5
    noise = torch.randn(24, 3, 32, 32, generator=g) * 3.0
    return train, labels, heldout, noise


@pytest.fixture(scope="module")
def guard(saved, data):
    train, labels, heldout, noise = data
    model = RetrievalModel.from_pretrained(saved)
    g = OODGuard.fit(model, _batches(train, labels), _batches(heldout), detector=ood.Mahalanobis(),
                     ood_loaders={"noise": _batches(noise)}, tpr_target=0.9)  # fmt: skip
    g.save(saved)
    return g


def test_threshold_keeps_the_target_share_of_a_half_and_measures_the_other():
    scores = torch.arange(100, dtype=torch.float32)
    threshold, id_tpr = calibrate_threshold(scores, 0.95, seed=0)
    order = torch.randperm(100, generator=torch.Generator().manual_seed(0))
    calibration = scores[order[:50]].sort().values
    assert threshold == float(calibration[math.ceil(0.95 * 50) - 1])
    assert (calibration <= threshold).float().mean() >= 0.95
    assert id_tpr == pytest.approx(int((scores[order[50:]] <= threshold).sum()) / 50)
    with pytest.raises(ValueError, match=r"tpr_target must lie in \[0, 1\]; got 1.5"):
        calibrate_threshold(scores, 1.5)
    with pytest.raises(ValueError, match="at least 2"):
        calibrate_threshold(scores[:1])


def test_guard_json_has_exactly_the_documented_keys(saved, guard):
    data = json.loads((saved / "ood" / "guard.json").read_text())
    assert set(data) == {"version", *GUARD_KEYS}
    assert data["detector"] == "Mahalanobis" and data["feature_kind"] == "pooled"
    assert data["model_sha256"] == weights_sha256(saved / "model.safetensors")
    assert data["higher_is_ood"] is True and data["tpr_target"] == 0.9
    assert set(data["ood_sets"]) == {"noise"} and set(data["ood_sets"]["noise"]) == {"fpr", "auroc"}
    assert 0.0 <= data["id_tpr"] <= 1.0
    assert sorted(p.name for p in (saved / "ood").iterdir()) == ["config.json", "guard.json", "model.safetensors"]


def test_from_pretrained_exposes_the_guard_and_one_rule(saved, guard, data):
    _, _, heldout, noise = data
    model = RetrievalModel.from_pretrained(saved)
    assert isinstance(model.ood_guard, OODGuard) and model.ood_guard.threshold == guard.threshold
    verdict = model.ood_guard.predict(model, torch.cat([heldout[:8], noise[:8]]))
    assert verdict.scores.shape == (16,) and verdict.is_ood.dtype == torch.bool
    assert torch.equal(verdict.is_ood, verdict.scores > guard.threshold)  # the one rule
    assert bool(verdict.is_ood[8:].all())  # loud noise is rejected
    assert verdict.records()[0].keys() == {"score", "is_ood"}
    lower = model.ood_guard.predict(model, heldout[:8], threshold=-1e30)
    assert bool(lower.is_ood.all())  # an explicit threshold overrides the stored one


def test_the_model_fetches_the_guard_files_with_its_weights():
    from pml_suprank.ood.guard import GUARD_FILES

    assert RetrievalModel._hub_companion_files == GUARD_FILES


def test_model_without_guard_says_none(tmp_path):
    RetrievalModel(TINY, embedding_size=8, image_size=32).save_pretrained(tmp_path)
    model = RetrievalModel.from_pretrained(tmp_path)
    assert model.ood_guard is None and len(model.weights_sha256) == 64
    assert RetrievalModel(TINY, embedding_size=8).ood_guard is None


def test_a_guard_of_other_weights_is_refused_naming_both(saved, guard, tmp_path):
    other = tmp_path / "other"
    torch.manual_seed(5)
    RetrievalModel(TINY, embedding_size=8, image_size=32).save_pretrained(other)
    import shutil

    shutil.copytree(saved / "ood", other / "ood")
    theirs, ours = weights_sha256(saved), weights_sha256(other)
    with pytest.raises(GuardMismatchError) as err:
        RetrievalModel.from_pretrained(other)
    assert theirs in str(err.value) and ours in str(err.value)
    with pytest.raises(GuardMismatchError, match=ours):
        guard.save(other)
    plain = tmp_path / "plain"
    RetrievalModel(TINY, embedding_size=8, image_size=32).save_pretrained(plain)
    foreign = RetrievalModel.from_pretrained(plain)
    with pytest.raises(GuardMismatchError, match=guard.model_sha256):
        guard.predict(foreign, torch.rand(2, 3, 32, 32))


def test_a_guard_of_another_feature_kind_is_refused(saved, guard, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    path = copy / "ood" / "guard.json"
    data = json.loads(path.read_text())
    data["feature_kind"] = "embedding"
    path.write_text(json.dumps(data))
    with pytest.raises(GuardMismatchError, match="'embedding'.*'pooled'"):
        OODGuard.load(copy)
    data["feature_kind"] = "pooled"
    data["extra"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="exactly the keys"):
        OODGuard.load(copy)


def test_image_detectors_and_unfitted_detectors_are_refused(saved):
    sha = weights_sha256(saved)
    with pytest.raises(ValueError, match="not fitted"):
        OODGuard(ood.Mahalanobis(), threshold=0.0, feature_kind="pooled", model_sha256=sha, tpr_target=0.95, id_tpr=1)
    with pytest.raises(ValueError, match="feature_kind"):
        OODGuard(ood.MSP(), threshold=0.0, feature_kind="logits", model_sha256=sha, tpr_target=0.95, id_tpr=1)
    with pytest.raises(ValueError, match="model_sha256"):
        OODGuard(ood.MSP(), threshold=0.0, feature_kind="pooled", model_sha256="abc", tpr_target=0.95, id_tpr=1)


def test_save_and_push_of_a_loaded_model_keep_its_guard(saved, guard, tmp_path, caplog):
    model = RetrievalModel.from_pretrained(saved)
    model.save_pretrained(tmp_path / "copy")
    assert RetrievalModel.from_pretrained(tmp_path / "copy").ood_guard.threshold == guard.threshold
    from _hub_http import fake_hub_http

    with fake_hub_http(remote=tmp_path / "remote"):  # huggingface_hub's upload, the HTTP answered locally
        model.push_to_hub("me/guarded")
    uploaded = {"me/guarded": [p.relative_to(tmp_path / "remote" / "me" / "guarded").as_posix()
                               for p in (tmp_path / "remote" / "me" / "guarded").rglob("*")]}  # fmt: skip
    assert {"ood/guard.json", "ood/config.json", "ood/model.safetensors"} <= set(uploaded["me/guarded"])
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # changed since loading: the guard no longer belongs to the weights
    with caplog.at_level("WARNING"):
        model.save_pretrained(tmp_path / "changed")
    assert not (tmp_path / "changed" / "ood").exists() and "not saved" in caplog.text


@pytest.mark.parametrize("value", [0, "", []])
def test_ood_sets_of_another_kind_is_refused_not_read_as_empty(saved, guard, tmp_path, value):
    """``"ood_sets": 0`` (or ``""``, ``[]``) was read as ``{}``: only ``null`` means none."""
    folder = tmp_path / "model"
    shutil.copytree(saved, folder)
    data = json.loads((folder / "ood" / "guard.json").read_text())
    data["ood_sets"] = value
    (folder / "ood" / "guard.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"guard.json: key ood_sets must map OOD set names"):
        RetrievalModel.from_pretrained(folder)


def test_an_ood_folder_linked_from_elsewhere_is_not_read(saved, guard, tmp_path):
    """``ood/`` a link to another model folder's guard (same weights): read from outside the model folder."""
    folder = tmp_path / "model"
    shutil.copytree(saved, folder, ignore=shutil.ignore_patterns("ood"))
    (folder / "ood").symlink_to(saved / "ood", target_is_directory=True)
    with pytest.raises(ValueError, match=r"ood is a link to .*: a guard is read only from inside its model folder"):
        RetrievalModel.from_pretrained(folder)
