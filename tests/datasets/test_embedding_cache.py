"""Tests for pml_suprank/data/embedding_cache.py: hits and misses on weights / transform / data changes, atomic shards
and a resumed pass identical to an uninterrupted one, manifests and shards from elsewhere refused (never followed),
float16 storage, several processes writing only their own shards, and ``evaluate --embedding_cache`` run twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from pml_suprank.data import SyntheticShapes, cached_embeddings, cached_features, collate, pil_to_tensor
from pml_suprank.data.embedding_cache import MANIFEST, cache_key, data_identity, transform_identity


class Net(nn.Module):
    """A tiny embedder counting its forward calls (batches); ``stop_after``: raise ``KeyboardInterrupt`` then."""

    def __init__(self, seed: int = 0, stop_after: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Linear(3 * 8 * 8, 4)
        self.calls, self.stop_after = 0, stop_after

    def forward(self, x):
        if self.stop_after is not None and self.calls >= self.stop_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.proj(nn.functional.adaptive_avg_pool2d(x, 8).flatten(1))


def _data(seed: int = 0) -> SyntheticShapes:
    return SyntheticShapes("test", num_per_class=1, image_size=16, seed=seed)  # 18 items, no transform


def _loader(ds, batch_size: int = 2) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size, collate_fn=collate)


def _embed(net, ds, folder, **kwargs):
    return cached_embeddings(net, _loader(ds), folder, shard_size=4, **kwargs)


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/shard-*.safetensors"))


def test_second_pass_embeds_nothing_and_matches_the_uncached_loop(tmp_path):
    ds, net = _data(), Net()
    first = _embed(net, ds, tmp_path)
    assert net.calls == 9  # 5 shards of 4 items (the last one 2), 2 items per batch
    _same(first, cached_embeddings(net, _loader(ds), None))  # the cache changes nothing
    net.calls = 0
    _same(_embed(net, ds, tmp_path), first)
    assert net.calls == 0
    assert first[0].shape == (18, 4) and first[1].shape == (18, 2) and torch.equal(first[2], torch.arange(18))
    (entry,) = tmp_path.iterdir()
    manifest = json.loads((entry / MANIFEST).read_text())
    assert manifest["num_items"] == 18 and manifest["shards"][-1] == "shard-00004.safetensors"
    assert manifest["key"]["feature_kind"] == "embedding" and len(_shards(tmp_path)) == 5
    normalized = _embed(net, ds, tmp_path, normalize=True)[0]
    assert torch.equal(normalized, nn.functional.normalize(first[0], dim=-1))
    assert net.calls == 0


class Scaled:
    """A deterministic transform (PIL → tensor) described by its ``repr``, with a ``mean`` as a normalisation has."""

    def __init__(self, mean: float) -> None:
        self.mean = mean

    def __call__(self, image):
        return pil_to_tensor(image) - self.mean

    def __repr__(self) -> str:
        return f"Scaled(mean={self.mean:.2f})"


class RandomScaled(Scaled):
    pass


def test_weights_transform_and_data_changes_miss(tmp_path):
    ds, net = _data(), Net()
    _embed(net, ds, tmp_path)
    with torch.no_grad():
        net.proj.bias.add_(1.0)
    net.calls = 0
    _embed(net, ds, tmp_path)
    assert net.calls == 9  # other weights
    ds.set_transform(Scaled(0.5))
    net.calls = 0
    _embed(net, ds, tmp_path)
    assert net.calls == 9  # another transform
    other = _data(seed=1)
    other.set_transform(ds.transform)
    net.calls = 0
    _embed(net, other, tmp_path)
    assert net.calls == 9  # other data
    assert len(list(tmp_path.iterdir())) == 4
    # a normalisation is keyed by its exact values; random or opaque steps are not identifiable
    a, b = Scaled(0.48501), Scaled(0.48502)
    assert repr(a) == repr(b) and transform_identity(a) != transform_identity(b)
    assert transform_identity(RandomScaled(0.5)) is None and transform_identity(lambda x: x) is None


def test_image_files_are_keyed_by_size_and_mtime(tmp_path):
    from PIL import Image

    from pml_suprank.search.image_files import ImageFiles

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(folder / f"{i}.png")
    key = data_identity(ImageFiles(folder))
    assert data_identity(ImageFiles(folder)) == key
    os.utime(folder / "1.png", ns=(1, 1))
    assert data_identity(ImageFiles(folder)) != key


def test_a_hub_style_dataset_is_keyed_by_fingerprint_and_the_files_it_points_to(tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    from pml_suprank.data import HFRetrievalDataset

    files = [tmp_path / f"{i}.png" for i in range(3)]
    for i, f in enumerate(files):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(f)

    def dataset(labels=(0, 1, 1)):
        hf = datasets.Dataset.from_dict({"image": [str(f) for f in files], "label": list(labels)})
        hf = hf.cast_column("image", datasets.Image())
        return HFRetrievalDataset(hf, ["label"], "image", torch.tensor(labels)[:, None])

    key = data_identity(dataset())
    assert key["hf"]["fingerprint"] and data_identity(dataset()) == key
    assert data_identity(dataset((0, 0, 1))) != key
    os.utime(files[2], ns=(1, 1))  # same path, other file
    assert data_identity(dataset()) != key


def test_interrupted_pass_resumes_to_the_identical_result(tmp_path):
    ds = _data()
    reference = _embed(Net(), ds, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        _embed(Net(stop_after=5), ds, tmp_path / "resumed")  # inside the third shard
    assert [p.name for p in _shards(tmp_path / "resumed")] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    entry = next((tmp_path / "resumed").iterdir())
    assert not list(entry.glob(".*.tmp"))  # the shard being written was removed
    (entry / ".shard-00002.x.tmp").write_bytes(b"half a shard")  # as a killed pass leaves them
    (entry / "shard-00003.safetensors").write_bytes(b"\x00" * 10)  # a truncated shard
    net = Net()
    with pytest.warns(UserWarning, match="shard-00003.safetensors is refused"):
        resumed = _embed(net, ds, tmp_path / "resumed")
    assert net.calls == 5  # shards 2, 3 and 4 only
    _same(resumed, reference)


def test_a_manifest_from_elsewhere_is_checked_and_never_followed(tmp_path):
    from safetensors.torch import load_file

    ds, net = _data(), Net()
    reference = _embed(net, ds, tmp_path)
    entry = next(tmp_path.iterdir())
    path = entry / MANIFEST
    good = json.loads(path.read_text())
    decoy = tmp_path.parent / f"{tmp_path.name}-decoy.safetensors"
    decoy.write_bytes((entry / "shard-00000.safetensors").read_bytes())
    bad = [
        {**good, "key": {**good["key"], "weights_sha256": "0" * 64}},  # another model's entry
        {**good, "shards": [f"../../{decoy.name}", *good["shards"][1:]]},  # a path out of the folder
        {**good, "num_items": 10**12},
        {**good, "shard_size": 0},
    ]
    for manifest in bad:
        path.write_text(json.dumps(manifest))
        with pytest.warns(UserWarning, match="manifest.json is refused"):
            _same(_embed(net, ds, tmp_path), reference)
        assert json.loads(path.read_text()) == good  # rewritten
    path.write_text(" " * (2 << 20))  # too large to be read
    with pytest.warns(UserWarning, match="manifest.json is refused"):
        _embed(net, ds, tmp_path)
    assert load_file(str(decoy)).keys() == {"embeddings", "labels", "indices"}  # untouched
    # a shard that is a link, or that names another key or other rows, is recomputed
    shard = entry / "shard-00001.safetensors"
    shard.unlink()
    shard.symlink_to(entry / "shard-00000.safetensors")
    net.calls = 0
    with pytest.warns(UserWarning, match="not a regular file"):
        _same(_embed(net, ds, tmp_path), reference)
    assert net.calls == 2 and not shard.is_symlink()
    shard.write_bytes((entry / "shard-00002.safetensors").read_bytes())
    with pytest.warns(UserWarning, match="expected this key and rows 4..8"):
        _same(_embed(net, ds, tmp_path), reference)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_shard_holding_non_finite_values_is_recomputed(tmp_path, value):
    """A shard whose metadata, names, rows and dtypes match but whose embeddings hold NaN / inf (a flipped bit, an
    edited file) was returned as it was; it is refused with a warning and recomputed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    ds, net = _data(), Net()
    reference = _embed(net, ds, tmp_path)
    shard = _shards(tmp_path)[1]
    with safe_open(str(shard), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
    tensors["embeddings"][0, 0] = value
    save_file(tensors, str(shard), metadata=meta)
    net.calls = 0
    with pytest.warns(UserWarning, match=r"refused \('embeddings' holds NaN or infinite values\); recomputing it"):
        _same(_embed(net, ds, tmp_path), reference)
    assert net.calls == 2  # that shard's 4 items, batches of 2


def test_float16_storage(tmp_path):
    from safetensors.torch import load_file

    ds, net = _data(), Net()
    full = _embed(net, ds, tmp_path)
    half = _embed(net, ds, tmp_path, dtype="float16")
    assert net.calls == 18  # another entry
    assert half[0].dtype == torch.float32 and torch.equal(half[0], full[0].half().float())
    net.calls = 0
    _same(_embed(net, ds, tmp_path, dtype="float16"), half)
    assert net.calls == 0
    stored = {load_file(str(p))["embeddings"].dtype for p in _shards(tmp_path)}
    assert stored == {torch.float16, torch.float32}
    with pytest.raises(ValueError, match="dtype must be one of"):
        _embed(net, ds, tmp_path, dtype="int8")


class _Process:
    """The part of ``accelerate.Accelerator`` the cache uses, for one of ``world`` threads."""

    def __init__(self, rank: int, world: int, barrier: threading.Barrier) -> None:
        self.process_index, self.num_processes, self._barrier = rank, world, barrier
        self.device, self.mixed_precision, self.is_local_main_process = torch.device("cpu"), "no", rank == 0

    def unwrap_model(self, model):
        return model

    def autocast(self):
        return nullcontext()

    def wait_for_everyone(self):
        self._barrier.wait(timeout=60)


def test_each_process_writes_its_own_shards_and_reads_all(tmp_path):
    ds = _data()
    reference = _embed(Net(), ds, tmp_path / "one")
    barrier, nets, results = threading.Barrier(2), [Net(), Net()], [None, None]

    def work(rank):
        results[rank] = _embed(nets[rank], ds, tmp_path / "two", accelerator=_Process(rank, 2, barrier))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [n.calls for n in nets] == [5, 4]  # shards 0, 2, 4 and 1, 3
    _same(results[0], reference)
    _same(results[1], reference)


def test_unidentifiable_data_is_embedded_without_the_cache(tmp_path):
    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"image": torch.full((3, 8, 8), float(i)), "labels": torch.tensor([i]), "index": i}

    net = Net()
    with pytest.warns(UserWarning, match="cannot be identified"):
        emb, labels, idx = cached_embeddings(net, _loader(Plain()), tmp_path)
    assert emb.shape == (4, 4) and torch.equal(idx, torch.arange(4)) and not list(tmp_path.iterdir())
    assert cache_key(net, Plain(), feature_kind="embedding") is None


def test_generic_features_and_bad_arguments(tmp_path):
    ds, net = _data(), Net()

    def extract(loader):
        x = torch.cat([b["image"].flatten(1)[:, :3] for b in loader])
        return {"mean": x.mean(1), "labels": torch.cat([b["labels"][:, 0] for b in loader])}

    out = cached_features(net, _loader(ds), tmp_path, feature_kind="pixels", extract=extract, shard_size=5)
    assert out["mean"].shape == (18,) and torch.equal(out["labels"], ds.labels[:, 0])
    with pytest.raises(ValueError, match="extract returned"):
        cached_features(net, _loader(ds), tmp_path, feature_kind="bad", extract=lambda b: {"Bad Name": torch.ones(1)})
    with pytest.raises(TypeError, match="loader must be a DataLoader"):
        cached_features(net, [1, 2], tmp_path, feature_kind="x", extract=extract)


@pytest.mark.slow
def test_evaluate_twice_embeds_once_with_identical_metrics(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    pytest.importorskip("accelerate")
    from pml_suprank.models import RetrievalModel
    from pml_suprank.recipes import evaluate

    torch.manual_seed(0)
    RetrievalModel("test_resnet", embedding_size=8, image_size=32).save_pretrained(tmp_path / "model")
    calls = []
    forward = RetrievalModel.forward

    def counted(self, x, *args, **kwargs):
        calls.append(len(x))
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(RetrievalModel, "forward", counted)
    argv = ["--model", str(tmp_path / "model"), "--num_per_class", "2", "--cpu", "--no_plots", "true"]
    cache = ["--embedding_cache", str(tmp_path / "cache")]
    plain = evaluate.main(argv)
    first = evaluate.main([*argv, *cache])
    assert sum(calls) == 72  # 36 test images, twice
    second = evaluate.main([*argv, *cache])
    assert sum(calls) == 72  # nothing embedded
    assert first == second == plain


@pytest.mark.slow
@pytest.mark.distributed
def test_evaluate_under_torchrun_fills_the_cache_one_process_reads(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    pytest.importorskip("accelerate")
    from pml_suprank.models import RetrievalModel
    from pml_suprank.recipes import evaluate

    torch.manual_seed(0)
    RetrievalModel("test_resnet", embedding_size=8, image_size=32).save_pretrained(tmp_path / "model")
    argv = ["--model", str(tmp_path / "model"), "--num_per_class", "2", "--cpu", "--no_plots", "true",
            "--embedding_cache", str(tmp_path / "cache")]  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the test
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(root), env.get("PYTHONPATH", "")])})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
               "pml_suprank.recipes.evaluate", *argv, "--output_dir", str(tmp_path / "two")]  # fmt: skip
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = []
    forward = RetrievalModel.forward
    monkeypatch.setattr(RetrievalModel, "forward", lambda self, x: calls.append(len(x)) or forward(self, x))
    metrics = evaluate.main(argv)
    assert calls == []  # every embedding read from the cache the two processes wrote
    assert metrics == pytest.approx(json.loads((tmp_path / "two" / "metrics.json").read_text()), abs=1e-12)


@pytest.mark.slow
def test_fit_heat_and_ood_score_reuse_their_features(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    from PIL import Image

    from pml_suprank.models import RetrievalModel
    from pml_suprank.recipes import fit_heat, ood_score

    torch.manual_seed(0)
    RetrievalModel("test_resnet", embedding_size=8, image_size=64).save_pretrained(tmp_path / "model")
    for i in range(6):
        Image.new("RGB", (64, 64), (40 * i, 200 - 30 * i, 90)).save(_mk(tmp_path / "images") / f"{i}.png")
    calls = []
    features = RetrievalModel.forward_features

    def counted(self, x):
        calls.append(len(x))
        return features(self, x)

    monkeypatch.setattr(RetrievalModel, "forward_features", counted)
    cache = ["--embedding_cache", str(tmp_path / "cache")]
    fit = ["--model", str(tmp_path / "model"), "--id_dataset", "synthetic", "--num_per_class", "1",
           "--num_test_per_class", "1", "--ood_datasets", "noise-uniform", "--num_noise", "8", "--detectors",
           "Mahalanobis", "KNN", "--guard", "Mahalanobis", "--train_epochs", "1", "--no_plots", "true", "--progress",
           "false", "--overwrite_output_dir", "true", "--output_dir", str(tmp_path / "fit")]  # fmt: skip
    runs = []
    for argv in (fit, [*fit, *cache], [*fit, *cache]):
        calls.clear()
        with torch.random.fork_rng():
            runs.append((fit_heat.main(argv)["table"], sum(calls)))
    (plain, n_plain), (first, n_first), (second, n_second) = runs
    assert plain == first == second and n_plain == n_first > n_second  # the second pass only trains the head
    score = ["--model", str(tmp_path / "model"), "--images", str(tmp_path / "images"), "--no_plots", "true"]
    texts = []
    for i, extra in enumerate(([], cache, cache)):
        calls.clear()
        ood_score.main([*score, "--output_dir", str(tmp_path / f"score{i}"), *extra])
        texts.append(((tmp_path / f"score{i}" / "scores.csv").read_text(), sum(calls)))
    assert texts[0] == texts[1] and texts[2] == (texts[0][0], 0)


def _mk(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
