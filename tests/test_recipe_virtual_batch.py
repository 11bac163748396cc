"""The recipes' exact large batches: ``--virtual_batch_size N`` (the batch the sampler draws and the loss ranks, per
process; it replaces ``--batch_size``) and ``--chunk_size C`` (gradient caching): the refusals naming the flags, the
run fingerprint, a 2-step run, and a stopped-and-resumed run bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import parse_recipe, recipe_parser

pytest.importorskip("accelerate")
pytest.importorskip("timm")

from pml_suprank.training import TrainingConfig, run_config, run_fingerprint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "8", "--embedding_size", "16",
    "--eval_batch_size", "64", "--with_tracking", "false", "--cpu", "--skip_initial_eval", "--no_plots",
]  # fmt: skip
VIRTUAL = ["--virtual_batch_size", "32", "--chunk_size", "8", "--freeze_batch_norm", "true"]


def _spec(argv, recipe="train_happier"):
    common, parser = recipe_parser(recipe)
    return parse_recipe(parser, argv)


def _refused(argv, capsys, recipe="train_happier") -> str:
    with pytest.raises(SystemExit) as e:
        _spec(argv, recipe)
    assert e.value.code == 2
    return capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------- the options
def test_virtual_batch_size_replaces_batch_size():
    spec = _spec(["--virtual_batch_size", "48", "--chunk_size", "8"])
    assert (spec.train.batch_size, spec.train.virtual_batch_size, spec.train.chunk_size) == (48, 48, 8)
    assert spec.training_config().batch_size == 48
    spec = _spec(["--virtual_batch_size", "48", "--batch_size", "48"])  # the same value twice is accepted
    assert spec.train.batch_size == 48
    spec = _spec([])
    assert (spec.train.virtual_batch_size, spec.train.chunk_size) == (None, None)  # a plain batch by default


def test_a_virtual_batch_flag_overrides_the_config_files_batch_size(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("sampler_options:\n  batch_size: 16\ntraining:\n  chunk_size: 4\n")
    spec = _spec(["--config", str(config), "--virtual_batch_size", "64"])
    assert (spec.train.batch_size, spec.train.chunk_size) == (64, 4)
    config.write_text("sampler_options:\n  virtual_batch_size: 64\ntraining:\n  chunk_size: 16\n")  # YAML keys
    spec = _spec(["--config", str(config)])
    assert (spec.train.batch_size, spec.train.virtual_batch_size, spec.train.chunk_size) == (64, 64, 16)


def test_two_different_batch_sizes_are_refused_naming_both_flags(capsys, tmp_path):
    err = _refused(["--virtual_batch_size", "64", "--batch_size", "32"], capsys)
    assert "--virtual_batch_size 64 and --batch_size 32 differ" in err and "replaces --batch_size" in err
    config = tmp_path / "big.yaml"
    config.write_text("sampler_options:\n  virtual_batch_size: 64\n")
    err = _refused(["--config", str(config), "--batch_size", "32"], capsys)
    assert "--virtual_batch_size 64 and --batch_size 32 differ" in err


def test_a_virtual_batch_of_partial_groups_is_refused_naming_the_flags(capsys):
    err = _refused(["--virtual_batch_size", "30"], capsys)
    assert "--virtual_batch_size 30 is not a whole number of the sampler's groups (samples_per_class 4" in err
    assert "use a multiple of 4, e.g. 32 or 28" in err
    # the hierarchical sampler draws super_classes_per_batch x samples_per_class images per group
    argv = ["--sampler", "hierarchical", "--virtual_batch_size", "36", "--samples_per_class", "4"]
    err = _refused(argv, capsys)
    assert "super_classes_per_batch 2 x samples_per_class 4 = 8 images" in err and "e.g. 40 or 32" in err
    err = _refused(["--virtual_batch_size", "32", "--chunk_size", "0"], capsys)
    assert "chunk_size" in err


def test_training_config_checks_the_pair():
    assert TrainingConfig(batch_size=32, virtual_batch_size=32, chunk_size=8).chunk_size == 8
    assert TrainingConfig(virtual_batch_size=32).batch_size == 32  # another name of the batch size
    with pytest.raises(ValueError, match="--virtual_batch_size 32 and --batch_size 64"):
        TrainingConfig(virtual_batch_size=32, batch_size=64)
    with pytest.raises(ValueError, match="multiple of 4"):
        TrainingConfig(batch_size=18, virtual_batch_size=18, samples_per_class=4)
    with pytest.raises(TypeError, match="chunk_size must be null or an int >= 1; got 8.0"):
        TrainingConfig(chunk_size=8.0)
    with pytest.raises(ValueError, match="chunk_size must be null or an int >= 1; got 0"):
        TrainingConfig(chunk_size=0)


def test_both_options_are_part_of_the_run_fingerprint():
    def fingerprint(**kw):
        return run_fingerprint(run_config(TrainingConfig(batch_size=32, **kw).to_dict()))

    plain, virtual = fingerprint(), fingerprint(virtual_batch_size=32)
    chunked = fingerprint(virtual_batch_size=32, chunk_size=8)
    other_chunks = fingerprint(virtual_batch_size=32, chunk_size=16)
    assert len({plain, virtual, chunked, other_chunks}) == 4


# ---------------------------------------------------------------------------------------------------------- runs
def _env():
    env = dict(os.environ)  # noqa: TID251 - subprocess environment of the tests
    env.update({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _train(out, *extra, check=True):
    args = [sys.executable, str(ROOT / "recipes" / "train_happier.py"), *TINY, "--output_dir", str(out), *extra]
    proc = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _weights(out):
    from safetensors.torch import load_file

    return load_file(str(Path(out) / "final" / "model.safetensors"))


@pytest.mark.slow
def test_a_batch_norm_backbone_without_frozen_statistics_is_refused(tmp_path):
    proc = _train(tmp_path, "--virtual_batch_size", "32", "--chunk_size", "8", "--max_train_steps", "1", check=False)
    assert proc.returncode == 2  # a flag combination: refused as argparse refuses (one error: line)
    assert "--chunk_size 8: the backbone test_resnet has BatchNorm layers" in proc.stderr
    assert "--freeze_batch_norm true" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_two_steps_with_a_virtual_batch_in_chunks(tmp_path):
    proc = _train(tmp_path, *VIRTUAL, "--max_train_steps", "2")
    assert "batches of 32 in chunks of 8 (gradient caching)" in proc.stdout
    state = json.loads((tmp_path / "run.json").read_text())
    assert state["config"]["training"]["virtual_batch_size"] == 32
    assert state["config"]["training"]["chunk_size"] == 8
    assert json.loads((tmp_path / "final" / "training_summary.json").read_text())["steps"] == 2
    saved = json.loads((tmp_path / "final" / "training_config.json").read_text())
    assert (saved["batch_size"], saved["virtual_batch_size"], saved["chunk_size"]) == (32, 32, 8)
    assert all(torch.isfinite(w).all() for w in _weights(tmp_path).values())


@pytest.mark.slow
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path):
    common = [*VIRTUAL, "--max_train_steps", "4", "--checkpoint_every", "1", "--keep_checkpoints", "0", "--epochs", "2"]
    _train(tmp_path / "full", *common)
    part = tmp_path / "part"
    stopped = _train(part, *common, "--stop_after_steps", "2")
    assert "training interrupted at step 2" in stopped.stdout and not (part / "final").exists()
    # another chunk size is another run: refused, naming the option (exact up to the summation order only)
    other = _train(part, *common[:2], "--chunk_size", "16", *common[4:], "--resume", "latest", check=False)
    assert other.returncode != 0 and "chunk_size" in other.stderr and "resume_ignore_config" in other.stderr
    _train(part, *common, "--resume", "latest")
    full, resumed = _weights(tmp_path / "full"), _weights(part)
    assert full.keys() == resumed.keys()
    for k in full:
        torch.testing.assert_close(full[k], resumed[k], rtol=0, atol=0, msg=k)
    fingerprint = json.loads((tmp_path / "full" / "run.json").read_text())["fingerprint"]
    assert json.loads((part / "run.json").read_text())["fingerprint"] == fingerprint
