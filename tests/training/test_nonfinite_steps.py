"""Training never applies a non-finite gradient: a step whose loss or gradient norm is NaN / inf is skipped (weights,
optimizer state and schedule untouched, gradients zeroed), counted in the logs and the checkpoints (exact on resume),
and more than ``max_nonfinite_steps`` such steps in a row stop the run with :class:`NonFiniteTrainingError` after a
checkpoint of the last good state. Finite runs are bitwise those of the loop without the check, with the same single
host read per step."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("timm")

from _helpers import import_recipe, profiled_ops  # noqa: E402

from pml_suprank import losses  # noqa: E402
from pml_suprank.training import (  # noqa: E402
    CheckpointError,
    NonFiniteTrainingError,
    Trainer,
    TrainingConfig,
    latest_checkpoint,
    validate_checkpoint,
)
from pml_suprank.training.loss_module import backward_step  # noqa: E402
from pml_suprank.training.nonfinite import NonFiniteSteps, grad_norm  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

NAN = float("nan")


# ------------------------------------------------------------------------------------------------------------------
# helpers: the tiny synthetic run of tests/training/test_training.py, and non-finite values at chosen steps
# ------------------------------------------------------------------------------------------------------------------
def _trainer(tmp_path, seed=0, trainer_class=Trainer, accelerator=None, **cfg):
    from accelerate import Accelerator

    from pml_suprank import data
    from pml_suprank.models import RetrievalModel

    torch.manual_seed(seed)
    model = RetrievalModel("test_resnet", embedding_size=16, image_size=16)
    tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    train = data.SyntheticShapes("train", num_per_class=4, image_size=16, transform=tf)
    values = dict(output_dir=str(tmp_path), epochs=2, batch_size=16, samples_per_class=4, eval_every=0, log_every=1,
                  lr_backbone=1e-3, lr_head=1e-3, seed=3)  # fmt: skip
    values.update(cfg)
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=16)
    acc = accelerator if accelerator is not None else Accelerator(cpu=True)
    return trainer_class(acc, model, loss, train, TrainingConfig(**values))


class _NonFiniteAt:
    """Makes the step's ``kind`` non-finite on the calls (0-based training steps) in ``steps``: ``"gradient"`` — the
    projection weight's gradient is multiplied by NaN (finite loss: the torch 2.14 CPU bf16 conv case); ``"loss"`` —
    the loss value is multiplied by NaN (finite embeddings; the loss and every gradient become NaN). Non-finite
    embeddings never reach the step: the losses refuse them (``tests/test_finite_or_refused.py``)."""

    def __init__(self, trainer, steps, kind="gradient", first_call=0):
        self.steps, self.calls = set(steps), first_call
        projection = trainer.model.projection
        if kind == "gradient":
            projection.weight.register_hook(lambda g: g * NAN if self.calls - 1 in self.steps else g)
        projection.register_forward_pre_hook(self._count)
        if kind == "loss":
            trainer.loss.register_forward_hook(lambda m, a, out: out * NAN if self.calls - 1 in self.steps else out)

    def _count(self, module, args):
        if module.training:
            self.calls += 1


def _params(trainer):
    return {k: v.detach().clone() for k, v in trainer.loss_module.named_parameters()}


def _optimizer_state(trainer):
    return [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for s in trainer.optimizer.state.values()]


def _snapshots(trainer):
    """Record ``(params, optimizer state, scheduler step, lrs)`` before and after every ``_step`` of ``trainer``."""
    records = []
    step = trainer._step

    def recording(batch, warm):
        before = (_params(trainer), _optimizer_state(trainer), trainer.scheduler.last_epoch)
        out = step(batch, warm)
        grads = [p.grad for p in trainer.loss_module.parameters()]
        records.append((before, (_params(trainer), _optimizer_state(trainer), trainer.scheduler.last_epoch), grads))
        return out

    trainer._step = recording
    return records


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _same_optimizer_state(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k] for k in x)
        for x, y in zip(a, b)
    )


def _state(ckpt):
    return json.loads((ckpt / "trainer_state.json").read_text())


# ------------------------------------------------------------------------------------------------------------------
# the gradient norm
# ------------------------------------------------------------------------------------------------------------------
def test_grad_norm_is_the_norm_of_all_gradients_and_flags_any_non_finite_entry():
    a, c = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    a.grad, b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0, 0.0, 0.0], dtype=torch.float64)
    assert grad_norm([a, b, c]).item() == 5.0  # c has no gradient; mixed dtypes
    assert grad_norm([c]).item() == 0.0
    b.grad[2] = NAN
    assert math.isnan(grad_norm([a, b]).item())
    b.grad[2] = math.inf
    assert grad_norm([a, b]).item() == math.inf
    half = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    half.grad = torch.tensor([3e38, 3e38], dtype=torch.bfloat16)  # finite entries whose float32 norm overflows
    assert grad_norm([half]).item() == math.inf


def test_counters_stop_after_limit_plus_one_steps_in_a_row():
    notes = []
    counter = NonFiniteSteps(limit=2)
    verdicts = [counter.record(f, i + 1, 1.0, NAN, notes.append) for i, f in enumerate([False, True, False, False])]
    assert verdicts == [False, False, False, False] and (counter.skipped, counter.consecutive) == (3, 2)
    assert counter.record(False, 5, NAN, NAN, notes.append)  # the third in a row: more than 2
    assert (counter.skipped, counter.consecutive) == (4, 3) and len(notes) == 4
    assert notes[0] == ("step 1: non-finite gradient (loss 1, gradient norm nan): step skipped, weights unchanged "
                        "(1 in a row, at most 2 allowed; 1 skipped in all)")  # fmt: skip
    assert NonFiniteSteps(limit=0).record(False, 1, NAN, 1.0, notes.append)


def test_the_limit_is_a_resumable_setting_outside_the_run_fingerprint():
    from pml_suprank.training import run_fingerprint
    from pml_suprank.training.run_folder import run_config

    default = TrainingConfig()
    assert default.max_nonfinite_steps == 10
    other = TrainingConfig(max_nonfinite_steps=0)
    # a run stopped by non-finite steps resumes with a higher limit as the same run, and checkpoints of versions
    # without the option keep their fingerprint
    assert "max_nonfinite_steps" not in run_config(other.to_dict())["training"]
    assert run_fingerprint(run_config(default.to_dict())) == run_fingerprint(run_config(other.to_dict()))


# ------------------------------------------------------------------------------------------------------------------
# the training loop
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gradient", "loss"])
def test_a_non_finite_step_is_skipped_counted_logged_and_checkpointed(tmp_path, kind, capsys):
    trainer = _trainer(tmp_path, max_train_steps=3, grad_clip=1.0 if kind == "loss" else None)
    _NonFiniteAt(trainer, steps={1}, kind=kind)
    records = _snapshots(trainer)
    history = trainer.train()
    assert trainer.finished and trainer.progress.global_step == 3
    (b0, a0, _), (b1, a1, grads1), (b2, a2, _) = records
    # the skipped step: parameters and optimizer state bitwise unchanged, no scheduler step, gradients zeroed
    assert _equal(a1[0], b1[0]) and _same_optimizer_state(a1[1], b1[1]) and a1[2] == b1[2]
    assert all(g is None for g in grads1)
    # the finite steps moved the weights, the Adam step count and the schedule
    for before, after in ((b0, a0), (b2, a2)):
        assert not _equal(after[0], before[0]) and after[2] == before[2] + 1
    assert [s["step"].item() for s in a2[1]] == [2.0] * len(a2[1])  # two optimizer steps out of three
    assert all(torch.isfinite(v).all() for v in a2[0].values())
    assert trainer.scheduler.last_epoch == 2
    logged = [(h["step"], h["skipped_nonfinite_steps"]) for h in history if "loss" in h]
    assert logged == [(1, 0), (2, 1), (3, 1)]
    assert math.isfinite(history[1]["loss"]) == (kind == "gradient")  # a NaN loss is left out of the logged mean
    out = capsys.readouterr().out
    assert f"step 2: non-finite {kind} (" in out and "step skipped, weights unchanged (1 in a row, at most 10" in out
    state = _state(latest_checkpoint(tmp_path))
    assert (state["skipped_nonfinite_steps"], state["consecutive_nonfinite_steps"]) == (1, 0)


def test_persistent_non_finite_steps_stop_with_a_checkpoint_of_the_last_good_state_and_resume_exactly(tmp_path):
    from safetensors.torch import load_file

    # uninterrupted: step 1 finite, then NaN gradients for ever; max 2 in a row -> stops at step 4 (3 bad steps)
    full = _trainer(tmp_path / "full", max_train_steps=8, max_nonfinite_steps=2)
    _NonFiniteAt(full, steps=range(1, 100))
    records = _snapshots(full)
    with pytest.raises(NonFiniteTrainingError) as info:
        full.train()
    message = str(info.value)
    assert len(records) == 4 and full.progress.global_step == 4
    assert message.startswith("training stopped at step 4: 3 steps in a row had a non-finite loss or gradient (the "
                              "last: loss ")  # fmt: skip
    assert "gradient norm nan), more than max_nonfinite_steps=2; 3 steps skipped in all." in message
    for needle in ("those after step 1 (the last finite one)", "--max_nonfinite_steps",
                   "--mixed_precision no (this run: no)", "--lr_backbone", "--grad_clip", "--resume latest",
                   f"saved in checkpoint {tmp_path / 'full' / 'checkpoints' / 'step_00000004'}"):  # fmt: skip
        assert needle in message, needle
    good = records[0][1][0]  # the parameters after step 1
    assert all(_equal(after[0], good) for _, after, _ in records[1:])
    ckpt = latest_checkpoint(tmp_path / "full")
    assert ckpt.name == "step_00000004"
    state = validate_checkpoint(ckpt)
    assert (state["skipped_nonfinite_steps"], state["consecutive_nonfinite_steps"]) == (3, 3)
    saved = load_file(str(ckpt / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in good.items())  # the last good weights, never NaN ones
    assert not (tmp_path / "full" / "run.lock").exists()  # the lock was released

    # interrupted after step 2 (one bad step), resumed in a fresh trainer: the streak continues where it stopped
    part = _trainer(tmp_path / "part", max_train_steps=8, max_nonfinite_steps=2, stop_after_steps=2)
    _NonFiniteAt(part, steps=range(1, 100))
    part.train()
    assert (_state(latest_checkpoint(tmp_path / "part"))["consecutive_nonfinite_steps"]) == 1
    resumed = _trainer(tmp_path / "part", seed=1, max_train_steps=8, max_nonfinite_steps=2)
    _NonFiniteAt(resumed, steps=range(100), first_call=2)
    with pytest.raises(NonFiniteTrainingError, match="training stopped at step 4: 3 steps in a row"):
        resumed.train(resume_from="latest")
    assert (resumed.nonfinite.skipped, resumed.nonfinite.consecutive) == (3, 3)
    assert _equal(_params(resumed), good)


def test_zero_allows_no_non_finite_step(tmp_path):
    trainer = _trainer(tmp_path, max_train_steps=3, max_nonfinite_steps=0)
    _NonFiniteAt(trainer, steps={0}, kind="loss")
    before = _params(trainer)
    with pytest.raises(NonFiniteTrainingError, match="training stopped at step 1: 1 step in a row") as info:
        trainer.train()
    assert "more than max_nonfinite_steps=0" in str(info.value) and "the initial ones" in str(info.value)
    assert _equal(_params(trainer), before) and latest_checkpoint(tmp_path).name == "step_00000001"


def test_checkpoint_counters_are_validated_and_default_to_zero_when_absent(tmp_path):
    trainer = _trainer(tmp_path, max_train_steps=2)
    _NonFiniteAt(trainer, steps={0})
    trainer.train()
    ckpt = latest_checkpoint(tmp_path)
    state = _state(ckpt)
    assert (state["skipped_nonfinite_steps"], state["consecutive_nonfinite_steps"]) == (1, 0)
    for key, value, match in (
        ("skipped_nonfinite_steps", -1, "'skipped_nonfinite_steps' must be an int >= 0; got -1"),
        ("consecutive_nonfinite_steps", True, "'consecutive_nonfinite_steps' must be an int >= 0; got True"),
        ("consecutive_nonfinite_steps", 2, "'consecutive_nonfinite_steps' 2 <= 'skipped_nonfinite_steps' 1 <= "),
        ("skipped_nonfinite_steps", 3, "'skipped_nonfinite_steps' 3 <= 'global_step' 2 does not hold"),
    ):
        (ckpt / "trainer_state.json").write_text(json.dumps({**state, key: value}))
        with pytest.raises(CheckpointError, match=match):
            validate_checkpoint(ckpt)
    # a checkpoint written before the counters existed: its run applied every step, so it resumes with 0
    old = {k: v for k, v in state.items() if "nonfinite" not in k}
    (ckpt / "trainer_state.json").write_text(json.dumps(old))
    resumed = _trainer(tmp_path, max_train_steps=2)
    resumed.nonfinite.skipped = 7
    resumed.load_checkpoint(ckpt)
    assert (resumed.nonfinite.skipped, resumed.nonfinite.consecutive) == (0, 0)


class _UncheckedTrainer(Trainer):
    """The training step without the non-finite check (the loop before it existed)."""

    def _step(self, batch, warm):
        acc = self.accelerator
        images, labels, index = (batch[k].to(acc.device) for k in ("image", "labels", "index"))
        loss = backward_step(acc, self.loss_module, images, labels, index, self.chunk_size)
        if self.config.grad_clip is not None:
            acc.clip_grad_norm_(self.loss_module.parameters(), self.config.grad_clip)
        self.optimizer.step()
        if not warm:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach()), 0.0, True


@pytest.mark.parametrize("grad_clip", [None, 0.05])
@pytest.mark.slow
def test_finite_runs_are_bitwise_unchanged_and_read_the_host_once_per_step(tmp_path, grad_clip):
    checked = _trainer(tmp_path / "a", max_train_steps=3, grad_clip=grad_clip)
    checked.train()
    plain = _trainer(tmp_path / "b", max_train_steps=3, grad_clip=grad_clip, trainer_class=_UncheckedTrainer)
    plain.train()
    assert _equal(_params(checked), _params(plain))
    assert _same_optimizer_state(_optimizer_state(checked), _optimizer_state(plain))
    assert [h["loss"] for h in checked.progress.history] == [h["loss"] for h in plain.progress.history]
    # host reads: the check adds none; its one read (loss and gradient norm together) replaces the loss's float()
    batch = next(iter(checked._train_loader()))
    new = profiled_ops(lambda: checked._step(batch, False), host_reads=True)[1]
    old = profiled_ops(lambda: plain._step(batch, False), host_reads=True)[1]
    assert len(new) == len(old) and new.count("tolist") == 1 and old.count("tolist") == 0


def test_fp16_grad_scaler_backs_off_on_a_skipped_step(tmp_path):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    acc.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)  # what Accelerate builds for fp16 on a GPU
    trainer = _trainer(tmp_path, max_train_steps=3, accelerator=acc)
    _NonFiniteAt(trainer, steps={1})
    records = _snapshots(trainer)
    trainer.train()
    assert _equal(records[1][1][0], records[1][0][0]) and records[1][1][2] == records[1][0][2]
    assert not _equal(records[2][1][0], records[2][0][0])
    assert acc.scaler.get_scale() == 2.0**9 and trainer.nonfinite.skipped == 1  # backed off once, then stepped


def test_the_command_line_ends_a_diverging_run_with_one_error_line(tmp_path, capsys):
    # a loss that is NaN from its second step on (tests/training/_nonfinite_loss.py)
    argv = ["--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "4", "--embedding_size", "16",
            "--batch_size", "16", "--with_tracking", "false", "--cpu", "--output_dir", str(tmp_path),
            "--max_train_steps", "6", "--skip_initial_eval", "true", "--no_plots", "true",
            "--loss", "_nonfinite_loss:NaNAfterFirstStepLoss", "--max_nonfinite_steps", "1"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        import_recipe("train_happier").main(argv)
    assert exc.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert len(err) == 1 and ": error: training stopped at step 3: 2 steps in a row had a non-finite loss" in err[0]
    assert "--max_nonfinite_steps" in err[0] and "those after step 1" in err[0]
    state = validate_checkpoint(latest_checkpoint(tmp_path))
    assert (state["global_step"], state["skipped_nonfinite_steps"]) == (3, 2)


@pytest.mark.slow
@pytest.mark.distributed
def test_every_process_skips_the_same_steps_when_one_process_alone_has_a_nan_loss(tmp_path):
    # process 1's loss is NaN from step 2 on, process 0's stays finite: DDP's all-reduce gives both the NaN gradient,
    # so both skip step 2 and both stop at step 3 after one checkpoint (a different decision would hang a barrier)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",  # noqa: TID251
           "PYTHONPATH": os.pathsep.join([str(root), str(Path(__file__).parent)])}  # fmt: skip
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            str(root / "recipes" / "train_happier.py"), "--backbone", "test_resnet", "--image_size", "16",
            "--num_per_class", "4", "--embedding_size", "16", "--batch_size", "16", "--with_tracking", "false", "--cpu",
            "--output_dir", str(tmp_path), "--max_train_steps", "6", "--skip_initial_eval", "true", "--no_plots",
            "true", "--loss", "_nonfinite_loss:NaNOnRankOneLoss", "--max_nonfinite_steps", "1"]  # fmt: skip
    proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    # torchrun stops the other worker once one has exited, so the second process may be terminated before it
    # prints: every process that reports stops at step 3, and the checkpoint both wrote agrees
    assert proc.returncode == 1 and "exitcode  : 1" in proc.stderr, proc.stdout + proc.stderr[-3000:]
    stops = re.findall(r": error: training stopped at step (\d+): (\d+) steps in a row", proc.stderr)
    assert stops and set(stops) == {("3", "2")}, proc.stderr[-3000:]
    assert "step 2: non-finite gradient (loss " in proc.stdout  # the main process: a finite loss, a NaN gradient
    state = validate_checkpoint(latest_checkpoint(tmp_path))
    assert (state["global_step"], state["num_processes"], state["skipped_nonfinite_steps"]) == (3, 2, 2)


def test_diverged_weights_skip_their_steps_and_stop_with_the_non_finite_error_not_a_traceback(tmp_path):
    """Weights a diverging run overflowed (``--lr 1e30``) give NaN embeddings: the loss never sees them (its input
    check would raise ``ValueError: embeddings contains NaN``), the steps are skipped and the run stops after
    ``max_nonfinite_steps`` with :class:`NonFiniteTrainingError`."""
    trainer = _trainer(tmp_path, max_train_steps=8, max_nonfinite_steps=2)
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(float("inf"))
    with pytest.raises(NonFiniteTrainingError, match="training stopped at step 3: 3 steps in a row") as info:
        trainer.train()
    assert "non-finite values; newest valid one: None" in str(info.value)
    assert (trainer.nonfinite.skipped, trainer.nonfinite.consecutive) == (3, 3)


def test_finite_or_zero_and_nan_unless_keep_finite_values_bitwise():
    from pml_suprank.training.nonfinite import finite_or_zero, nan_unless

    x = torch.randn(4, 3, requires_grad=True)
    y, ok = finite_or_zero(x)
    assert bool(ok) and torch.equal(y, x)
    loss = nan_unless(ok, (y * y).sum())
    loss.backward()
    assert torch.equal(x.grad, 2 * x.detach())
    z, ok = finite_or_zero(torch.tensor([[1.0, float("nan")]]))
    assert not bool(ok) and torch.equal(z, torch.zeros(1, 2)) and math.isnan(float(nan_unless(ok, z.sum())))
