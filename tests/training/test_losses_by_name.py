"""Every loss by name: the package's rank losses are registered, pytorch-metric-learning losses train as baselines
(``--loss pml:MultiSimilarityLoss``, ``--loss_kwargs``), a user's class trains from its module path with one decorator
or none, an installed plugin by its entry-point name — in process and under ``accelerate launch -m``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pml_suprank import losses
from pml_suprank.losses.registry import ENTRY_POINT_GROUP, resolve_loss, unregister_loss
from pml_suprank.training import RunSpec, build_loss, build_optimizer
from pml_suprank.training import recipe as common
from pml_suprank.training.config import OptionError

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "4", "--embedding_size", "8",
    "--batch_size", "16", "--eval_batch_size", "64", "--with_tracking", "false", "--cpu", "--no_plots",
    "--max_train_steps", "2", "--skip_initial_eval",
]  # fmt: skip

USER_LOSS = '''
import torch
from torch import nn


class MyMarginLoss(nn.Module):
    """A user's loss written from scratch, no decorator: mean hinge on same-label vs other-label cosine scores."""

    def __init__(self, margin: float = 0.2):
        super().__init__()
        self.margin = margin

    def forward(self, embeddings, labels):
        e = torch.nn.functional.normalize(embeddings, dim=1)
        s = e @ e.T
        same = labels[:, None] == labels[None, :]
        return torch.relu(s[~same].mean() - s[same].mean() + self.margin)
'''


def _batch(n_classes: int = 4, m: int = 4, d: int = 8):
    g = torch.Generator().manual_seed(0)
    fine = torch.arange(n_classes).repeat_interleave(m)
    labels = torch.stack([fine, fine // 2, fine // 4], dim=1)  # three levels, fine -> coarse
    return torch.randn(n_classes * m, d, generator=g, requires_grad=True), labels


@pytest.mark.parametrize("name", list(losses.registered_losses()))
def test_every_registered_loss_builds_by_name_and_gives_a_finite_gradient(name):
    spec = RunSpec.from_values({"loss": name})
    loss_fn = build_loss(name, spec.loss_kwargs(), num_classes=4, embedding_size=8)
    emb, labels = _batch()
    entry = resolve_loss(name)
    value = loss_fn(torch.nn.functional.normalize(emb, dim=1), labels if entry.hierarchical else labels[:, 0])
    value.backward()
    assert torch.isfinite(value) and value.item() > 0 and torch.isfinite(emb.grad).all() and emb.grad.abs().sum() > 0


def test_pml_losses_are_baselines_with_their_options_checked():
    spec = RunSpec.from_values({"loss": "pml:MultiSimilarityLoss", "loss_kwargs": {"alpha": 3.0, "beta": 40.0}})
    loss_fn = build_loss(spec.loss.loss, spec.loss_kwargs(), 4, 8)
    assert (loss_fn.alpha, loss_fn.beta) == (3.0, 40.0) and not spec.loss_entry.hierarchical
    assert not spec.training_config().hierarchical_labels  # a pair loss gets the fine labels
    with pytest.raises(ValueError, match=r"--loss_kwargs \['gamma'\] are not arguments of loss pml:Multi"):
        RunSpec.from_values({"loss": "pml:MultiSimilarityLoss", "loss_kwargs": {"gamma": 1.0}})
    with pytest.raises(ValueError, match="AttributeError: module 'pytorch_metric_learning.losses' has no attribute 'N"):
        resolve_loss("pml:NoSuchLoss")
    with pytest.raises(ValueError, match="'loss.tau' does not apply to loss pml:TripletMarginLoss"):
        RunSpec.from_values({"loss": "pml:TripletMarginLoss", "tau": 0.1})
    # a proxy loss gets num_classes / embedding_size from the data and model; its proxies join the optimizer
    arcface = build_loss("pml:ArcFaceLoss", {"loss_kwargs": {"margin": 20.0}}, num_classes=6, embedding_size=8)
    assert tuple(arcface.W.shape) == (8, 6) and arcface.margin == pytest.approx(math.radians(20.0))
    with pytest.raises(OptionError) as refused:  # the constructor refuses a loss_kwargs value: loss_kwargs is blamed
        build_loss("pml:ArcFaceLoss", {"loss_kwargs": {"margin": "x"}}, num_classes=6, embedding_size=8)
    assert refused.value.problems[0][0] == "loss_kwargs"
    assert refused.value.located({"loss_kwargs": "--loss_kwargs"}).startswith(
        "--loss_kwargs {'margin': 'x'} refused by ArcFaceLoss(**{'num_classes': 6, 'embedding_size': 8, 'margin': 'x'})"
    )
    spec = RunSpec.from_values({"loss": "pml:ArcFaceLoss"})
    optimizer = build_optimizer(torch.nn.Linear(3, 8), arcface, spec.train)
    proxies = next(g for g in optimizer.param_groups if g["name"] == "proxies")
    assert proxies["params"][0] is arcface.W and proxies["lr"] == spec.train.lr_proxies


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``my_tmp_losses.py`` on sys.path: a user's loss file without any decorator."""
    (tmp_path / "my_tmp_losses.py").write_text(textwrap.dedent(USER_LOSS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_tmp_losses", None)


def test_a_users_loss_without_decorator_trains_by_module_path(user_module, tmp_path):
    out = tmp_path / "run"
    argv = [*TINY, "--loss", "my_tmp_losses:MyMarginLoss", "--loss_kwargs", '{"margin": 0.5}', "--output_dir", str(out)]
    summary = common.main(argv, "test", common.PRESETS["train"])
    assert summary["steps"] == 2 and all(torch.isfinite(torch.tensor(v)) for v in summary["after"].values())
    saved = json.loads((out / "final" / "config.json").read_text())["training"]
    assert saved["loss"] == "my_tmp_losses:MyMarginLoss" and saved["loss_kwargs"] == {"loss_kwargs": {"margin": 0.5}}


def test_list_losses_names_every_loss(capsys):
    with pytest.raises(SystemExit) as e:
        common.main(["--list_losses"], "test", common.PRESETS["train"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in losses.registered_losses()) and "pml:ClassName" in out


def _plugin(site: Path) -> None:
    """An installed plugin: a distribution on ``site`` publishing ``PluginAP`` in the entry-point group."""
    (site / "plugin_ap_loss.py").write_text(
        textwrap.dedent('''
        from pml_suprank.losses import SupAPLoss


        class PluginAPLoss(SupAPLoss):
            """SupAP published by a plugin package."""
    ''')
    )
    info = site / "plugin_ap-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-ap\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nPluginAP = plugin_ap_loss:PluginAPLoss\n")


def test_an_installed_plugin_is_a_loss_name(tmp_path, monkeypatch):
    _plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        entry = resolve_loss("PluginAP")
        assert entry.cls.__name__ == "PluginAPLoss" and not entry.hierarchical
        assert isinstance(build_loss("PluginAP", {"tau": 0.02}, 4, 8), losses.SupAPLoss)
    finally:
        unregister_loss("PluginAP")
        sys.modules.pop("plugin_ap_loss", None)


@pytest.mark.slow  # two `accelerate launch` runs of the training command (~30 s each on 2 CPU cores)
@pytest.mark.parametrize("loss", ["my_tmp_losses:MyMarginLoss", "PluginAP", "pml:MultiSimilarityLoss"])
def test_every_kind_of_loss_trains_under_accelerate_launch(loss, user_module, tmp_path):
    _plugin(user_module)
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the tests
    env.update({"HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1",
                "HF_HOME": str(tmp_path / "hf")})  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(user_module), env.get("PYTHONPATH", "")])
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--num_processes", "1",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "pml_suprank.recipes.train", *TINY, "--loss", loss, "--output_dir", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((out / "final" / "config.json").read_text())["training"]
    assert saved["loss"] == loss
