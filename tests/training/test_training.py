"""Tests of pml_suprank.training: configuration, parameter groups, schedule, seeded augmentation, the Accelerate
training loop (few steps), atomic checkpoints, exact resume and corrupt-checkpoint errors."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")
pytest.importorskip("timm")

from pml_suprank import losses  # noqa: E402
from pml_suprank.training import (  # noqa: E402
    CheckpointError,
    SeededAugmentation,
    Trainer,
    TrainingConfig,
    build_optimizer,
    build_scheduler,
    find_checkpoints,
    latest_checkpoint,
    validate_checkpoint,
)

# ------------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------------
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def _model(seed=0):
    from pml_suprank.models import RetrievalModel

    torch.manual_seed(seed)
    return RetrievalModel("test_resnet", embedding_size=16, image_size=16)


def _datasets(model, num_per_class=8):
    from pml_suprank import data

    train_tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    test_tf = data.build_transforms(model.data_config, train=False)
    train = data.SyntheticShapes("train", num_per_class=num_per_class, image_size=16, transform=train_tf)
    test = data.SyntheticShapes("test", num_per_class=4, image_size=16, transform=test_tf)
    return train, test


def _config(tmp_path, **kw):
    values = dict(
        output_dir=str(tmp_path),
        epochs=2,
        batch_size=32,
        samples_per_class=4,
        eval_every=0,
        lr_backbone=1e-3,
        lr_head=1e-3,
        log_every=1,
        hierarchical_labels=True,
        seed=3,
    )
    values.update(kw)
    return TrainingConfig(**values)


def _happier(num_classes=54, dim=16):  # one proxy per SyntheticShapes fine id (global ids 0..53)
    return losses.HAPPIERLoss(num_classes=num_classes, embedding_size=dim)


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------------------------------------------------
# configuration, optimizer, scheduler
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"optimizer": "lamb"}, "optimizer must be one of"),
        ({"scheduler": "step"}, "scheduler must be one of"),
        ({"sampler": "random"}, "sampler must be one of"),
        ({"batch_size": 30, "samples_per_class": 4}, "multiple of samples_per_class"),
        ({"epochs": 0}, "epochs must be an int >= 1; got 0"),
        ({"warmup_epochs": 3, "epochs": 3}, "warmup_epochs must be < epochs"),
        ({"lr_head": -1.0}, r"lr_head must be a number in \[0, 100\]; got -1.0"),
        ({"lr_backbone": 1e38}, r"lr_backbone must be a number in \[0, 100\]; got 1e\+38"),  # overflows a step
        ({"min_lr_ratio": 2.0}, r"min_lr_ratio must be a number in \[0, 1\]; got 2.0"),
        ({"max_train_steps": 0}, "max_train_steps must be null or an int >= 1; got 0"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainingConfig(**kwargs)


def test_config_type_errors_and_unknown_keys():
    with pytest.raises(TypeError, match="batch_size must be an int"):
        TrainingConfig(batch_size=64.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lr'"):
        TrainingConfig(**{"lr": 1.0})
    cfg = TrainingConfig(**{"epochs": 3, "k_values": [1, 5]})
    assert cfg.k_values == (1, 5) and cfg.to_dict()["k_values"] == [1, 5]


def test_parameter_groups_have_their_own_lr():
    model = _model()
    loss = _happier()
    cfg = TrainingConfig(lr_backbone=1e-5, lr_head=2e-5, lr_proxies=10.0, weight_decay=4e-4)
    opt = build_optimizer(model, loss, cfg)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"backbone", "head", "proxies"}
    assert groups["backbone"]["lr"] == 1e-5 and groups["head"]["lr"] == 2e-5 and groups["proxies"]["lr"] == 10.0
    assert groups["proxies"]["weight_decay"] == 0.0 and groups["head"]["weight_decay"] == 4e-4
    n_model = sum(1 for p in model.parameters() if p.requires_grad)
    assert len(groups["backbone"]["params"]) + len(groups["head"]["params"]) == n_model
    assert groups["proxies"]["params"][0] is loss.decomposability_loss.proxies or len(groups["proxies"]["params"]) == 1
    # a loss without parameters gives no proxies group; sgd is nesterov
    opt = build_optimizer(model, losses.ROADMAPLoss(), TrainingConfig(optimizer="sgd"))
    assert [g["name"] for g in opt.param_groups] == ["backbone", "head"]
    assert opt.defaults["nesterov"] is True
    with pytest.raises(TypeError, match="config must be a TrainingConfig"):
        build_optimizer(model, None, {"lr": 1})


def test_cosine_schedule_hand_values():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": 2.0}])
    sched = build_scheduler(opt, 4, TrainingConfig(min_lr_ratio=0.5))
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # lr_t = 2 * (0.5 + 0.5 * 0.5 * (1 + cos(pi t / 4)))
    expected = [2 * (0.5 + 0.25 * (1 + math.cos(math.pi * t / 4))) for t in range(5)]
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == pytest.approx(1.0)
    opt2 = torch.optim.SGD([{"params": [p], "lr": 2.0}])
    sched2 = build_scheduler(opt2, 4, TrainingConfig(scheduler="constant"))
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == 2.0


# ------------------------------------------------------------------------------------------------------------------
# seeded augmentation
# ------------------------------------------------------------------------------------------------------------------
class _RandomDataset(torch.utils.data.Dataset):
    labels = torch.zeros(4, 1, dtype=torch.long)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import random

        return {"image": torch.rand(3) + random.random(), "labels": torch.zeros(1, dtype=torch.long), "index": i}


def test_seeded_augmentation_depends_only_on_seed_epoch_index():
    ds = SeededAugmentation(_RandomDataset(), seed=5)
    a = ds[2]["image"]
    torch.manual_seed(123)  # the caller's global state does not matter ...
    state = torch.get_rng_state()
    b = ds[2]["image"]
    assert torch.equal(a, b)
    assert torch.equal(state, torch.get_rng_state())  # ... and is not touched
    assert not torch.equal(ds[1]["image"], a)
    ds.set_epoch(1)
    assert not torch.equal(ds[2]["image"], a)
    assert not torch.equal(SeededAugmentation(_RandomDataset(), seed=6)[2]["image"], a)


# ------------------------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------------------------
def _trainer(tmp_path, seed=0, loss=None, **cfg):
    acc = _accelerator()
    model = _model(seed)
    train, test = _datasets(model)
    loss = loss if loss is not None else _happier()
    return Trainer(acc, model, loss, train, _config(tmp_path, **cfg), test_dataset=test)


@pytest.mark.slow
def test_few_steps_train_updates_every_group_and_checkpoints(tmp_path):
    trainer = _trainer(tmp_path, max_train_steps=3, checkpoint_every=2, keep_checkpoints=0)
    before = _weights(trainer.model)
    proxies_before = trainer.loss.decomposability_loss.proxies.detach().clone()
    history = trainer.train()
    assert trainer.finished and trainer.progress.global_step == 3
    losses_logged = [h["loss"] for h in history if "loss" in h]
    assert len(losses_logged) == 3 and all(math.isfinite(v) for v in losses_logged)
    after = _weights(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("backbone."))
    assert not torch.equal(before["projection.weight"], after["projection.weight"])
    assert not torch.equal(proxies_before, trainer.loss.decomposability_loss.proxies.detach())
    ckpts = find_checkpoints(tmp_path)
    assert [c.name for c in ckpts] == ["step_00000002", "step_00000003"]
    state = validate_checkpoint(ckpts[-1])
    assert state["global_step"] == 3 and state["num_processes"] == 1
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "checkpoints").iterdir())


@pytest.mark.slow
def test_warmup_freezes_backbone_and_holds_the_schedule(tmp_path):
    trainer = _trainer(
        tmp_path, epochs=3, warmup_epochs=1, max_train_steps=None, loss=losses.ROADMAPLoss(), hierarchical_labels=False
    )
    spe = trainer.steps_per_epoch
    backbone0 = {k: v.clone() for k, v in trainer.model.backbone.state_dict().items() if v.is_floating_point()}
    head0 = trainer.model.projection.weight.detach().clone()
    trainer.config.epochs = 1  # run only the warm-up epoch
    trainer.total_steps = spe
    trainer.train()
    for k, v in trainer.model.backbone.named_parameters():
        assert torch.equal(v.detach(), backbone0[k]), k  # frozen: not stepped
    assert not torch.equal(head0, trainer.model.projection.weight.detach())
    lrs = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}
    assert lrs["head"] == pytest.approx(1e-3)  # no scheduler step during the warm-up
    assert all(p.requires_grad for p in trainer.model.backbone.parameters())  # unfrozen afterwards


@pytest.mark.slow
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path):
    # uninterrupted: 12 steps over two epochs (the epoch boundary is crossed after the interruption)
    full = _trainer(tmp_path / "full", seed=0, max_train_steps=12, checkpoint_every=4)
    assert full.steps_per_epoch < 12
    full.train()
    expected = _weights(full.loss_module)

    part = _trainer(tmp_path / "part", seed=0, max_train_steps=12, checkpoint_every=4, stop_after_steps=5)
    part.train()
    assert not part.finished and latest_checkpoint(tmp_path / "part").name == "step_00000005"
    # a fresh process: different initial weights, everything must come from the checkpoint
    resumed = _trainer(tmp_path / "part", seed=1, max_train_steps=12, checkpoint_every=4)
    resumed.train(resume_from="latest")
    assert resumed.finished and resumed.progress.global_step == 12
    got = _weights(resumed.loss_module)
    assert got.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=0, msg=k)


@pytest.mark.slow
def test_checkpoint_from_other_world_size_is_refused(tmp_path):
    trainer = _trainer(tmp_path, max_train_steps=1)
    trainer.train()
    ckpt = latest_checkpoint(tmp_path)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["num_processes"] = 2
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="written by 2 processes"):
        _trainer(tmp_path, max_train_steps=1).load_checkpoint(ckpt)


def test_trainer_validates_inputs(tmp_path):
    acc = _accelerator()
    model = _model()
    train, _ = _datasets(model, num_per_class=4)
    with pytest.raises(TypeError, match="config must be a TrainingConfig"):
        Trainer(acc, model, _happier(), train, {"epochs": 1})
    with pytest.raises(TypeError, match="loss must be a torch.nn.Module"):
        Trainer(acc, model, lambda e, l: e.sum(), train, _config(tmp_path))
    with pytest.raises(TypeError, match="must expose `labels`"):
        Trainer(acc, model, _happier(), [1, 2, 3], _config(tmp_path))


@pytest.mark.slow
def test_losses_and_evaluations_reach_the_accelerate_trackers(tmp_path):
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker

    class Recorder(GeneralTracker):
        name = "recorder"
        requires_logging_directory = False
        main_process_only = True

        def __init__(self):
            super().__init__()
            self.logged = []

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            self.config = values

        def log(self, values, step=None, **kwargs):
            self.logged.append((step, dict(values)))

    recorder = Recorder()
    acc = Accelerator(cpu=True, log_with=[recorder])
    acc.init_trackers("test", config={"a": 1})
    model = _model()
    train, test = _datasets(model)
    trainer = Trainer(acc, model, _happier(), train, _config(tmp_path, epochs=2, eval_every=1), test_dataset=test)
    trainer.config.epochs = 2
    trainer.total_steps = trainer.steps_per_epoch + 1  # one evaluation after the first epoch, then one more step
    trainer.train()
    keys = {k for _, values in recorder.logged for k in values}
    assert {"train/loss", "train/lr_backbone", "train/lr_proxies", "eval/h_ap", "eval/ndcg"} <= keys
    steps = [s for s, _ in recorder.logged]
    assert steps == sorted(steps) and steps[0] == 1


@pytest.mark.slow
def test_data_loader_workers_do_not_change_the_result(tmp_path):
    # the augmentation of every item is seeded by (seed, epoch, index): worker processes see the same images
    a = _trainer(tmp_path / "w0", max_train_steps=2, num_workers=0)
    a.train()
    b = _trainer(tmp_path / "w2", max_train_steps=2, num_workers=2)
    b.train()
    wa, wb = _weights(a.loss_module), _weights(b.loss_module)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=0, msg=k)


# ------------------------------------------------------------------------------------------------------------------
# package layout: the single source of the options, the re-exports of the former module
# ------------------------------------------------------------------------------------------------------------------
def test_every_training_option_is_described_in_one_place():
    from dataclasses import fields

    from pml_suprank.training.config import field_default

    for f in fields(TrainingConfig):
        assert isinstance(f.metadata["help"], str) and len(f.metadata["help"]) > 10, f.name
        if f.metadata["section"] is not None:
            check = f.metadata["check"]
            default = field_default(f)
            assert check(list(default) if isinstance(default, tuple) else default) or default is None, f.name
    assert set(TrainingConfig().to_dict()) == {f.name for f in fields(TrainingConfig)}


def test_public_names_are_exported_and_private_aliases_are_not():
    import importlib

    import pml_suprank.training as t
    from pml_suprank.metrics.report import format_metrics

    for name in (
        "CHECKPOINT_PREFIX", "TRAINER_STATE", "CheckpointError", "LossModule", "SeededAugmentation", "Trainer",
        "TrainingConfig", "RunSpec", "build_optimizer", "build_scheduler", "embed_loader", "find_checkpoints",
        "format_metrics_table", "latest_checkpoint", "validate_checkpoint",
    ):  # fmt: skip
        assert hasattr(t, name), name
    for name in ("_format_metrics", "_SHORT_KEYS", "_jsonable", "_collate", "_Progress", "_dataset_labels", "_progress",
                 "_infer_dim", "_one_column", "_check_int", "_model_groups", "LOSS_CLASSES"):  # fmt: skip
        assert not hasattr(t, name), name
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pml_suprank.training.report")
    assert t.CHECKPOINT_PREFIX == "step_" and t.TRAINER_STATE == "trainer_state.json"
    assert format_metrics({"h_ap": 0.5, "ap_level0": 0.25}) == "h_ap=0.5000  ap_level0=0.2500"


def test_embed_loader_returns_dataset_order_without_accelerator():
    from pml_suprank.training import embed_loader, make_loader

    class _Tiny(torch.utils.data.Dataset):
        labels = torch.arange(6)[:, None]

        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"image": torch.full((3,), float(i)), "labels": torch.tensor([i]), "index": i}

    model = nn.Linear(3, 2)
    emb, labels, idx = embed_loader(model, make_loader(_Tiny(), batch_size=4))
    assert emb.shape == (6, 2) and labels.shape == (6, 1) and idx.tolist() == list(range(6))
    torch.testing.assert_close(emb, model(torch.arange(6.0)[:, None].expand(6, 3)).detach())


@pytest.mark.slow
def test_scheduler_state_is_validated_on_resume(tmp_path):
    trainer = _trainer(tmp_path, max_train_steps=3, checkpoint_every=2)
    trainer.train()
    ckpt = find_checkpoints(tmp_path)[0]
    state = json.loads((ckpt / "trainer_state.json").read_text())
    fresh = _trainer(tmp_path, max_train_steps=3)
    fresh.load_checkpoint(ckpt)
    assert fresh.scheduler.last_epoch == state["scheduler"]["last_epoch"] == 2
    assert [g["lr"] for g in fresh.optimizer.param_groups] == state["scheduler"]["_last_lr"]
    for bad, match in (
        (None, r"lacks \['scheduler'\]"),
        ({**state["scheduler"], "last_epoch": "2"}, "'scheduler.last_epoch' must be an int"),
        ({**state["scheduler"], "base_lrs": [float("nan")] * 3}, "'scheduler.base_lrs' must be"),
        ({**state["scheduler"], "evil": 1}, "keys in"),
    ):
        broken = dict(state)
        if bad is None:
            broken.pop("scheduler")
        else:
            broken["scheduler"] = bad
        (ckpt / "trainer_state.json").write_text(json.dumps(broken))
        with pytest.raises(CheckpointError, match=match):
            _trainer(tmp_path, max_train_steps=3).load_checkpoint(ckpt)


_SCALER_DAMAGE = [  # a key of a real GradScaler("cpu").state_dict() -> a tampered value, and what the error says
    ("scale", float("nan"), "'scale' must be a finite number > 0; got nan"),
    ("scale", float("inf"), "'scale' must be a finite number > 0; got inf"),
    ("scale", 0.0, "'scale' must be a finite number > 0; got 0.0"),
    ("scale", "65536", "'scale' must be a finite number > 0; got '65536'"),
    ("growth_factor", 1.0, r"'growth_factor' must be a finite number > 1; got 1.0"),
    ("backoff_factor", 2.0, r"'backoff_factor' must be a number in \(0, 1\); got 2.0"),
    ("backoff_factor", 0.0, r"'backoff_factor' must be a number in \(0, 1\); got 0.0"),
    ("growth_interval", 0, "'growth_interval' must be an int >= 1; got 0"),
    ("growth_interval", 2.5, "'growth_interval' must be an int >= 1; got 2.5"),
    ("_growth_tracker", -1, "'_growth_tracker' must be an int >= 0; got -1"),
    ("_growth_tracker", 2000, "'_growth_tracker' must be below 'growth_interval' 2000 .*; got 2000"),
]


@pytest.mark.parametrize("key, value, match", _SCALER_DAMAGE, ids=lambda x: str(x)[:20])
def test_tampered_grad_scaler_state_is_refused_naming_the_file_and_key(tmp_path, key, value, match):
    from accelerate.utils import SCALER_NAME

    from pml_suprank.training.checkpoint import SCALER_FILE, _check_scaler_file

    assert SCALER_FILE == SCALER_NAME  # the file Accelerate saves and loads the GradScaler state with
    scaler = torch.amp.GradScaler("cpu")
    torch.save(scaler.state_dict(), tmp_path / SCALER_FILE)
    _check_scaler_file(tmp_path, scaler)  # the real state: accepted
    torch.save({**scaler.state_dict(), key: value}, tmp_path / SCALER_FILE)
    with pytest.raises(CheckpointError, match=f"checkpoint '{re.escape(str(tmp_path))}' .*scaler.pt {match}"):
        _check_scaler_file(tmp_path, scaler)
    with pytest.raises(CheckpointError, match=match):  # checked in any checkpoint that holds it, even with no scaler
        _check_scaler_file(tmp_path, None)


def test_grad_scaler_file_must_hold_the_state_an_enabled_scaler_needs(tmp_path):
    from pml_suprank.training.checkpoint import SCALER_FILE, _check_scaler_file

    scaler, disabled = torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu", enabled=False)
    _check_scaler_file(tmp_path, None)  # no fp16: no file needed
    _check_scaler_file(tmp_path, disabled)
    with pytest.raises(CheckpointError, match="is incomplete: scaler.pt is missing .*fp16"):
        _check_scaler_file(tmp_path, scaler)
    torch.save(disabled.state_dict(), tmp_path / SCALER_FILE)  # {}: a disabled scaler's state
    _check_scaler_file(tmp_path, None)
    with pytest.raises(CheckpointError, match=r"scaler.pt must be a GradScaler state_dict with keys .*; got \[\]"):
        _check_scaler_file(tmp_path, scaler)
    state = scaler.state_dict()
    del state["_growth_tracker"]
    torch.save(state, tmp_path / SCALER_FILE)
    with pytest.raises(CheckpointError, match=r"with keys \['_growth_tracker', .*\]; got \['backoff_factor'"):
        _check_scaler_file(tmp_path, None)
    torch.save([1.0], tmp_path / SCALER_FILE)
    with pytest.raises(CheckpointError, match="GradScaler state_dict with keys .*; got list"):
        _check_scaler_file(tmp_path, None)


@pytest.mark.slow
def test_grad_scaler_state_is_checked_before_accelerate_loads_it(tmp_path):
    """The resume path: ``load_checkpoint`` refuses a tampered ``scaler.pt`` before ``accelerator.load_state``, which
    loads a good one into the accelerator's GradScaler (set here by hand: Accelerate has none on CPU)."""
    _trainer(tmp_path, max_train_steps=1, checkpoint_every=1).train()
    ckpt = latest_checkpoint(tmp_path)
    fp16 = _trainer(tmp_path, max_train_steps=1)
    fp16.accelerator.scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(CheckpointError, match="is incomplete: scaler.pt is missing"):
        fp16.load_checkpoint(ckpt)
    torch.save({**torch.amp.GradScaler("cpu").state_dict(), "scale": 512.0}, ckpt / "scaler.pt")
    fp16.load_checkpoint(ckpt)
    assert fp16.accelerator.scaler.get_scale() == 512.0  # Accelerate loaded the checked file
    for key, value, match in (_SCALER_DAMAGE[0], _SCALER_DAMAGE[5]):
        torch.save({**torch.amp.GradScaler("cpu").state_dict(), key: value}, ckpt / "scaler.pt")
        with pytest.raises(CheckpointError, match=f"checkpoint '{re.escape(str(ckpt))}' .*scaler.pt {match}"):
            fp16.load_checkpoint(ckpt)
        assert fp16.accelerator.scaler.get_scale() == 512.0  # refused before anything was loaded


@pytest.mark.slow
def test_resume_refuses_changed_hyper_parameters_and_bad_state_values(tmp_path):
    trainer = _trainer(tmp_path, max_train_steps=2, checkpoint_every=1)
    trainer.train()
    ckpt = latest_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"other hyper-parameters \(lr_head: 0.001 -> 0.005\)"):
        _trainer(tmp_path, max_train_steps=2, lr_head=5e-3).load_checkpoint(ckpt)
    _trainer(tmp_path, max_train_steps=2, log_every=5, keep_checkpoints=4).load_checkpoint(ckpt)  # harmless changes
    state = json.loads((ckpt / "trainer_state.json").read_text())
    sampler = state["sampler"]
    for changes, match in (
        # the counters must agree with each other and with the folder's step (issue 20)
        ({"global_step": 1000}, r"inconsistent: 'global_step' is 1000 but epoch 0 x \d+ steps per epoch"),
        (
            {"global_step": 11, "epoch": 1, "sampler": {**sampler, "epoch": 1}},
            "the folder step_00000002 is step 2 but 'global_step' is 11",
        ),
        ({"epoch": [1]}, "'epoch' must be an int >= 0"),
        ({"global_step": True}, "'global_step' must be an int"),
        ({"step_in_epoch": 10**6, "sampler": {**sampler, "position": 10**6}}, "step_in_epoch 1000000"),
        ({"history": "x"}, "'history' must be a list"),
        ({"fingerprint": 7}, "'fingerprint' must be a str"),
        ({"fingerprint": None}, "'fingerprint' must be a str"),
        # the sampler state must sit where the counters say
        ({"step_in_epoch": 1}, r"inconsistent: 'sampler.position' is 2 but 'step_in_epoch' is 1"),
        ({"sampler": {**sampler, "epoch": 3}}, r"inconsistent: 'sampler.epoch' is 3 but 'epoch' is 0"),
        ({"sampler": {**sampler, "position": "2"}}, r"'sampler.position' is '2'"),
    ):
        (ckpt / "trainer_state.json").write_text(json.dumps({**state, **changes}))
        with pytest.raises(CheckpointError, match=match) as info:
            _trainer(tmp_path, max_train_steps=2).load_checkpoint(ckpt)
        assert str(ckpt) in str(info.value)
    # a checkpoint of a version without the run fingerprint cannot be matched to this run: refused
    old = {k: v for k, v in state.items() if k not in ("fingerprint", "run_config")}
    (ckpt / "trainer_state.json").write_text(json.dumps(old))
    with pytest.raises(CheckpointError, match=r"lacks \['fingerprint', 'run_config'\]"):
        _trainer(tmp_path, max_train_steps=2).load_checkpoint(ckpt)


# ------------------------------------------------------------------------------------------------------------------
# run identity: fingerprint, run.json, lock file, output-folder claim
# ------------------------------------------------------------------------------------------------------------------
def _dead_pid():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_run_fingerprint_ignores_resumable_fields_and_lists_differences():
    from pml_suprank.training.run_folder import config_differences, run_config, run_fingerprint

    base = TrainingConfig(seed=1).to_dict()
    a = run_config(base, {"model": {"backbone": "test_resnet"}})
    assert run_fingerprint(a) == run_fingerprint(run_config({**base, "log_every": 99, "output_dir": "x"},
                                                            {"model": {"backbone": "test_resnet"}}))  # fmt: skip
    b = run_config({**base, "seed": 2, "lr_head": 0.5}, {"model": {"backbone": "test_vit"}})
    assert run_fingerprint(a) != run_fingerprint(b)
    assert (
        config_differences(a, b) == "lr_head: 0.0002 -> 0.5, model.backbone: 'test_resnet' -> 'test_vit', seed: 1 -> 2"
    )
    with pytest.raises(ValueError, match="run_options must not have a 'training' key"):
        run_config(base, {"training": {}})


def test_lock_file_refuses_a_live_holder_and_takes_over_a_stale_one(tmp_path):
    import os
    import socket

    from pml_suprank.training.run_folder import LOCK_FILE, OS_LOCK_FILE, RunLock, RunLockError

    notes = []
    first = RunLock(tmp_path, note=notes.append).acquire()
    record = json.loads((tmp_path / LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    with pytest.raises(RunLockError, match=rf"lock file .*{LOCK_FILE}.* \(pid {os.getpid()} on host ") as info:
        RunLock(tmp_path).acquire()
    assert str(tmp_path / LOCK_FILE) in str(info.value)
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    first.release()  # idempotent
    # a lock left by a dead process of this host is stale: taken over, with a note
    dead = _dead_pid()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "token": "x"}))
    with RunLock(tmp_path, note=notes.append) as lock:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == lock.token
    assert notes and f"stale lock {tmp_path / LOCK_FILE} of pid {dead}" in notes[-1]
    assert not (tmp_path / LOCK_FILE).exists()
    # a holder on another host cannot be checked, an unreadable lock file cannot be judged: both refused
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": dead, "host": "elsewhere"}))
    with pytest.raises(RunLockError, match="on host 'elsewhere'"):
        RunLock(tmp_path).acquire()
    (tmp_path / LOCK_FILE).write_text("{garbage")
    with pytest.raises(RunLockError, match="delete the file only if that run is gone"):
        RunLock(tmp_path).acquire()
    # a refused run leaves the holder's record as it was (only the OS lock's holder writes it)
    fresh = {"pid": os.getpid(), "host": socket.gethostname(), "token": "fresh"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(fresh))
    with pytest.raises(RunLockError, match=rf"pid {os.getpid()} on host"):
        RunLock(tmp_path).acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == fresh
    assert sorted(p.name for p in tmp_path.iterdir()) == [OS_LOCK_FILE, LOCK_FILE]  # nothing left aside


def test_new_run_into_a_previous_runs_folder_is_refused_or_overwritten(tmp_path):
    from pml_suprank.training.run_folder import OutputDirError, claim_output_dir

    claim_output_dir(tmp_path, overwrite=False)  # empty: fine
    (tmp_path / "checkpoints" / "step_00000004").mkdir(parents=True)
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "training_summary.json").write_text('{"run_fingerprint": "' + "a" * 64 + '"}')
    (tmp_path / "run.json").write_text('{"fingerprint": "' + "a" * 64 + '"}')
    (tmp_path / "logs").mkdir()
    with pytest.raises(
        OutputDirError, match=r"already holds a previous run \(checkpoints/step_00000004, final/\)"
    ) as e:
        claim_output_dir(tmp_path, overwrite=False)
    for hint in (str(tmp_path), "--resume latest", "--output_dir", "--overwrite_output_dir true"):
        assert hint in str(e.value)
    notes = []
    claim_output_dir(tmp_path, overwrite=True, note=notes.append)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "final").exists()
    assert not (tmp_path / "run.json").exists() and (tmp_path / "logs").is_dir()  # only the run's own files go
    assert "deleted the previous run" in notes[0]


@pytest.mark.slow
def test_second_run_into_one_folder_is_refused_overwritten_or_isolated(tmp_path):
    from pml_suprank.training.run_folder import RUN_FILE, OutputDirError

    first = _trainer(tmp_path, max_train_steps=2, checkpoint_every=1, keep_checkpoints=1)
    first.train()
    run = json.loads((tmp_path / RUN_FILE).read_text())
    assert run["fingerprint"] == first.fingerprint and run["seed"] == 3
    assert validate_checkpoint(latest_checkpoint(tmp_path))["fingerprint"] == first.fingerprint
    # a new run (no resume) into the finished run's folder: refused before anything is written
    second = _trainer(tmp_path, max_train_steps=4, checkpoint_every=1, keep_checkpoints=1, lr_head=5e-3)
    with pytest.raises(OutputDirError, match="already holds a previous run"):
        second.train()
    assert json.loads((tmp_path / RUN_FILE).read_text())["fingerprint"] == first.fingerprint
    assert not (tmp_path / "run.lock").exists()  # released on the error
    # resuming it with other settings: refused, naming the difference; with the override: isolated
    differ = r"other hyper-parameters \(lr_head: 0.001 -> 0.005, max_train_steps: 2 -> 4\)"
    with pytest.raises(CheckpointError, match=differ):
        second.train(resume_from="latest")
    second.train(resume_from="latest", ignore_config_change=True)
    assert second.finished and second.progress.global_step == 4
    run = json.loads((tmp_path / RUN_FILE).read_text())
    assert run["fingerprint"] == second.fingerprint and run["previous_fingerprint"] == first.fingerprint
    # rotation (keep 1) only touched the second run's checkpoints: the first run's step 2 is still there
    owners = {c.name: validate_checkpoint(c)["fingerprint"] for c in find_checkpoints(tmp_path)}
    assert owners == {"step_00000002": first.fingerprint, "step_00000004": second.fingerprint}
    # --overwrite_output_dir: the previous runs are deleted first
    third = _trainer(tmp_path, max_train_steps=1, seed=3)
    third.train(overwrite_output_dir=True)
    assert [c.name for c in find_checkpoints(tmp_path)] == ["step_00000001"]


@pytest.mark.slow
def test_another_runs_checkpoint_continues_with_this_runs_hyper_parameters(tmp_path, capsys):
    """``ignore_config_change`` (``--resume_ignore_config``): the optimizer continues with this run's learning rates
    and weight decays (each base lr times the schedule's factor at the checkpoint's step), not the ones saved in the
    checkpoint; its moments are the checkpoint's. A same-run resume keeps the saved values (exact resume)."""
    first = _trainer(tmp_path, max_train_steps=2, checkpoint_every=1, keep_checkpoints=0)
    first.train()
    saved_state = first.optimizer.state_dict()["state"]
    second = _trainer(tmp_path, max_train_steps=4, lr_head=5e-3, weight_decay=0.0)
    second.load_checkpoint(latest_checkpoint(tmp_path), ignore_config_change=True)
    groups = {g["name"]: g for g in second.optimizer.param_groups}
    factor = second.scheduler.lr_lambdas[0](2)
    assert second.scheduler.last_epoch == 2 and 0 < factor < 1  # cosine over this run's 4 steps
    assert second.scheduler.base_lrs == [1e-3, 5e-3, second.config.lr_proxies]
    assert groups["head"]["lr"] == pytest.approx(5e-3 * factor)
    assert groups["backbone"]["lr"] == pytest.approx(1e-3 * factor)
    assert groups["head"]["weight_decay"] == groups["backbone"]["weight_decay"] == 0.0
    assert second.scheduler.get_last_lr() == [g["lr"] for g in second.optimizer.param_groups]
    for i, entry in second.optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(value, saved_state[i][key], rtol=0, atol=0)
    assert (
        "the optimizer continues with this run's settings (backbone.weight_decay: 0.0001 -> 0.0, head.lr: 0.001 "
        "-> 0.005, head.weight_decay: 0.0001 -> 0.0)" in capsys.readouterr().out
    )
    third = _trainer(tmp_path, max_train_steps=2, checkpoint_every=1, keep_checkpoints=0)  # the same run
    third.load_checkpoint(latest_checkpoint(tmp_path))
    assert [g["lr"] for g in third.optimizer.param_groups] == [g["lr"] for g in first.optimizer.param_groups]


def test_group_settings_refuse_another_optimizer_or_config():
    from pml_suprank.training.optim import apply_group_settings, build_scheduler, group_settings

    config = TrainingConfig(optimizer="sgd", momentum=0.5, lr_head=0.25)
    assert group_settings(config)["head"] == {"lr": 0.25, "weight_decay": config.weight_decay, "momentum": 0.5}
    with pytest.raises(TypeError, match="config must be a TrainingConfig; got dict"):
        group_settings({"lr_head": 0.25})
    foreign = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)  # its one group has no name
    with pytest.raises(ValueError, match=r"groups named \['backbone', 'head', 'proxies'\].*got groups \[None\]"):
        apply_group_settings(foreign, build_scheduler(foreign, 4, config), config)


@pytest.mark.slow
def test_lock_stops_a_concurrent_trainer_and_is_released_on_errors(tmp_path):
    import os
    import socket

    from pml_suprank.training.run_folder import LOCK_FILE, RunLockError

    holder = _trainer(tmp_path, max_train_steps=1)
    assert holder.begin_run() is None
    other = _trainer(tmp_path, max_train_steps=1)
    with pytest.raises(RunLockError, match=rf"{LOCK_FILE}.*\(pid {os.getpid()} on host"):
        other.train()
    holder.train()  # the holder's own run goes on
    assert (tmp_path / LOCK_FILE).exists()  # held until end_run
    holder.end_run()
    assert not (tmp_path / LOCK_FILE).exists()

    def boom(trainer, epoch, metrics):
        raise RuntimeError("callback failed")

    crashing = _trainer(tmp_path / "crash", max_train_steps=None, epochs=2)
    with pytest.raises(RuntimeError, match="callback failed"):
        crashing.train(on_epoch_end=boom)
    assert not (tmp_path / "crash" / LOCK_FILE).exists()
    # a run killed without releasing leaves a lock of a dead pid: the next run takes it over
    (tmp_path / "crash" / LOCK_FILE).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    resumed = _trainer(tmp_path / "crash", max_train_steps=None, epochs=2)
    resumed.train(resume_from="latest")
    assert resumed.finished and not (tmp_path / "crash" / LOCK_FILE).exists()


@pytest.mark.slow
def test_final_folder_matches_its_config_and_is_replaced_whole(tmp_path):
    from safetensors.torch import load_file

    trainer = _trainer(tmp_path, max_train_steps=1)
    trainer.train()
    final = trainer.save_final(plots=False, summary={"note": 1}, metadata={"loss": "HAPPIER"})
    config = json.loads((final / "config.json").read_text())
    summary = json.loads((final / "training_summary.json").read_text())
    run = json.loads((tmp_path / "run.json").read_text())
    assert config["training"]["run_fingerprint"] == summary["run_fingerprint"] == run["fingerprint"]
    assert summary["note"] == 1 and json.loads((final / "training_config.json").read_text())["seed"] == 3
    weights = load_file(str(final / "model.safetensors"))
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(weights[k], v, rtol=0, atol=0, msg=k)
    card = (final / "README.md").read_text()
    # no repo id: the usage line loads the folder by its own name (the card is written with the final name)
    assert re.search(r'from_pretrained\("(\./)?final"\)', card), card
    (final / "stale_from_another_run.txt").write_text("x")
    trainer.save_final(plots=False)
    assert not (final / "stale_from_another_run.txt").exists()  # replaced whole, never mixed
    from pml_suprank.training.run_folder import OS_LOCK_FILE  # the OS lock's file stays (deleting it would race)

    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [OS_LOCK_FILE]


@pytest.mark.slow
def test_an_overriding_run_never_deletes_another_runs_checkpoint(tmp_path):
    first = _trainer(tmp_path, max_train_steps=2, checkpoint_every=1, keep_checkpoints=0)
    first.train()
    step1, step2 = find_checkpoints(tmp_path)
    second = _trainer(tmp_path, max_train_steps=2, checkpoint_every=1, keep_checkpoints=0, lr_head=5e-3)
    second.train(resume_from=step1, ignore_config_change=True)
    # the second run's step 2 took the name; the first run's is kept aside, out of the resume candidates
    assert validate_checkpoint(step2)["fingerprint"] == second.fingerprint
    aside = tmp_path / "checkpoints" / f"step_00000002-run-{first.fingerprint[:12]}"
    assert validate_checkpoint(aside)["fingerprint"] == first.fingerprint
    assert find_checkpoints(tmp_path) == [step1, step2]


@pytest.mark.parametrize("kernel", ["auto", "dense", "sorted"])
def test_kernel_option_reaches_every_recipe_loss(kernel):
    from pml_suprank.losses import registered_losses
    from pml_suprank.training.options import LossOptions, build_loss, loss_keys

    assert LossOptions().kernel == "auto"
    ranked = [name for name in registered_losses() if "kernel" in loss_keys(name)]
    assert set(registered_losses()) - set(ranked) == {"CSL"}  # the proxy baseline ranks nothing
    for name in ranked:
        loss = build_loss(name, {"kernel": kernel}, num_classes=8, embedding_size=16)
        assert loss.kernel == kernel and getattr(loss, "rank_loss", loss).kernel == kernel, name


def test_kernel_option_is_validated():
    from pml_suprank.training.hub_config import validate_hub_config

    base = {"name": "t", "model": {"backbone": "test_resnet"}, "data": {"dataset": "synthetic"}}
    validate_hub_config({**base, "loss": {"name": "ROADMAP", "kernel": "sorted"}})
    with pytest.raises(ValueError, match="kernel"):
        validate_hub_config({**base, "loss": {"name": "ROADMAP", "kernel": "fast"}})
