"""Tests for pml_suprank.hub: save/load round trips (folder and Hub cache, offline), strict loading, pickle
refusal, corrupt files, model cards, and push_to_hub through huggingface_hub with only the HTTP exchange answered
locally (tests/_hub_http.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from _hub_http import fake_hub_http

from pml_suprank import hub
from pml_suprank.hub import serialization
from pml_suprank.models import RetrievalModel

pytestmark = pytest.mark.hub

TINY = "test_resnet"


@pytest.fixture(scope="module")
def model() -> RetrievalModel:
    torch.manual_seed(0)
    m = RetrievalModel(TINY, pooling="gem", embedding_size=8, image_size=32, num_classes=3).eval()
    with torch.no_grad():
        m.pool.gem.p.fill_(2.5)  # a trained, non-default parameter must survive the round trip
    m.hub_metadata = {"loss": "HAPPIERLoss", "label_names": ["fine_label", "coarse_label"]}
    return m


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _assert_same(a, b, x):
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x))
        torch.testing.assert_close(a.forward_logits(x), b.forward_logits(x))


def test_save_writes_config_weights_card(model, tmp_path):
    out = model.save_pretrained(tmp_path / "m", metrics={"h_ap": 0.5})
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "config.json", "metrics.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == "RetrievalModel"
    assert config["library_name"] == "pml-suprank"
    assert config["backbone"] == TINY and config["embedding_size"] == 8
    assert config["model_args"] == model.get_config()
    assert config["model_args"]["pretrained"] is False
    assert config["pretrained_cfg"]["input_size"] == [3, 32, 32]
    assert set(config["pretrained_cfg"]) >= {"mean", "std", "input_size"}
    assert config["training"]["loss"] == "HAPPIERLoss"
    assert config["training"]["label_names"] == ["fine_label", "coarse_label"]
    assert json.loads((out / "metrics.json").read_text()) == {"h_ap": 0.5}


def test_round_trip_local_folder(model, images, tmp_path):
    model.save_pretrained(tmp_path)
    restored = RetrievalModel.from_pretrained(tmp_path)
    assert not restored.training
    _assert_same(model, restored, images)
    assert float(restored.pool.gem.p.detach()) == pytest.approx(2.5)
    assert restored.hub_metadata["loss"] == "HAPPIERLoss"
    assert restored.get_config() == model.get_config()


def test_restore_never_downloads_backbone_weights(model, tmp_path, monkeypatch):
    import timm

    model.save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_args"]["pretrained"] = True  # even a config that asks for ImageNet weights
    cfg_path.write_text(json.dumps(cfg))
    calls = []
    real = timm.create_model

    def spy(*args, **kwargs):
        calls.append(kwargs.get("pretrained"))
        return real(*args, **kwargs)

    monkeypatch.setattr(timm, "create_model", spy)
    RetrievalModel.from_pretrained(tmp_path)
    assert calls == [False]


def _write_hub_cache(cache: Path, repo_id: str, folder: Path, commit: str = "a" * 40) -> None:
    """Populate ``cache`` with ``folder``'s files in huggingface_hub's real cache layout:
    models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main}."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    for f in folder.iterdir():
        data = f.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", blob.name))


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_round_trip_through_offline_hub_cache(model, images, tmp_path, offline_cache):
    model.save_pretrained(tmp_path / "saved")
    _write_hub_cache(offline_cache, "org/tiny-retrieval", tmp_path / "saved")
    restored = RetrievalModel.from_pretrained("org/tiny-retrieval")
    _assert_same(model, restored, images)
    config = hub.load_config("org/tiny-retrieval")
    assert config["backbone"] == TINY
    with pytest.raises(FileNotFoundError, match="not in the local Hub cache"):
        RetrievalModel.from_pretrained("org/not-cached")
    # repo names may contain dots (e.g. "timm/resnet50.a1_in1k"); invalid ids give a clear error
    _write_hub_cache(offline_cache, "org/tiny.v2", tmp_path / "saved", commit="b" * 40)
    _assert_same(model, RetrievalModel.from_pretrained("org/tiny.v2"), images)
    with pytest.raises(ValueError, match="not a valid Hub repo id|neither an existing folder"):
        RetrievalModel.from_pretrained("org/bad name!")


def test_refuses_pickles(model, tmp_path):
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="only loads safetensors"):
        RetrievalModel.from_pretrained(tmp_path)


def test_strict_loading_reports_missing_unexpected_and_shapes(model, tmp_path, caplog):
    import safetensors.torch

    model.save_pretrained(tmp_path)
    state = safetensors.torch.load_file(tmp_path / "model.safetensors")
    state["extra.weight"] = torch.zeros(1)
    del state["projection.bias"]
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing \['projection.bias'\].*unexpected \['extra.weight'\]"):
        RetrievalModel.from_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="pml_suprank.hub"):
        loose = RetrievalModel.from_pretrained(tmp_path, strict=False)
    assert "projection.bias" in caplog.text and "extra.weight" in caplog.text
    torch.testing.assert_close(loose.projection.weight, model.projection.weight)


def test_shape_mismatch_is_reported(model, tmp_path):
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="shape mismatches.*projection.weight"):
        RetrievalModel.from_pretrained(tmp_path, embedding_size=4)


def test_corrupt_files_give_clear_errors(model, tmp_path):
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        RetrievalModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt config.json"):
        RetrievalModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "RetrievalModel"}))
    with pytest.raises(ValueError, match="model_args"):
        RetrievalModel.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        RetrievalModel.from_pretrained(tmp_path / "..")
    with pytest.raises(FileNotFoundError, match="neither an existing folder"):
        RetrievalModel.from_pretrained(str(tmp_path / "missing_dir"))


def test_unknown_model_args_and_architecture(model, tmp_path):
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_args"]["new_option"] = 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="new_option"):
        RetrievalModel.from_pretrained(tmp_path)
    cfg["architecture"] = "SomethingElse"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="SomethingElse"):
        RetrievalModel.from_pretrained(tmp_path)


def test_model_card_metadata_results_and_plots(model, tmp_path):
    from huggingface_hub import ModelCard

    plot = tmp_path / "elsewhere" / "pr_curve.png"
    plot.parent.mkdir()
    plot.write_bytes(b"\x89PNG fake")
    hub_config = {
        "name": "happier_cifar100",
        "data": {"source": "uoft-cs/cifar100"},
        "hub": {"tags": ["happier"], "license": "mit", "paper_results": {"h_ap": 44.0, "recall_at_1": 70.1}},
    }
    out = model.save_pretrained(
        tmp_path / "m",
        metrics={"h_ap": 0.4567, "ndcg": 0.8, "recall_at_1_level1": 0.9, "num_queries": 100},
        hub_config=hub_config,
        plots=[plot],
        repo_id="org/m",
    )
    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "pml-suprank"
    assert {"pml-suprank", "image-retrieval", "happier", "HAPPIERLoss"} <= set(data["tags"])
    assert data["datasets"] == ["uoft-cs/cifar100"]
    assert set(data["metrics"]) == {"h_ap", "ndcg", "recall_at_1"}
    assert data["license"] == "mit"
    text = card.text
    assert "| H-AP | 45.67 | 44.00 |" in text
    assert "| NDCG | 80.00 | – |" in text
    assert "| R@1 | – | 70.10 |" in text
    assert "![pr_curve](plots/pr_curve.png)" in text
    # counts are reported as such, other rates in a collapsed table with the level named by its label column
    assert "Evaluated with 100 queries." in text and "num_queries" not in text
    assert "<details>" in text and "| R@1 (coarse_label) | 90.00 |" in text
    assert "Hierarchical Average Precision Training" in text  # the HAPPIER paper for a HAPPIER model
    assert (out / "plots" / "pr_curve.png").is_file()
    assert json.loads((out / "config.json").read_text())["training"]["hub_config"] == "happier_cifar100"


COMMIT = "/commit/" + "0" * 40


def test_push_to_hub_through_the_real_upload_path(model, images, tmp_path):
    with fake_hub_http(remote=tmp_path / "remote") as seen:
        result = model.push_to_hub("org/pushed", metrics={"h_ap": 0.3})
    assert {"/api/repos/create", "/api/models/org/pushed/commit/main"} <= set(seen)
    assert result.endswith(COMMIT)
    remote = tmp_path / "remote" / "org" / "pushed"
    assert sorted(p.name for p in remote.iterdir()) == ["README.md", "config.json", "metrics.json", "model.safetensors"]
    _assert_same(model, RetrievalModel.from_pretrained(remote), images)


def test_push_folder_skips_pickles_and_checkpoints(model, tmp_path):
    out = model.save_pretrained(tmp_path / "run")
    torch.save({}, out / "optimizer.pt")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "state.bin").write_bytes(b"x")
    with fake_hub_http(remote=tmp_path / "remote"):
        hub.push_folder_to_hub(out, "org/run")
    remote = tmp_path / "remote" / "org" / "run"
    uploaded = {p.relative_to(remote).as_posix() for p in remote.rglob("*") if p.is_file()}
    assert "optimizer.pt" not in uploaded and not any(u.startswith("checkpoints/") for u in uploaded)
    assert {"config.json", "model.safetensors", "README.md"} <= uploaded


def test_failed_push_keeps_local_results(model, tmp_path, monkeypatch):
    out = tmp_path / "results"
    with fake_hub_http(remote=tmp_path / "remote", fail_commit=True) as seen:
        with pytest.raises(RuntimeError, match="local files are kept"):
            model.push_to_hub("org/failed", save_directory=out)
        assert "/api/models/org/failed/commit/main" in seen
        assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "README.md"}
        RetrievalModel.from_pretrained(out)  # still loadable
        temp = tmp_path / "temp"
        temp.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        with pytest.raises(RuntimeError, match="(?s)commit refused by the test.*nothing was kept"):
            model.push_to_hub("org/failed")  # temporary folder: removed on failure too
    assert not any(temp.iterdir())
    assert not (tmp_path / "remote").exists()


def test_bad_repo_ids_and_missing_files(model, tmp_path):
    for bad in ("no-slash", "a/b/c", "/x", 3):
        with pytest.raises(ValueError, match="org/name"):
            hub.push_folder_to_hub(tmp_path, bad)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hub.push_folder_to_hub(tmp_path, "org/empty")

    class Plain(hub.HubMixin, torch.nn.Linear):  # no get_config(): nothing to rebuild it from
        pass

    with pytest.raises(TypeError, match="get_config"):
        Plain(2, 2).save_pretrained(tmp_path / "plain")
    assert not (tmp_path / "plain").exists()
    with pytest.raises(TypeError, match="metrics"):
        model.save_pretrained(tmp_path / "x", metrics={"h_ap": "high"})


def test_map_location(model, tmp_path, device):
    model.save_pretrained(tmp_path)
    restored = RetrievalModel.from_pretrained(tmp_path, map_location=str(device))
    assert all(p.device.type == device.type for p in restored.parameters())


def test_tied_weights_round_trip(tmp_path, images):
    """safetensors stores a tied tensor once; loading must neither report it missing nor drop the tie."""

    class Tied(RetrievalModel):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.extra = torch.nn.Linear(self.embedding_size, self.embedding_size, bias=False)
            self.extra_alias = self.extra  # the same parameters under two names

    torch.manual_seed(0)
    model = Tied(backbone=TINY, embedding_size=8).eval()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architecture"] == "Tied"
    restored = Tied.from_pretrained(tmp_path)
    torch.testing.assert_close(restored.extra.weight, model.extra.weight)
    assert restored.extra_alias.weight is restored.extra.weight
    import safetensors.torch

    saved = safetensors.torch.load_file(tmp_path / "model.safetensors")
    assert ("extra.weight" in saved) != ("extra_alias.weight" in saved)  # stored once
    with torch.no_grad():
        torch.testing.assert_close(restored(images), model(images))


# --------------------------------------------------------------------------- one HubMixin for models and detectors
def _knn():
    from pml_suprank import ood

    g = torch.Generator().manual_seed(0)
    return ood.KNN(k=3).fit(features=torch.rand(30, 5, generator=g))


def test_models_and_detectors_share_the_mixin_and_config_layout(model, tmp_path):
    from pml_suprank import ood

    assert isinstance(model, hub.HubMixin) and issubclass(ood.Detector, hub.HubMixin)
    model.save_pretrained(tmp_path / "model")
    _knn().save_pretrained(tmp_path / "det", metadata={"dataset": "cifar10"})
    common = {"architecture", "library_name", "library_version", "task", "model_args", "training"}
    m_cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    d_cfg = json.loads((tmp_path / "det" / "config.json").read_text())
    assert common <= set(m_cfg) and common <= set(d_cfg)
    assert (m_cfg["task"], d_cfg["task"]) == (serialization.RETRIEVAL_TASK, serialization.DETECTOR_TASK)
    assert d_cfg["architecture"] == "KNN" and d_cfg["model_args"]["k"] == 3 and d_cfg["fitted"] is True
    assert d_cfg["library_name"] == m_cfg["library_name"] == "pml-suprank"
    assert d_cfg["training"] == {"dataset": "cifar10"}


def test_detector_save_writes_card_and_loads_back_equal_scores(tmp_path):
    from huggingface_hub import ModelCard

    from pml_suprank import ood

    det = _knn()
    out = det.save_pretrained(tmp_path / "knn", metrics={"auroc": 0.9123, "fpr_at_95_tpr": 0.25}, repo_id="org/knn")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "metrics.json", "model.safetensors"]
    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "pml-suprank"
    assert {"pml-suprank", "out-of-distribution-detection", "KNN"} <= set(data["tags"])
    assert set(data["metrics"]) == {"auroc", "fpr_at_95_tpr"}
    assert "| auroc | 91.23 |" in card.text and "| k | `3` |" in card.text
    assert 'ood.Detector.from_pretrained("org/knn")' in card.text
    assert "k-nearest" in card.text.lower() or "knn" in card.text.lower()
    loaded = ood.Detector.from_pretrained(out)
    assert type(loaded) is ood.KNN
    x = torch.rand(6, 5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loaded.score(features=x), det.score(features=x))
    # the functional API resolves the class from config["architecture"] among the loaded HubMixin classes
    torch.testing.assert_close(hub.from_pretrained(out).score(features=x), det.score(features=x))


def test_detector_folders_of_the_previous_layout_still_load(tmp_path):
    """Folders written before the common layout: {"detector", "library", "library_version", "fitted", "config"}."""
    import safetensors.torch

    from pml_suprank import ood

    det = _knn()
    legacy = {
        "detector": "KNN",
        "library": "pml_suprank",
        "library_version": "0.1.0",
        "fitted": True,
        "config": {"k": 3},
    }
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    safetensors.torch.save_file(det.state_dict(), tmp_path / "model.safetensors")
    loaded = ood.Detector.from_pretrained(tmp_path)
    x = torch.rand(4, 5)
    torch.testing.assert_close(loaded.score(features=x), det.score(features=x))
    assert hub.load_config(tmp_path)["architecture"] == "KNN"
    # a stateless detector saved without weights
    (tmp_path / "model.safetensors").unlink()
    legacy = {"detector": "Energy", "library": "pml_suprank", "fitted": False, "config": {"temperature": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    energy = ood.Detector.from_pretrained(tmp_path)
    assert isinstance(energy, ood.Energy) and energy.temperature == 2.0


def test_model_folders_without_task_key_still_load(model, images, tmp_path):
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["task"]  # written before the common layout had it
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _assert_same(model, RetrievalModel.from_pretrained(tmp_path), images)
    assert "image-retrieval embedding model" in hub.generate_model_card(cfg)


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_failed_save_leaves_no_partial_files(model, tmp_path, monkeypatch):
    import safetensors.torch

    from pml_suprank.hub import mixin

    def broken_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    # a fresh folder: nothing is left, not even the folder
    monkeypatch.setattr(safetensors.torch, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        _knn().save_pretrained(tmp_path / "new" / "knn")
    assert not (tmp_path / "new").exists()
    # an existing save is left exactly as it was when the new one fails
    monkeypatch.undo()
    _knn().save_pretrained(tmp_path / "knn")
    before = _listing(tmp_path / "knn")
    monkeypatch.setattr(safetensors.torch, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        _knn().save_pretrained(tmp_path / "knn", metrics={"auroc": 0.5})
    assert _listing(tmp_path / "knn") == before
    # a failure in the last step (the card) does not leave the already staged weights and config behind
    monkeypatch.undo()

    def broken_card(*args, **kwargs):
        raise RuntimeError("card failed")

    monkeypatch.setattr(mixin, "generate_model_card", broken_card)
    with pytest.raises(RuntimeError, match="card failed"):
        model.save_pretrained(tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_missing_local_folder_names_the_path(tmp_path):
    from pml_suprank import ood

    missing = tmp_path / "does" / "not_exist"
    for loader in (RetrievalModel.from_pretrained, ood.Detector.from_pretrained):
        for path in (missing, str(missing), "./not_here"):
            with pytest.raises(FileNotFoundError, match=str(path).replace(".", r"\.")):
                loader(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty has no config\.json"):
        ood.Detector.from_pretrained(tmp_path / "empty")


def test_bad_repo_id_is_a_value_error(tmp_path, monkeypatch):
    from pml_suprank import ood

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    for loader in (RetrievalModel.from_pretrained, ood.Detector.from_pretrained):
        with pytest.raises(ValueError, match="nor a valid Hub repo id"):
            loader("org/bad name!", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="org/name"):
        _knn().push_to_hub("no-slash")


def test_local_files_only_with_an_unknown_repo(tmp_path):
    from pml_suprank import ood

    empty_cache = tmp_path / "cache"
    for loader in (RetrievalModel.from_pretrained, ood.Detector.from_pretrained):
        with pytest.raises(FileNotFoundError, match="'org/unknown' are not in the local Hub cache"):
            loader("org/unknown", local_files_only=True, cache_dir=empty_cache)


def test_cache_dir_and_hub_options_are_passed_through(model, images, tmp_path, monkeypatch):
    import huggingface_hub

    # a real cache layout in a custom cache_dir is found without any network call
    model.save_pretrained(tmp_path / "saved")
    custom = tmp_path / "custom_cache"
    _write_hub_cache(custom, "org/cached", tmp_path / "saved")
    restored = RetrievalModel.from_pretrained("org/cached", cache_dir=custom, local_files_only=True)
    _assert_same(model, restored, images)
    # every option reaches the download call (the only call that would touch the network)
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tmp_path / "saved")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    RetrievalModel.from_pretrained("org/m", revision="v1", cache_dir=custom, token="hf_x", force_download=True)
    repo_id, kwargs = calls[-1]
    assert repo_id == "org/m"
    assert kwargs == {
        "allow_patterns": [
            "config.json",
            "model.safetensors",
            "ood/guard.json",
            "ood/config.json",
            "ood/model.safetensors",
        ],  # the model's OOD guard, when it has one: the same snapshot
        "revision": "v1",
        "cache_dir": custom,
        "local_files_only": False,
        "token": "hf_x",
        "force_download": True,
    }
    assert hub.load_config("org/m", revision="v2")["architecture"] == "RetrievalModel"
    assert calls[-1][1]["allow_patterns"] == ["config.json"] and calls[-1][1]["revision"] == "v2"
    # a repo whose snapshot lacks the weights
    (tmp_path / "only_config").mkdir()
    shutil.copy(tmp_path / "saved" / "config.json", tmp_path / "only_config")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(tmp_path / "only_config"))
    with pytest.raises(FileNotFoundError, match="Hub repo 'org/m' has no model.safetensors"):
        RetrievalModel.from_pretrained("org/m")


def test_non_finite_or_unknown_tensors_are_refused(tmp_path):
    import safetensors.torch

    from pml_suprank import ood

    _knn().save_pretrained(tmp_path)
    state = safetensors.torch.load_file(tmp_path / "model.safetensors")
    name = next(iter(state))
    bad = dict(state)
    bad[name] = bad[name].clone()
    bad[name].view(-1)[0] = float("nan")
    safetensors.torch.save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="NaN or infinite"):
        ood.Detector.from_pretrained(tmp_path)
    safetensors.torch.save_file({**state, "stolen": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="stolen"):
        ood.Detector.from_pretrained(tmp_path)


def test_detector_push_to_hub_uploads_the_card(tmp_path):
    det = _knn()
    with fake_hub_http(remote=tmp_path / "remote") as seen:
        assert det.push_to_hub("org/knn").endswith(COMMIT)
    assert {"/api/repos/create", "/api/models/org/knn/commit/main"} <= set(seen)
    remote = tmp_path / "remote" / "org" / "knn"
    assert sorted(p.name for p in remote.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    x = torch.rand(3, 5)
    torch.testing.assert_close(type(det).from_pretrained(remote).score(features=x), det.score(features=x))


def test_loading_a_folder_of_the_other_kind_is_a_clear_error(model, tmp_path):
    from pml_suprank import ood

    model.save_pretrained(tmp_path / "model")
    _knn().save_pretrained(tmp_path / "det")
    with pytest.raises(ValueError, match="unknown detector 'RetrievalModel'"):
        ood.Detector.from_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match="holds a 'KNN'; it cannot be loaded as RetrievalModel"):
        RetrievalModel.from_pretrained(tmp_path / "det")
    with pytest.raises(TypeError, match="HubMixin subclass"):
        hub.from_pretrained(tmp_path / "model", model_class=torch.nn.Linear)


_WITHOUT_HUB = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "huggingface_hub":
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
import torch
from pml_suprank import data, hub, losses, metrics, models, ood, search
det = ood.KNN(k=2).fit(features=torch.randn(20, 4))
assert det.score(features=torch.randn(3, 4)).shape == (3,)
try:
    det.save_pretrained(sys.argv[1])
except ImportError as e:
    print(e)
"""


@pytest.mark.slow
def test_the_package_imports_without_huggingface_hub_and_its_hub_methods_say_what_to_install(tmp_path):
    """huggingface_hub is in the ``recipes`` extra: a core install imports every subpackage and runs the detectors;
    ``save_pretrained`` raises ``ImportError`` naming the extra, and writes nothing."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HUB, str(tmp_path / "det")], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'pml-suprank[recipes]'" in out.stdout
    assert not (tmp_path / "det").exists()
