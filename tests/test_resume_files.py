"""Resume is exact or refused (issue 20 item 1): every file of a checkpoint is validated before anything loads.

For each file a checkpoint needs (``model.safetensors``, ``optimizer.bin``, ``random_states_0.pkl``,
``trainer_state.json``) and each way to break it (missing, truncated, garbage, a pickle planting code), the folder
is refused naming the file; ``--resume latest`` then continues from the newest checkpoint that validates, saying
which and why in one line, and ends bit-identical to an uninterrupted run; an explicit checkpoint path is refused.
The model uses stochastic depth, so a run whose RNG states are not restored trains different weights.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("timm")

from pml_suprank import losses  # noqa: E402
from pml_suprank.training import CheckpointError, Trainer, TrainingConfig, validate_checkpoint  # noqa: E402

FILES = ("model.safetensors", "optimizer.bin", "random_states_0.pkl", "trainer_state.json")
DAMAGES = ("missing", "truncated", "garbage", "pickle")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _trainer(output_dir, seed=0, sampler=None, **cfg):
    from accelerate import Accelerator

    from pml_suprank import data
    from pml_suprank.models import RetrievalModel

    torch.manual_seed(seed)
    model = RetrievalModel(
        "test_resnet", embedding_size=16, image_size=16, backbone_kwargs={"drop_path_rate": 0.3}
    )  # fmt: skip - draws from the global RNG
    tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    train = data.SyntheticShapes("train", num_per_class=4, image_size=16, transform=tf)
    values = dict(output_dir=str(output_dir), epochs=2, batch_size=32, samples_per_class=4, eval_every=0,
                  lr_backbone=1e-3, lr_head=1e-3, log_every=1, hierarchical_labels=True, seed=3,
                  checkpoint_every=1, keep_checkpoints=0)  # fmt: skip
    values.update(cfg)
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=16)
    return Trainer(Accelerator(cpu=True), model, loss, train, TrainingConfig(**values), sampler=sampler)


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _damage(file, how, marker):
    if how == "missing":
        file.unlink()
    elif how == "truncated":
        file.write_bytes(file.read_bytes()[: max(file.stat().st_size // 2, 1)])
    elif how == "garbage":
        file.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    else:  # a pickle that would run code when unpickled (torch.save's zip format and a plain pickle)
        payload = {"state": _Payload(marker)}
        if file.suffix in (".bin", ".pkl"):
            torch.save(payload, file)
        else:
            file.write_bytes(pickle.dumps(payload))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run of 4 steps and one stopped after 3 (checkpoints at steps 1, 2, 3)."""
    root = tmp_path_factory.mktemp("resume")
    full = _trainer(root / "full", max_train_steps=4)
    full.train()
    part = _trainer(root / "part", max_train_steps=4, stop_after_steps=3)
    part.train()
    assert not part.finished
    return root, _weights(full.loss_module)


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", FILES)
def test_each_damaged_file_is_refused_naming_it(runs, tmp_path, name, how):
    root, _ = runs
    ckpt = tmp_path / "step_00000003"
    shutil.copytree(root / "part" / "checkpoints" / "step_00000003", ckpt)
    validate_checkpoint(ckpt)  # intact
    marker = tmp_path / "planted"
    _damage(ckpt / name, how, marker)
    with pytest.raises(CheckpointError) as info:
        validate_checkpoint(ckpt)
    assert str(ckpt) in str(info.value) and name in str(info.value)
    assert ("is incomplete" if how == "missing" else "is corrupt") in str(info.value)
    assert not marker.exists()


@pytest.mark.slow
def test_planted_custom_checkpoint_is_refused_unread(runs, tmp_path):
    """Accelerate would unpickle ``custom_checkpoint_*.pkl`` in full: a folder holding one is refused, never read."""
    root, _ = runs
    ckpt = tmp_path / "step_00000003"
    shutil.copytree(root / "part" / "checkpoints" / "step_00000003", ckpt)
    assert isinstance(json.loads((ckpt / "trainer_state.json").read_text())["scheduler"]["last_epoch"], int)  # JSON
    _damage(ckpt / "custom_checkpoint_0.pkl", "pickle", marker := tmp_path / "planted")
    with pytest.raises(CheckpointError, match=r"custom_checkpoint_0\.pkl.*not loaded"):
        _trainer(tmp_path, max_train_steps=4).load_checkpoint(ckpt)
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", FILES)
def test_resume_latest_after_damage_is_bit_identical_from_an_earlier_checkpoint(runs, tmp_path, capsys, name, how):
    root, expected = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    marker = tmp_path / "planted"
    _damage(run / "checkpoints" / "step_00000003" / name, how, marker)
    capsys.readouterr()
    resumed = _trainer(run, seed=1, max_train_steps=4)  # other initial weights: all must come from a checkpoint
    resumed.train(resume_from="latest")
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "--resume latest" in line]
    assert len(notes) == 1 and "skipping step_00000003" in notes[0] and name in notes[0], out
    assert notes[0].endswith("resuming from step_00000002"), notes[0]
    assert "resumed from" in out and "(step 2)" in out
    assert resumed.finished and not marker.exists()
    got = _weights(resumed.loss_module)
    assert got.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=0, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_explicit_resume_of_a_damaged_checkpoint_is_refused(runs, tmp_path, name):
    root, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    _damage(ckpt / name, "truncated", tmp_path / "planted")
    with pytest.raises(CheckpointError, match=name):
        _trainer(run, max_train_steps=4).train(resume_from=ckpt)


@pytest.mark.slow
def test_rng_states_are_validated_then_restored(runs, tmp_path):
    from pml_suprank.training.checkpoint import _load_tensors  # the weights_only reader of the trainer

    root, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    good = _load_tensors(ckpt, "random_states_0.pkl")
    # the states restored are the saved ones: the next draws equal those after the save
    _trainer(run, seed=1, max_train_steps=4).load_checkpoint(ckpt)
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.setstate(good["random_state"])
    np.random.set_state(good["numpy_random_seed"])
    torch.set_rng_state(good["torch_manual_seed"])
    assert draws == (random.random(), float(np.random.rand()), float(torch.rand(1)))
    file = ckpt / "random_states_0.pkl"
    for key, bad, match in (
        ("torch_manual_seed", torch.zeros(7, dtype=torch.uint8), "'torch_manual_seed' is not a state of that"),
        ("torch_manual_seed", good["torch_manual_seed"].float(), "'torch_manual_seed' is not a state of that"),
        ("random_state", (3, (1, 2, 3), None), "'random_state' is not a state of that generator"),
        ("numpy_random_seed", ("MT19937", np.zeros(5, np.uint32), 0, 0, 0.0), "'numpy_random_seed' is not a state"),
        ("step", -1, "'step' must be an int >= 0"),
        ("extra", 1, "must be a dict with keys in"),
        ("torch_cuda_manual_seed", [torch.zeros(3, dtype=torch.uint8)] * 9, "'torch_cuda_manual_seed' must be"),
    ):
        torch.save({**good, key: bad}, file)
        with pytest.raises(CheckpointError, match=match) as info:
            validate_checkpoint(ckpt)
        assert "random_states_0.pkl" in str(info.value)
    torch.save({k: v for k, v in good.items() if k != "torch_manual_seed"}, file)
    with pytest.raises(CheckpointError, match="lacks 'torch_manual_seed'"):
        validate_checkpoint(ckpt)


@pytest.mark.slow
def test_optimizer_file_schema_and_fit(runs, tmp_path):
    root, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    file = ckpt / "optimizer.bin"
    good = torch.load(file, weights_only=True)
    torch.save({"state": good["state"]}, file)
    with pytest.raises(CheckpointError, match="keys 'state' and 'param_groups'"):
        validate_checkpoint(ckpt)
    bad = {"state": {10**6: {}}, "param_groups": good["param_groups"]}
    torch.save(bad, file)
    with pytest.raises(CheckpointError, match="'state' must map parameter indices"):
        validate_checkpoint(ckpt)
    # structurally fine but for another shape of the parameters: refused against the trainer, before loading
    i = next(iter(good["state"]))
    wrong = {**good["state"], i: {k: (torch.zeros(3, 3) if torch.is_tensor(v) and v.dim() else v)
                                  for k, v in good["state"][i].items()}}  # fmt: skip
    torch.save({"state": wrong, "param_groups": good["param_groups"]}, file)
    validate_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match=r"optimizer.bin 'state\[\d+\]\['exp_avg'\]' has shape \(3, 3\)"):
        _trainer(run, max_train_steps=4).load_checkpoint(ckpt)


@pytest.mark.slow
def test_trainer_state_counters_must_agree(runs, tmp_path):
    root, _ = runs
    ckpt = tmp_path / "step_00000003"
    shutil.copytree(root / "part" / "checkpoints" / "step_00000003", ckpt)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    (ckpt / "trainer_state.json").write_text(json.dumps({**state, "global_step": 7}))
    with pytest.raises(CheckpointError, match="'global_step' is 7 but epoch 0 x"):
        validate_checkpoint(ckpt)
    (ckpt / "trainer_state.json").write_text("[" * 200_000)  # nesting deeper than the JSON parser recurses
    with pytest.raises(CheckpointError, match="trainer_state.json cannot be read"):
        validate_checkpoint(ckpt)


# -- issue 28: the remaining holes of "exact or refused" ----------------------------------------------------------
def _resume_latest_is_bit_identical(run, expected, capsys, skipped):
    """``--resume latest`` in ``run`` skips ``skipped`` (one note naming it), continues from step 2 and ends with the
    weights of the uninterrupted run, leaving no temporary folder."""
    capsys.readouterr()
    resumed = _trainer(run, seed=1, max_train_steps=4)  # other initial weights: all must come from a checkpoint
    resumed.train(resume_from="latest")
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "--resume latest" in line]
    assert len(notes) == 1 and f"skipping {skipped}" in notes[0], out
    assert notes[0].endswith("resuming from step_00000002"), notes[0]
    assert resumed.finished and "(step 2)" in out
    got = _weights(resumed.loss_module)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=0, msg=k)
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    return resumed


def _edit_state(ckpt, **changes):
    file = ckpt / "trainer_state.json"
    state = json.loads(file.read_text())
    state.update(changes)
    file.write_text(json.dumps(state))


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [None, {}], ids=["null", "empty"])
def test_checkpoint_without_sampler_state_is_refused(runs, tmp_path, capsys, sampler):
    # the sampler would restart at epoch 0 and the resumed run would train on other batches
    root, expected = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    _edit_state(ckpt, sampler=sampler)
    with pytest.raises(CheckpointError, match=r"sampler") as info:
        _trainer(run, max_train_steps=4).train(resume_from=ckpt)
    assert str(ckpt) in str(info.value) and "trainer_state.json" in str(info.value)
    _resume_latest_is_bit_identical(run, expected, capsys, "step_00000003")


@pytest.mark.slow
def test_optimizer_file_without_per_parameter_state_is_refused(runs, tmp_path, capsys):
    # {"state": {}, "param_groups": <original>} at step 3: Adam's moments would silently restart at zero
    root, expected = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    file = ckpt / "optimizer.bin"
    good = torch.load(file, weights_only=True)
    recorded = json.loads((ckpt / "trainer_state.json").read_text())["optimizer_state"]
    assert sorted(recorded) == sorted(good["state"]) and recorded  # the trainer records who has state
    torch.save({"state": {}, "param_groups": good["param_groups"]}, file)
    with pytest.raises(CheckpointError, match=r"optimizer.bin holds state for 0 parameters but trainer_state.json "
                                              r"'optimizer_state' lists \d+"):  # fmt: skip
        validate_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="optimizer.bin"):
        _trainer(run, max_train_steps=4).train(resume_from=ckpt)
    # one parameter's state dropped
    first = next(iter(good["state"]))
    torch.save({"state": {k: v for k, v in good["state"].items() if k != first},
                "param_groups": good["param_groups"]}, file)  # fmt: skip
    with pytest.raises(CheckpointError, match=rf"missing \[{first}\]"):
        validate_checkpoint(ckpt)
    # a checkpoint that does not record the list (older version): no state at all after a step is still refused
    torch.save({"state": {}, "param_groups": good["param_groups"]}, file)
    _edit_state(ckpt, optimizer_state=None)
    with pytest.raises(CheckpointError, match="holds no per-parameter state at step 3"):
        validate_checkpoint(ckpt)
    _resume_latest_is_bit_identical(run, expected, capsys, "step_00000003")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["key", "dtype"])
def test_optimizer_state_must_have_the_keys_and_dtypes_of_the_optimizer(runs, tmp_path, damage):
    root, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    file = ckpt / "optimizer.bin"
    good = torch.load(file, weights_only=True)
    i = next(iter(good["state"]))
    entry = dict(good["state"][i])
    assert set(entry) == {"step", "exp_avg", "exp_avg_sq"}  # Adam
    if damage == "key":
        del entry["exp_avg_sq"]
        match = rf"'state\[{i}\]' has keys \['exp_avg', 'step'\]; this optimizer \(Adam\) keeps"
    else:
        entry["exp_avg"] = entry["exp_avg"].double()
        match = r"\['exp_avg'\]' must be a tensor of dtype torch.float32; got Tensor of dtype torch.float64"
    torch.save({"state": {**good["state"], i: entry}, "param_groups": good["param_groups"]}, file)
    validate_checkpoint(ckpt)  # the file alone is well-formed; it does not fit this optimizer
    with pytest.raises(CheckpointError, match=match):
        _trainer(run, max_train_steps=4).train(resume_from=ckpt)


@pytest.mark.slow
def test_deeply_nested_later_checkpoint_does_not_stop_the_run(runs, tmp_path, capsys):
    # "[" * 100000 in a later checkpoint's trainer_state.json: --resume latest skipped it, then died with a raw
    # RecursionError when the save of that step met it, leaving .tmp-step_... (every retry died there)
    root, expected = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    (run / "checkpoints" / "step_00000003" / "trainer_state.json").write_text("[" * 100_000)
    shutil.copytree(run / "checkpoints" / "step_00000003", tmp_path / "step_00000003")
    _resume_latest_is_bit_identical(run, expected, capsys, "step_00000003")
    with pytest.raises(CheckpointError, match=r"trainer_state.json cannot be read .*nests JSON 100000 levels deep"):
        validate_checkpoint(tmp_path / "step_00000003")
    state = json.loads((run / "checkpoints" / "step_00000003" / "trainer_state.json").read_text())
    assert state["global_step"] == 3  # replaced by this run's checkpoint of that step


class _StatelessSampler:
    """A batch sampler with ``set_epoch`` but no ``state_dict`` / ``load_state_dict``: its position inside an epoch
    cannot be restored."""

    def __init__(self, inner):
        self.inner = inner

    def set_epoch(self, epoch):
        self.inner.set_epoch(epoch)

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        return iter(self.inner)


@pytest.mark.slow
def test_mid_epoch_checkpoint_with_a_stateless_sampler_is_refused(tmp_path):
    # the sampler would replay the epoch from its first batch: the resumed run would train on other batches
    sampler = _StatelessSampler(_trainer(tmp_path / "unused").sampler)
    first = _trainer(tmp_path / "run", sampler=sampler, max_train_steps=4, stop_after_steps=1)
    first.train()
    assert first.steps_per_epoch > 1
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000001"
    assert json.loads((ckpt / "trainer_state.json").read_text())["sampler"] == {}
    again = _trainer(tmp_path / "run", sampler=sampler, max_train_steps=4)
    with pytest.raises(CheckpointError, match=r"is inside an epoch \(step_in_epoch=1\) but this run's sampler "
                                              r"\(_StatelessSampler\) has no state_dict"):  # fmt: skip
        again.train(resume_from=ckpt)


def _group(key, value):
    return lambda saved: [g.__setitem__(key, value) for g in saved["param_groups"]]


def _entry(key, value):
    return lambda saved: [e.__setitem__(key, value) for e in saved["state"].values()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edit", "match", "alone"),
    [
        (_group("eps", float("nan")), r"'param_groups\[0\]\['eps'\]' must be a finite number > 0; got nan", True),
        (_group("betas", (2.0, -1.0)), r"'param_groups\[0\]\['betas'\]' must be two numbers in \[0, 1\)", True),
        (_group("lr", float("nan")), r"'param_groups\[0\]\['lr'\]' must be a finite number >= 0; got nan", True),
        (_group("foreach", "yes"), r"'param_groups\[0\]\['foreach'\]' must be null or a bool", True),
        (_group("maximize", True), r"'param_groups\[0\]\['maximize'\]' is True; this run's optimizer has False", False),
        (_group("fused", True), r"'param_groups\[0\]\['fused'\]' is True; this run's optimizer has None", False),
        (_group("zzz", 1), r"'param_groups\[0\]' has the options \['zzz'\] that this optimizer \(Adam\)", False),
        (_entry("exp_avg", torch.full((1,), float("nan"))), r"\['exp_avg'\]' holds NaN or infinite values", True),
        (_entry("exp_avg_sq", torch.full((1,), -1.0)), r"\['exp_avg_sq'\]' is a second moment and must be >= 0", True),
        (_entry("step", torch.tensor(-5.0)), r"\['step'\]' counts optimizer steps and must be in \[0, 3\]", True),
    ],
)
def test_optimizer_hyper_parameters_and_moments_are_checked_by_value(runs, tmp_path, edit, match, alone):
    """``optimizer.load_state_dict`` takes a group's options and the moments as saved: a NaN ``eps`` / ``lr``, betas
    outside ``[0, 1)``, ``maximize`` switched on (gradient ascent), NaN moments or a negative second moment were
    resumed silently; refused naming the file and the key (``alone``: by the file alone, else against the optimizer)."""
    root, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    saved = torch.load(ckpt / "optimizer.bin", weights_only=True)
    edit(saved)
    torch.save(saved, ckpt / "optimizer.bin")
    if alone:
        with pytest.raises(CheckpointError, match=match):
            validate_checkpoint(ckpt)
    else:
        validate_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match=match) as info:
        _trainer(run, max_train_steps=4).load_checkpoint(ckpt)
    assert f"{ckpt}' " in str(info.value) and "optimizer.bin '" in str(info.value)


@pytest.mark.slow
def test_an_optimizer_option_the_file_lacks_takes_its_default(runs, tmp_path):
    """A checkpoint of an older torch lacks the group options added since (torch fills their defaults on load):
    resumed, not refused."""
    root, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    ckpt = run / "checkpoints" / "step_00000003"
    saved = torch.load(ckpt / "optimizer.bin", weights_only=True)
    for group in saved["param_groups"]:
        del group["maximize"]
    torch.save(saved, ckpt / "optimizer.bin")
    trainer = _trainer(run, max_train_steps=4)
    trainer.load_checkpoint(ckpt)
    assert all(group["maximize"] is False for group in trainer.optimizer.param_groups)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"base_lrs": -1.0}, r"'scheduler.base_lrs' must be learning rates >= 0"),
        ({"last_epoch": 10**18}, r"'last_epoch' 1000000000000000000 must be in \[0, global_step 3\]"),
        ({"_step_count": 1}, r"'_step_count' 1 one more"),
        ({"_is_initial": [1]}, r"'scheduler._is_initial' must be true or false; got \[1\]"),
    ],
)
def test_the_scheduler_state_is_checked_by_value(runs, tmp_path, changes, match):
    """A negative base learning rate (gradient ascent) or a schedule position other than the checkpoint's step was
    resumed silently."""
    root, _ = runs
    ckpt = tmp_path / "step_00000003"
    shutil.copytree(root / "part" / "checkpoints" / "step_00000003", ckpt)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    groups = len(state["scheduler"]["base_lrs"])
    state["scheduler"].update({k: [v] * groups if k == "base_lrs" else v for k, v in changes.items()})
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=match):
        validate_checkpoint(ckpt)
