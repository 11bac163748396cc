"""The PCA-initialised projection: ``models.pca_projection``, ``RetrievalModel(projection_init="pca")``,
``init_projection_from_pca`` and the Trainer's PCA initialisation at the start of a fresh run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pml_suprank import data, losses
from pml_suprank.models import RetrievalModel, pca_projection
from pml_suprank.training import Trainer, TrainingConfig
from pml_suprank.training import trainer as trainer_module
from pml_suprank.training.pca_init import init_projection_if_requested, pca_dataset

TINY = "test_resnet"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _tiny(**kw):
    torch.manual_seed(0)
    return RetrievalModel(TINY, image_size=16, **{"embedding_size": 8, **kw})


# ------------------------------------------------------------------------------------------------ pca_projection
def test_hand_case_principal_axis_of_2d_data():
    mean = torch.tensor([3.0, 5.0], dtype=torch.float64)
    # spread 2*sqrt(2) along (1, 1)/sqrt(2) and sqrt(2) along (1, -1)/sqrt(2)
    x = torch.tensor([[2.0, 2.0], [-2.0, -2.0], [1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64) + mean
    weight, bias = pca_projection(x, 2)
    s = 1 / math.sqrt(2)
    expected = torch.tensor([[s, s], [s, -s]], dtype=torch.float64)  # largest entry positive, first one on ties
    torch.testing.assert_close(weight, expected)
    torch.testing.assert_close(bias, -(expected @ mean))
    y = x @ weight.T + bias
    torch.testing.assert_close(y.mean(0), torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(y.var(0), torch.tensor([16 / 3, 4 / 3], dtype=torch.float64))
    w1, b1 = pca_projection(x, 1)
    torch.testing.assert_close(w1, expected[:1])
    torch.testing.assert_close(b1, bias[:1])


def test_equals_an_svd_reference_up_to_sign_and_is_decorrelated():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 12, generator=g, dtype=torch.float64) @ torch.randn(12, 12, generator=g, dtype=torch.float64)
    x = x + 4.0
    weight, bias = pca_projection(x, 7)
    xc = x.numpy() - x.numpy().mean(0)
    _, svals, vh = np.linalg.svd(xc, full_matrices=False)
    ref = torch.from_numpy(vh[:7])
    signs = torch.sign((weight * ref).sum(1, keepdim=True))
    assert torch.all(signs.abs() == 1)
    torch.testing.assert_close(weight, ref * signs, rtol=0, atol=1e-9)
    torch.testing.assert_close(weight @ weight.T, torch.eye(7, dtype=torch.float64), rtol=0, atol=1e-10)
    # sign convention: the entry of largest magnitude of every component is positive
    rows = torch.arange(7)
    assert torch.all(weight[rows, weight.abs().argmax(1)] > 0)
    cov = torch.cov((x @ weight.T + bias).T)
    torch.testing.assert_close(cov, torch.diag(torch.from_numpy(svals[:7] ** 2 / 199)), rtol=1e-9, atol=1e-9)


def test_whitening_gives_unit_variances_and_dtype_is_kept():
    x = torch.randn(100, 6) * torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.5])
    weight, bias = pca_projection(x, 4, whiten=True)
    assert weight.dtype == bias.dtype == torch.float32 and weight.shape == (4, 6) and bias.shape == (4,)
    y = (x.double() @ weight.double().T + bias.double()).T
    torch.testing.assert_close(torch.cov(y), torch.eye(4, dtype=torch.float64), rtol=0, atol=1e-4)


def test_fewer_samples_or_inputs_than_outputs_give_zero_rows():
    x = torch.randn(4, 10, dtype=torch.float64)  # spans 3 directions after centring
    weight, bias = pca_projection(x, 6)
    assert torch.count_nonzero(weight[:3].abs().sum(1)) == 3
    assert torch.all(weight[3:] == 0) and torch.all(bias[3:] == 0)
    weight, bias = pca_projection(torch.randn(50, 3, dtype=torch.float64), 5)  # out_dim > C
    assert torch.all(weight[3:] == 0) and torch.all(bias[3:] == 0)
    torch.testing.assert_close(weight[:3] @ weight[:3].T, torch.eye(3, dtype=torch.float64))


@pytest.mark.parametrize(
    ("features", "out_dim", "error", "match"),
    [
        ([[1.0, 2.0], [3.0, 4.0]], 1, TypeError, "features"),
        (torch.ones(5, 2, dtype=torch.long), 1, TypeError, "features"),
        (torch.ones(5), 1, ValueError, "features"),
        (torch.ones(1, 3), 1, ValueError, "features"),
        (torch.tensor([[1.0, float("nan")], [2.0, 3.0]]), 1, ValueError, "features"),
        (torch.ones(5, 2), 0, ValueError, "out_dim"),
        (torch.ones(5, 2), True, ValueError, "out_dim"),
        (torch.ones(5, 2), 1.5, ValueError, "out_dim"),
    ],
)
def test_pca_projection_rejects_bad_inputs(features, out_dim, error, match):
    with pytest.raises(error, match=match):
        pca_projection(features, out_dim)


# ------------------------------------------------------------------------------------------------ the model option
def test_init_projection_from_pca_decorrelates_the_training_features():
    model = _tiny(projection_init="pca", layer_norm=False)
    g = torch.Generator().manual_seed(1)
    c = model.num_features
    feats = torch.randn(300, c, generator=g) @ torch.randn(c, c, generator=g) / math.sqrt(c) + 1.0
    assert model.init_projection_from_pca(feats) is model
    with torch.no_grad():
        y = model.projection(feats).double()
    cov = torch.cov(y.T)
    var = cov.diag()
    assert torch.all(var[:-1] >= var[1:])
    off = cov - torch.diag(var)
    assert off.abs().max() < 1e-4 * var.max()
    torch.testing.assert_close(y.mean(0), torch.zeros(8, dtype=torch.float64), rtol=0, atol=1e-4)


def test_forward_projection_input_is_what_the_projection_receives():
    model = _tiny().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        inputs = model.forward_projection_input(x)
        torch.testing.assert_close(model.embed_pooled(model.forward_pooled(x)),
                                   torch.nn.functional.normalize(model.projection(inputs), dim=-1))  # fmt: skip
    assert inputs.shape == (2, model.num_features)


def test_default_is_random_and_unchanged():
    torch.manual_seed(0)
    a = RetrievalModel(TINY, embedding_size=8, image_size=16)
    torch.manual_seed(0)
    b = RetrievalModel(TINY, embedding_size=8, image_size=16, projection_init="random")
    assert a.projection_init == "random" and "projection_init" not in a.get_config()
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    assert _tiny(projection_init="pca").get_config()["projection_init"] == "pca"


def test_model_option_errors_name_the_argument():
    with pytest.raises(ValueError, match="projection_init"):
        _tiny(projection_init="svd")
    with pytest.raises(ValueError, match="projection_init"):
        _tiny(projection_init="pca", embedding_size=None)
    with pytest.raises(ValueError, match="embedding_size"):
        _tiny(embedding_size=None).init_projection_from_pca(torch.randn(5, 4))
    model = _tiny(projection_init="pca")
    with pytest.raises(ValueError, match="features"):
        model.init_projection_from_pca(torch.randn(20, model.num_features + 1))
    with pytest.raises(ValueError, match="features"):
        model.init_projection_from_pca(torch.full((20, model.num_features), float("inf")))


def test_from_pretrained_keeps_the_option_and_the_saved_weights(tmp_path, monkeypatch):
    model = _tiny(projection_init="pca")
    model.init_projection_from_pca(torch.randn(40, model.num_features))
    model.save_pretrained(tmp_path / "m")

    def _refuse(*args, **kwargs):
        raise AssertionError("from_pretrained must not recompute the PCA")

    monkeypatch.setattr(RetrievalModel, "init_projection_from_pca", _refuse)
    loaded = RetrievalModel.from_pretrained(tmp_path / "m")
    assert loaded.projection_init == "pca" and loaded.get_config()["projection_init"] == "pca"
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k


# ------------------------------------------------------------------------------------------------ options
def test_options_flow_from_the_gldv2_hub_configs():
    import _hub_helpers

    from pml_suprank.training import hub_config as hc

    root = Path(__file__).resolve().parents[1] / "pml_suprank" / "hub_configs"
    for name in ("roadmap_gldv2.yaml", "happier_gldv2.yaml"):
        config = hc.load_hub_config(root / name)
        assert _hub_helpers.model_kwargs(config)["projection_init"] == "pca", name
        assert _hub_helpers.flat_options(config)["pca_samples"] == 10000, name
    assert TrainingConfig().pca_samples == 10000
    with pytest.raises(ValueError, match="pca_samples"):
        TrainingConfig(pca_samples=1)
    with pytest.raises(TypeError, match="pca_samples"):
        TrainingConfig(pca_samples=2.5)


def test_pca_dataset_uses_the_eval_transform_and_a_seeded_subset():
    model = _tiny()
    train_tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    test_tf = data.build_transforms(model.data_config, train=False)
    train = data.SyntheticShapes("train", num_per_class=2, image_size=16, transform=train_tf)
    test = data.SyntheticShapes("test", num_per_class=2, image_size=16, transform=test_tf)
    subset = pca_dataset(train, test, 10, seed=0)
    assert len(subset) == 10 and train.transform is train_tf
    item = subset[0]
    plain = data.SyntheticShapes("train", num_per_class=2, image_size=16, transform=test_tf)
    assert torch.equal(item["image"], plain[int(item["index"])]["image"])  # no augmentation
    indices = [int(subset[i]["index"]) for i in range(10)]
    assert indices == sorted(indices) and len(set(indices)) == 10
    assert indices == [int(pca_dataset(train, test, 10, seed=0)[i]["index"]) for i in range(10)]
    assert indices != [int(pca_dataset(train, test, 10, seed=1)[i]["index"]) for i in range(10)]
    assert len(pca_dataset(train, test, 10_000, seed=0)) == len(train)
    with pytest.raises(ValueError, match="pca_samples"):
        pca_dataset(train, test, 1, seed=0)


# ------------------------------------------------------------------------------------------------ the Trainer
def _trainer(tmp_path, model, **cfg):
    from accelerate import Accelerator

    train_tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    test_tf = data.build_transforms(model.data_config, train=False)
    train = data.SyntheticShapes("train", num_per_class=8, image_size=16, transform=train_tf)
    test = data.SyntheticShapes("test", num_per_class=4, image_size=16, transform=test_tf)
    values = dict(output_dir=str(tmp_path), epochs=1, batch_size=32, samples_per_class=4, eval_every=0,
                  lr_backbone=0.0, lr_head=0.0, weight_decay=0.0, log_every=1, seed=3, pca_samples=60)  # fmt: skip
    values.update(cfg)
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=model.embedding_size)
    return Trainer(Accelerator(cpu=True), model, loss, train, TrainingConfig(**values), test_dataset=test), train, test


@pytest.mark.slow
def test_trainer_sets_the_projection_once_on_a_fresh_run_and_not_on_resume(tmp_path, monkeypatch):
    calls = []

    def spy(trainer, *, fresh):
        before = trainer.model.projection.weight.detach().clone()
        did = init_projection_if_requested(trainer, fresh=fresh)
        assert trainer.progress.global_step == 0 or not did  # before the first step
        calls.append((fresh, did, before, trainer.model.projection.weight.detach().clone()))
        return did

    monkeypatch.setattr(trainer_module, "init_projection_if_requested", spy)
    model = _tiny(projection_init="pca")
    trainer, train, test = _trainer(tmp_path, model, max_train_steps=2, stop_after_steps=1)
    trainer.begin_run()  # the recipes begin the run, evaluate "before training", then train
    assert [(f, d) for f, d, *_ in calls] == [(True, True)]
    try:
        trainer.train()
    finally:
        trainer.end_run()
    assert [(f, d) for f, d, *_ in calls] == [(True, True)]  # not again in train()
    _, _, before, after = calls[0]
    assert not torch.equal(before, after)
    # the PCA of the projection inputs of the seeded 60-image subset, evaluation transform, eval mode
    subset = pca_dataset(train, test, 60, seed=3)
    images = torch.stack([subset[i]["image"] for i in range(len(subset))])
    reference = _tiny(projection_init="pca").eval()
    with torch.no_grad():
        weight, _ = pca_projection(reference.forward_projection_input(images), 8)
    torch.testing.assert_close(after, weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(trainer.model.projection.weight.detach(), after)  # lr 0: the step kept it

    resumed, _, _ = _trainer(tmp_path, _tiny(projection_init="pca", embedding_size=8), max_train_steps=2)
    with torch.no_grad():
        resumed.model.projection.weight.zero_()
    resumed.train(resume_from="latest")
    assert [(f, d) for f, d, *_ in calls[1:]] == [(False, False)]
    assert resumed.finished
    torch.testing.assert_close(resumed.model.projection.weight.detach(), after)  # from the checkpoint


ROOT = Path(__file__).resolve().parents[1]


def _run_recipe(out, *launcher, backbone=(TINY,), batch_size=32, extra=()):
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the test
    env.update({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    args = [
        *(launcher or (sys.executable,)), str(ROOT / "recipes" / "train_happier.py"), "--backbone", *backbone,
        "--image_size", "16", "--num_per_class", "8", "--embedding_size", "16", "--batch_size", str(batch_size),
        "--eval_batch_size", "64", "--with_tracking", "false", "--cpu", "--output_dir", str(out),
        "--max_train_steps", "1", "--no_plots", "--skip_initial_eval", "--projection_init", "pca",
        "--pca_samples", "50", *extra,
    ]  # fmt: skip
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_recipe_option_reaches_the_model_and_config_json(tmp_path):
    proc = _run_recipe(tmp_path)
    assert "projection initialised by PCA of 50 training features" in proc.stdout
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["model_args"]["projection_init"] == "pca"
    assert RetrievalModel.from_pretrained(tmp_path / "final").projection_init == "pca"


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_set_the_same_projection_as_one(tmp_path):
    # test_vit has no BatchNorm and the learning rates are 0: the final projection is the PCA one; 2 gloo processes
    # embed half of the 50 images each, gather them and must set exactly the projection of the single process
    from safetensors.torch import load_file

    extra = ("--lr_backbone", "0", "--lr_head", "0", "--weight_decay", "0")
    vit = ("test_vit", "--backbone_kwargs", '{"img_size": 16}')
    _run_recipe(tmp_path / "one", backbone=vit, batch_size=64, extra=extra)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    proc = _run_recipe(tmp_path / "two", *torchrun, backbone=vit, batch_size=32, extra=extra)
    assert "2 process(es)" in proc.stdout and "PCA of 50 training features" in proc.stdout
    one = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    for key in ("projection.weight", "projection.bias"):
        assert torch.equal(one[key], two[key]), key
