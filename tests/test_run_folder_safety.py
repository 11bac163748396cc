"""Clear errors around the run folder (issue 20 item 6): a full disk or a read-only folder during a checkpoint names
the path and what was kept and leaves no partial folder; temporaries of dead runs are removed at the next start
(only in that run's folder, once its lock is held); the lock is an OS lock released when its holder dies."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys

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


def _trainer(output_dir, **cfg):
    from accelerate import Accelerator

    from pml_suprank import data, losses
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training import Trainer, TrainingConfig

    torch.manual_seed(0)
    model = RetrievalModel("test_resnet", embedding_size=16, image_size=16)
    tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    train = data.SyntheticShapes("train", num_per_class=4, image_size=16, transform=tf)
    values = dict(output_dir=str(output_dir), epochs=1, batch_size=32, samples_per_class=4, eval_every=0,
                  log_every=1, hierarchical_labels=True, seed=3, checkpoint_every=1, keep_checkpoints=0)  # fmt: skip
    values.update(cfg)
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=16)
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
