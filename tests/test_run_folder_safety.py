"""Clear errors around the run folder (issue 20 item 6): a full disk or a read-only folder during a checkpoint names
the path and what was kept and leaves no partial folder; temporaries of dead runs are removed at the next start
(only in that run's folder, once its lock is held); the lock is an OS lock released when its holder dies."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import warnings

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("timm")

from pml_suprank.training.checkpoint import CheckpointSaveError, find_checkpoints  # noqa: E402
from pml_suprank.training.run_folder import (  # noqa: E402
    LOCK_FILE,
    RunLock,
    RunLockError,
    remove_stale_temporaries,
)


def _trainer(output_dir, embedding_size=16, **cfg):
    from accelerate import Accelerator

    from pml_suprank import data, losses
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training import Trainer, TrainingConfig

    torch.manual_seed(0)
    model = RetrievalModel("test_resnet", embedding_size=embedding_size, image_size=16)
    tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    train = data.SyntheticShapes("train", num_per_class=4, image_size=16, transform=tf)
    values = dict(output_dir=str(output_dir), epochs=1, batch_size=32, samples_per_class=4, eval_every=0,
                  log_every=1, hierarchical_labels=True, seed=3, checkpoint_every=1, keep_checkpoints=0)  # fmt: skip
    values.update(cfg)
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=embedding_size)
    return Trainer(Accelerator(cpu=True), model, loss, train, TrainingConfig(**values))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4480 vs 4374"), None),
        (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
        (OSError(errno.EROFS, "Read-only file system"), "read-only or not writable"),
    ],
    ids=["torch-unexpected-pos", "enospc", "erofs"],
)
def test_failed_checkpoint_save_names_the_path_and_what_was_kept(tmp_path, monkeypatch, error, cause):
    trainer = _trainer(tmp_path, max_train_steps=3, stop_after_steps=2)
    trainer.train()
    assert [p.name for p in find_checkpoints(tmp_path)] == ["step_00000001", "step_00000002"]
    real = torch.save

    def failing_save(obj, f, *args, **kwargs):  # half a file, then the error the disk gives
        if str(f).endswith("optimizer.bin"):
            with open(f, "wb") as out:
                out.write(b"PK\x03\x04" + b"\0" * 100)
            raise error
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    resumed = _trainer(tmp_path, max_train_steps=3)
    with pytest.raises(CheckpointSaveError) as info:
        resumed.train(resume_from="latest")
    message = str(info.value)
    assert ".tmp-step_00000003" in message and str(tmp_path) in message
    assert "the previous checkpoints are kept unchanged (step_00000001, step_00000002" in message
    assert "--resume latest continues from step_00000002" in message
    if cause is not None:
        assert cause in message
    assert str(error) in message
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert not (tmp_path / LOCK_FILE).exists()  # released on the error
    monkeypatch.setattr(torch, "save", real)
    again = _trainer(tmp_path, max_train_steps=3)
    again.train(resume_from="latest")
    assert again.finished


def test_stale_temporaries_of_this_folder_only_are_removed_once_the_lock_is_held(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    for folder in (run, other):
        (folder / "checkpoints" / ".tmp-step_00000007").mkdir(parents=True)
        (folder / "checkpoints" / ".tmp-step_00000007" / "model.safetensors").write_bytes(b"partial")
        (folder / ".tmp-final-12345" / "final").mkdir(parents=True)
        (folder / ".run.json.999.tmp").write_text("{")
    (run / "checkpoints" / "step_00000006").mkdir()
    (run / ".tmp-notes").mkdir()  # not ours: kept
    notes = []
    held = RunLock(run, note=notes.append).acquire()
    try:
        # a second run into the folder is refused before it touches anything
        (run / "checkpoints" / ".tmp-step_00000008").mkdir()
        with pytest.raises(RunLockError):
            RunLock(run, note=notes.append).acquire()
        assert (run / "checkpoints" / ".tmp-step_00000008").exists()
    finally:
        held.release()
    assert not (run / "checkpoints" / ".tmp-step_00000007").exists()
    assert not (run / ".tmp-final-12345").exists() and not (run / ".run.json.999.tmp").exists()
    assert (run / "checkpoints" / "step_00000006").exists() and (run / ".tmp-notes").exists()
    assert len(notes) == 1 and ".tmp-final-12345" in notes[0] and "checkpoints/.tmp-step_00000007" in notes[0]
    # the other folder is untouched
    assert (other / "checkpoints" / ".tmp-step_00000007").exists() and (other / ".tmp-final-12345").exists()
    assert remove_stale_temporaries(run, notes.append) == ["checkpoints/.tmp-step_00000008"]


@pytest.mark.slow
def test_lock_of_a_killed_process_is_released_by_the_os(tmp_path):
    import pml_suprank

    root = os.path.dirname(os.path.dirname(pml_suprank.__file__))  # this checkout, not an installed copy
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {root!r})\n"
        "from pml_suprank.training.run_folder import RunLock\n"
        f"RunLock({str(tmp_path)!r}).acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunLockError, match=rf"pid {proc.pid} on host "):
            RunLock(tmp_path).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    notes = []
    with RunLock(tmp_path, note=notes.append):  # the OS released its lock; its record is stale
        pass
    assert notes and f"pid {proc.pid}" in notes[0]


def test_record_of_a_reused_pid_is_stale(tmp_path):
    # a record naming a live pid of this host that started after the record: that pid was reused
    live = os.getpid()
    record = {"pid": live, "host": socket.gethostname(), "token": "old", "start": "1"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    notes = []
    lock = RunLock(tmp_path, note=notes.append).acquire()
    lock.release()
    assert notes and "stale lock" in notes[0]
    # without a start time (a run of an older version), a live pid is still refused
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": live, "host": socket.gethostname()}))
    with pytest.raises(RunLockError, match=rf"pid {live} on host"):
        RunLock(tmp_path).acquire()


# -- issue 28: clear messages, never a traceback ----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "error",
    [
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })',
        OSError(errno.ENOSPC, "No space left on device"),
    ],
    ids=["safetensors-error", "enospc"],
)
def test_failed_weights_write_is_a_checkpoint_save_error(tmp_path, monkeypatch, error):
    # a full disk during the model.safetensors write raised SafetensorError past the checkpoint writer (raw
    # traceback, partial .tmp- folder left)
    import accelerate.utils.other as accelerate_io
    from safetensors import SafetensorError

    trainer = _trainer(tmp_path, max_train_steps=3, stop_after_steps=1)
    trainer.train()
    real = accelerate_io.safe_save_file

    def failing_write(tensors, filename, *args, **kwargs):  # half a file, then the error the writer gives
        with open(filename, "wb") as out:
            out.write(b"\x10\0\0\0\0\0\0\0{")
        raise SafetensorError(error) if isinstance(error, str) else error

    monkeypatch.setattr(accelerate_io, "safe_save_file", failing_write)
    resumed = _trainer(tmp_path, max_train_steps=3)
    with pytest.raises(CheckpointSaveError) as info:
        resumed.train(resume_from="latest")
    message = str(info.value)
    assert "cannot write checkpoint step_00000002" in message and "the disk is full" in message
    assert "--resume latest continues from step_00000001" in message and "--output_dir" in message
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert not (tmp_path / LOCK_FILE).exists()
    monkeypatch.setattr(accelerate_io, "safe_save_file", real)
    again = _trainer(tmp_path, max_train_steps=3)
    again.train(resume_from="latest")
    assert again.finished


def test_output_dir_that_is_a_file_or_not_writable_is_refused_by_name(tmp_path):
    from pml_suprank.training.run_folder import OutputDirError, prepare_output_dir

    file = tmp_path / "results.txt"
    file.write_text("notes")
    with pytest.raises(OutputDirError, match=rf"--output_dir '{file}' is a file, not a folder"):
        RunLock(file).acquire()
    with pytest.raises(OutputDirError, match=r"cannot be created \(a part of the path is a file\)"):
        prepare_output_dir(file / "run")
    assert file.read_text() == "notes"


@pytest.mark.parametrize("where", ["read-only-folder", "read-only-filesystem"])
def test_output_dir_that_cannot_be_written_is_refused_by_name(tmp_path, where):
    from pml_suprank.training.run_folder import OutputDirError

    if where == "read-only-folder":
        if os.geteuid() == 0:
            pytest.skip("root writes into a folder without write permission")
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o500)
    else:
        target = "/sys/pml-suprank-run"  # sysfs: no folder can be created there, not even by root
        try:
            os.mkdir(target)
        except OSError:
            pass
        else:
            os.rmdir(target)
            pytest.skip("/sys is writable here")
    with pytest.raises(OutputDirError, match=r"--output_dir '.*' cannot be (created|written) \(.+\): choose a folder"):
        RunLock(target).acquire()


def test_symlinked_final_with_overwrite_is_refused_and_its_target_kept(tmp_path):
    from pml_suprank.training.run_folder import OutputDirError, claim_output_dir

    run, elsewhere = tmp_path / "run", tmp_path / "storage"
    (run / "checkpoints" / "step_00000004").mkdir(parents=True)
    (elsewhere / "final").mkdir(parents=True)
    (elsewhere / "final" / "model.safetensors").write_bytes(b"weights")
    (run / "final").symlink_to(elsewhere / "final", target_is_directory=True)
    with pytest.raises(OutputDirError, match=r"--overwrite_output_dir: .* holds symbolic links \(final -> .*storage"):
        claim_output_dir(run, overwrite=True, note=print)
    assert (elsewhere / "final" / "model.safetensors").read_bytes() == b"weights"
    assert (run / "checkpoints" / "step_00000004").is_dir() and (run / "final").is_symlink()  # nothing deleted


@pytest.mark.slow
def test_resume_latest_in_another_runs_folder_says_so(tmp_path, capsys):
    # the checkpoints of another run (another embedding size: they do not fit this model) are skipped; today's
    # message said "starting from scratch", then advised --resume latest
    from pml_suprank.training.run_folder import OutputDirError

    first = _trainer(tmp_path, max_train_steps=2)
    first.train()
    other = _trainer(tmp_path, max_train_steps=2, lr_head=0.005, embedding_size=8)
    capsys.readouterr()
    with pytest.raises(OutputDirError) as info:
        other.train(resume_from="latest")
    message = str(info.value)
    assert message.startswith(f"--resume latest: output_dir '{tmp_path}' holds another run")
    assert "lr_head: 0.0" in message and "-> 0.005" in message
    assert "--overwrite_output_dir true" in message and "another --output_dir" in message
    assert "starting from scratch" not in capsys.readouterr().out
    assert [p.name for p in find_checkpoints(tmp_path)] == ["step_00000001", "step_00000002"]
    assert not (tmp_path / LOCK_FILE).exists()


TINY_RECIPE = ["--backbone", "test_resnet", "--image_size", "16", "--num_per_class", "4", "--embedding_size", "16",
               "--batch_size", "32", "--with_tracking", "false", "--cpu", "--skip_initial_eval", "--no_plots",
               "--max_train_steps", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", ["output-dir-is-a-file", "missing-checkpoint", "corrupt-checkpoint"])
def test_recipe_prints_refusals_without_a_traceback(tmp_path, capsys, case):
    from pml_suprank.recipes import train_happier

    out = tmp_path / "run"
    extra: list[str] = []
    if case == "output-dir-is-a-file":
        out.write_text("notes")
        expected = rf"--output_dir '{out}' is a file, not a folder"
    elif case == "missing-checkpoint":
        extra = ["--resume", str(tmp_path / "nowhere")]
        expected = rf"--resume {tmp_path / 'nowhere'}: checkpoint '{tmp_path / 'nowhere'}' does not exist"
    else:
        ckpt = out / "checkpoints" / "step_00000001"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text("[" * 100_000)
        extra = ["--resume", str(ckpt)]
        expected = rf"--resume {ckpt}: checkpoint '{ckpt}' is corrupt: trainer_state.json cannot be read"
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        train_happier.main([*TINY_RECIPE, "--output_dir", str(out), *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and re.search(expected, lines[0]), err
    assert "Traceback" not in err


def test_overwrite_deletes_only_what_a_run_of_ours_wrote(tmp_path):
    """A user's own ``final/`` (no run fingerprint in it) is refused, not deleted; a user's files in ``checkpoints/``,
    another ``run.json`` and ``metrics_before.json`` beside it are kept; our step folders, final/ and run.json go."""
    from pml_suprank.training.run_folder import OutputDirError, claim_output_dir

    user = tmp_path / "user"
    (user / "final").mkdir(parents=True)
    (user / "final" / "model.bin").write_bytes(b"mine")
    (user / "checkpoints").mkdir()
    (user / "checkpoints" / "epoch3.pt").write_bytes(b"mine")
    with pytest.raises(OutputDirError, match=r"final' was not written by a run of this package .* not deleted"):
        claim_output_dir(user, overwrite=True, note=print)
    assert (user / "final" / "model.bin").read_bytes() == b"mine"
    assert (user / "checkpoints" / "epoch3.pt").read_bytes() == b"mine"

    ours = tmp_path / "ours"
    (ours / "checkpoints" / "step_00000002").mkdir(parents=True)
    (ours / "checkpoints" / "notes.txt").write_text("mine")
    (ours / "final").mkdir()
    (ours / "final" / "training_summary.json").write_text(json.dumps({"run_fingerprint": "ab" * 32}))
    (ours / "run.json").write_text(json.dumps({"fingerprint": "ab" * 32}))
    (ours / "metrics_before.json").write_text("{}")
    (ours / "data.csv").write_text("mine")
    notes = []
    claim_output_dir(ours, overwrite=True, note=notes.append)
    assert sorted(p.relative_to(ours).as_posix() for p in ours.rglob("*")) == [
        "checkpoints", "checkpoints/notes.txt", "data.csv"]  # fmt: skip
    assert "checkpoints/step_00000002" in notes[0] and "final" in notes[0]

    theirs = tmp_path / "theirs"  # a run.json that is not ours (no fingerprint) and a checkpoints/ of the user
    (theirs / "checkpoints").mkdir(parents=True)
    (theirs / "checkpoints" / "best.ckpt").write_bytes(b"mine")
    (theirs / "run.json").write_text('{"name": "my experiment"}')
    (theirs / "metrics_before.json").write_text("{}")
    claim_output_dir(theirs, overwrite=True, note=print)
    assert all((theirs / n).exists() for n in ("checkpoints/best.ckpt", "run.json", "metrics_before.json"))


def test_output_dir_inside_an_input_folder_is_refused(tmp_path):
    from pml_suprank.training.run_folder import OutputDirError, check_outside_inputs

    data = tmp_path / "images"
    (data / "cat").mkdir(parents=True)
    with pytest.raises(OutputDirError, match=r"--output_dir '.*images/run' lies inside the input folder --dataset"):
        check_outside_inputs(data / "run", {"--dataset": str(data)})
    with pytest.raises(OutputDirError, match="inside the input folder"):
        check_outside_inputs(data, {"--dataset": data})
    check_outside_inputs(tmp_path / "run", {"--dataset": str(data), "--other": "user/hub-id", "--none": None})


@pytest.mark.slow
def test_a_figure_that_fails_is_skipped_and_the_final_folder_keeps_the_weights(tmp_path, monkeypatch):
    """A figure that raises (here: the embedding map) used to end the final folder's write before
    ``model.safetensors``: the trained model was lost. A label name that looks like mathtext
    (``$\\undefinedmacro$``, which once crashed matplotlib) is drawn literally."""
    from pml_suprank import plots
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training.export import write_final_folder

    model = RetrievalModel("test_resnet", embedding_size=8, image_size=16)
    emb = torch.nn.functional.normalize(torch.randn(12, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    labels = torch.stack([torch.arange(12) % 3, torch.arange(12) % 3 // 2], 1)
    last = (emb, labels, torch.arange(12))
    history = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}]
    names = ["$\\undefinedmacro$", "group"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the mathtext-like name plots: no figure skipped
        final = write_final_folder(tmp_path / "ok", model, config={"seed": 0}, history=history, metrics={"ap": 0.5},
                                   embeddings=(last, last), label_names=names, replace=True)  # fmt: skip
    assert (final / "embedding_map.png").is_file() and (final / "training_curves.png").is_file()

    def broken(*args, **kwargs):
        raise ValueError("a figure that cannot be drawn")

    monkeypatch.setattr(plots, "plot_all", broken)
    with pytest.warns(RuntimeWarning, match="skipped"):
        final = write_final_folder(tmp_path / "final", model, config={"seed": 0}, history=history,
                                   metrics={"ap": 0.5}, embeddings=(last, last),
                                   label_names=names, replace=True)  # fmt: skip
    assert (final / "model.safetensors").is_file() and (final / "metrics.json").is_file()
    assert (final / "config.json").is_file() and (final / "README.md").is_file()


def test_final_folder_survives_a_failed_or_interrupted_replacement(tmp_path, monkeypatch):
    """The previous final/ is never lost: a failed second rename puts it back, and one set aside by a crash between
    the two renames is restored by the next run's lock (or removed when a final/ exists)."""
    from pml_suprank.training import export

    final = tmp_path / "final"
    final.mkdir()
    (final / "model.safetensors").write_text("previous")
    real, calls = os.replace, []

    def second_rename_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(export.os, "replace", second_rename_fails)
    with pytest.raises(OSError, match="disk full"):
        export._replace_folder(final, lambda staged: (staged.mkdir(parents=True), (staged / "x").write_text("new")))
    monkeypatch.setattr(export.os, "replace", real)
    assert (final / "model.safetensors").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # nothing staged or set aside is left
    # a crash between the two renames: final/ missing, the previous one set aside
    os.replace(final, tmp_path / ".old-final-4242")
    notes = []
    assert remove_stale_temporaries(tmp_path, notes.append) == []
    assert (final / "model.safetensors").read_text() == "previous" and "restored" in notes[0]
    (tmp_path / ".old-final-77").mkdir()  # set aside, but a final/ was written after it: the stale copy goes
    assert remove_stale_temporaries(tmp_path, notes.append) == [".old-final-77"]
    assert (final / "model.safetensors").read_text() == "previous"


def test_resume_latest_reads_the_chosen_checkpoint_once(tmp_path, monkeypatch):
    """``--resume latest`` checks the newest checkpoint's files once: the check that chose it is the one the
    restore uses (a checkpoint is read whole: weights, optimizer moments)."""
    from pml_suprank.training import checkpoint

    _trainer(tmp_path, max_train_steps=3, stop_after_steps=2).train()
    real, seen = checkpoint.validate_checkpoint, []
    monkeypatch.setattr(checkpoint, "validate_checkpoint", lambda p, *a, **k: seen.append(p) or real(p, *a, **k))
    resumed = _trainer(tmp_path, max_train_steps=3)
    resumed.train(resume_from="latest")
    assert resumed.finished and resumed.progress.global_step == 3
    assert [p.name for p in seen] == ["step_00000002"]
