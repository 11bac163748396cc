"""Run identity and ownership of an output folder: the run fingerprint, ``run.json`` and the lock file.

* **Fingerprint** — a SHA-256 of the resolved configuration of a run: every :class:`TrainingConfig` field except
  those that may change on resume (:data:`~pml_suprank.training.checkpoint.RESUMABLE_CHANGES`; the seed is a
  ``TrainingConfig`` field, so it is included) plus the model / data / loss options the caller resolved
  (``run_options``). Two runs with the same fingerprint train the same weights.
* **run.json** — ``output_dir/run.json``, written atomically when a run starts: fingerprint, seed, the resolved
  configuration (to list what differs), pid, host and time. Checkpoints carry the same fingerprint.
* **Lock** — an OS file lock (:class:`filelock.FileLock` on ``output_dir/.run.lock.flock``: released by the operating
  system when its process dies, even by SIGKILL) plus ``output_dir/run.lock``, which holds the pid and host of the run
  that owns the folder (named when a second run is refused). A record left by a dead process of this host (or by a
  process whose pid was reused since) is taken over with a note; one of another host cannot be checked and is refused.
* **Stale temporaries** — once the lock is held, what interrupted runs of *this* folder left behind (a partial
  ``checkpoints/.tmp-step_*`` or ``.tmp-final-<pid>`` folder, a ``.run.json.<pid>.tmp`` file) is removed, with a note.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._safe_json import load_json
from .checkpoint import (
    RESUMABLE_CHANGES,
    CheckpointError,
    CheckpointSaveError,
    config_differences,
    find_checkpoints,
    jsonable,
)

__all__ = [
    "LOCK_FILE",
    "RUN_FILE",
    "RUN_FOLDER_ERRORS",
    "OutputDirError",
    "RunLock",
    "RunLockError",
    "check_outside_inputs",
    "claim_output_dir",
    "leave_process_group",
    "config_differences",
    "OS_LOCK_FILE",
    "on_main_process",
    "prepare_output_dir",
    "previous_run_artifacts",
    "refusal_message",
    "remove_previous_run",
    "remove_stale_temporaries",
    "run_config",
    "run_fingerprint",
    "write_json_atomically",
    "write_run_file",
]

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
OS_LOCK_FILE = ".run.lock.flock"  #: the file :class:`filelock.FileLock` locks (kept: deleting it would race)


class OutputDirError(ValueError):
    """The output folder cannot take this run: it holds another run (its checkpoints or its ``final/`` folder), is a
    file, or cannot be written."""


class RunLockError(RuntimeError):
    """Another live run holds the lock file of the output folder."""


#: the errors a command line reports as their message only (no traceback): the output folder or a checkpoint refused
RUN_FOLDER_ERRORS = (CheckpointError, CheckpointSaveError, OutputDirError, RunLockError)


def refusal_message(error: BaseException, resume: Any = None) -> str:
    """The line a command line prints for one of :data:`RUN_FOLDER_ERRORS`: its message, led by the flag to change
    (``--resume <value>: ...`` for a checkpoint refused while resuming) where it does not name one first."""
    text = str(error)
    if isinstance(error, CheckpointError) and resume is not None and not text.startswith("--"):
        text = f"--resume {resume}: {text}"
    return text


def run_config(training: Mapping[str, Any], run_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resolved configuration that identifies a run: ``{"training": {...}, **run_options}``.

    Args:
        training: ``TrainingConfig.to_dict()``; the fields of ``RESUMABLE_CHANGES`` are left out.
        run_options: The model / data / loss options the caller resolved, e.g. ``{"model": {...}, "data": {...},
            "loss": {...}}`` (JSON-able values); key ``"training"`` is reserved.
    """
    extra = dict(run_options or {})
    if "training" in extra:
        raise ValueError("run_options must not have a 'training' key (the TrainingConfig fields go there)")
    kept = {k: v for k, v in training.items() if k not in RESUMABLE_CHANGES}
    return jsonable({"training": kept, **extra})


def run_fingerprint(config: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a :func:`run_config` dict."""
    text = json.dumps(jsonable(dict(config)), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(jsonable(data), indent=1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_run_file(output_dir: Path, config: Mapping[str, Any], fingerprint: str, **extra: Any) -> Path:
    """Write ``output_dir/run.json`` atomically: fingerprint, seed, the resolved configuration, pid, host, time."""
    path = Path(output_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = dict(config.get("training") or {}).get("seed")
    data = {"fingerprint": fingerprint, "seed": seed, "config": dict(config), "pid": os.getpid(),
            "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}  # fmt: skip
    write_json_atomically(path, data)
    return path


def _ours(path: Path, key: str) -> bool:
    """Whether the JSON file ``path`` is a dict with a string ``key``: the mark a run of ours leaves (``run.json``:
    ``fingerprint``; ``final/training_summary.json``: ``run_fingerprint``)."""
    try:
        data = load_json(path, expected=dict)
    except (OSError, ValueError):
        return False
    return isinstance(data.get(key), str)


def _final_is_ours(output_dir: Path) -> bool:
    """Whether ``output_dir/final`` was written by a run of ours (its ``training_summary.json`` names the run
    fingerprint)."""
    return _ours(Path(output_dir) / "final" / "training_summary.json", "run_fingerprint")


def previous_run_artifacts(output_dir: Path) -> list[str]:
    """What a previous run left in ``output_dir`` that a new run would mix with: its checkpoints (any ``step_*``
    folder, valid or not) and its ``final/`` folder (also one no run of ours wrote: a new run would replace it)."""
    output_dir = Path(output_dir)
    found = [f"checkpoints/{p.name}" for p in find_checkpoints(output_dir)]
    if (output_dir / "final").exists():
        found.append("final/")
    return found


def prepare_output_dir(output_dir: str | Path) -> Path:
    """Create ``output_dir`` (with its parents) and check that files can be written into it.

    Raises:
        OutputDirError: it is a file, or cannot be created or written (read-only disk or folder, no permission); the
            message names the folder, the cause and the flag to change (``--output_dir``).
    """
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"--output_dir {str(path)!r} is a file, not a folder: choose a folder path (it is "
                             "created if missing)")  # fmt: skip
    probe = path / f".write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        doing = "written" if path.is_dir() else "created"
        reason = e.strerror or type(e).__name__
        if isinstance(e, (FileExistsError, NotADirectoryError)):
            reason = "a part of the path is a file"
        raise OutputDirError(f"--output_dir {str(path)!r} cannot be {doing} ({reason}): choose a folder you can "
                             "write to") from None  # fmt: skip
    return path


def check_outside_inputs(output_dir: str | Path, inputs: Mapping[str, Any]) -> None:
    """Refuse an output folder that lies inside (or is) one of the input folders a run reads: its checkpoints,
    plots and ``final/`` would be read back as data on the next pass (images of an image folder), and the dataset's
    folder is the user's. ``inputs`` maps the flag to its value (``{"--dataset": "my_images"}``); values that are
    not local folders (a Hub id, a built-in name, ``None``) are skipped.

    Raises:
        OutputDirError: naming ``--output_dir`` and the input flag.
    """
    from ..data.paths import is_inside

    for flag, value in inputs.items():
        if not isinstance(value, (str, Path)) or not Path(value).is_dir():
            continue
        if is_inside(value, output_dir):
            raise OutputDirError(
                f"--output_dir {str(output_dir)!r} lies inside the input folder {flag} {str(value)!r}: the run's "
                "files would be read back as data (and the folder is yours); choose an --output_dir outside it"
            )


def remove_previous_run(output_dir: Path) -> list[str]:
    """Delete what a previous run of ours left in ``output_dir`` and nothing else: the ``checkpoints/step_*`` folders
    (``checkpoints/`` itself only when that leaves it empty), ``final/`` when its ``training_summary.json`` names a
    run fingerprint, ``run.json`` when it holds one, and ``metrics_before.json`` beside such a ``run.json``. Returns
    the names deleted.

    Raises:
        OutputDirError: ``final/`` is not one of ours (a user's folder, which this run would replace), or one of the
            paths is a symbolic link; nothing is deleted then (a link is neither followed nor removed).
    """
    output_dir = Path(output_dir)
    final = output_dir / "final"
    if final.exists() and not final.is_symlink() and not _final_is_ours(output_dir):
        raise OutputDirError(
            f"--overwrite_output_dir: {str(final)!r} was not written by a run of this package (no "
            "training_summary.json naming a run fingerprint), so it is not deleted; move it away or choose another "
            "--output_dir"
        )
    ckpts = output_dir / "checkpoints"
    targets = [p for p in find_checkpoints(output_dir)] if ckpts.is_dir() and not ckpts.is_symlink() else []
    run_file = output_dir / RUN_FILE
    ours = run_file.is_file() and _ours(run_file, "fingerprint")
    named = [final, ckpts, run_file] + ([output_dir / "metrics_before.json"] if ours else [])
    links = [p for p in named + targets if p.is_symlink()]
    if links:
        shown = ", ".join(f"{p.relative_to(output_dir)} -> {os.readlink(p)}" for p in links)
        raise OutputDirError(
            f"--overwrite_output_dir: {str(output_dir)!r} holds symbolic links ({shown}); the previous run is "
            "not deleted through a link: remove the link yourself, or choose another --output_dir"
        )
    if final.exists():
        targets.append(final)
    if ours:
        targets += [run_file] + [p for p in named[3:] if p.is_file()]
    removed = []
    for target in targets:
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
        removed.append(str(target.relative_to(output_dir)))
    if ckpts.is_dir() and not ckpts.is_symlink() and not any(ckpts.iterdir()):
        ckpts.rmdir()
    return removed


def remove_stale_temporaries(output_dir: Path, note: Callable[[str], None] = print) -> list[str]:
    """Delete what interrupted runs left in ``output_dir`` (call it holding the folder's lock, so that no live run
    of this folder is writing them): ``checkpoints/.tmp-step_*`` and ``.tmp-final-*`` folders, ``.run.json.*.tmp``
    and ``.run.lock.*`` aside files. Only this folder is looked at. Returns the names removed (one note lists them)."""
    output_dir = Path(output_dir)
    found = [p for p in (output_dir / "checkpoints").glob(".tmp-*") if p.name.startswith(".tmp-step_")]
    found += list(output_dir.glob(".tmp-final-*"))
    found += [p for p in output_dir.glob(f".{RUN_FILE}.*.tmp")]
    found += [p for p in output_dir.glob(f".{LOCK_FILE}.*") if p.name != OS_LOCK_FILE]
    removed = []
    for path in sorted(found):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path.relative_to(output_dir)))
    if removed:
        note(f"removed what an interrupted run left in {output_dir}: {', '.join(removed)}")
    return removed


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux ``/proc/<pid>/stat`` field 22), or ``None`` where unknown: a pid
    reused by another process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class RunLock:
    """The lock of one run's output folder (take it on one process only: the main one).

    Two parts: an OS lock (:class:`filelock.FileLock` on ``output_dir/.run.lock.flock``; the operating system releases
    it when the holder dies, however it dies) and the record ``output_dir/run.lock`` naming the holder (pid, host,
    process start time), created complete and atomically (written aside, then hard-linked into place). With the OS
    lock held, a record of a dead process of this host, or of a pid since reused by another process, is stale and
    taken over with a note; a record of a live process of this host (a run of an older version, which took no OS lock)
    or of another host (which cannot be checked) is refused. Taking the lock also removes the temporaries interrupted
    runs of this folder left behind (:func:`remove_stale_temporaries`).

    Args:
        output_dir: The run's output folder (created if needed).
        note: Where the take-over and clean-up notes go (default ``print``).
    """

    def __init__(self, output_dir: str | Path, note: Callable[[str], None] = print) -> None:
        self.path = Path(output_dir) / LOCK_FILE
        self.note = note
        self.token = uuid.uuid4().hex
        self.held = False
        self._os_lock: Any = None

    def acquire(self) -> RunLock:
        """Take the lock.

        Raises:
            RunLockError: a live process (or one on another host, which cannot be checked) holds it; the message
                names the lock file and the holder's pid and host.
        """
        from filelock import FileLock, Timeout

        prepare_output_dir(self.path.parent)
        os_lock = FileLock(str(self.path.with_name(OS_LOCK_FILE)), timeout=0, thread_local=False)
        try:
            os_lock.acquire()
        except Timeout:
            holder = self._holder() or {}
            raise self._refusal(holder.get("pid"), holder.get("host")) from None
        try:
            self._take_record()
        except BaseException:
            os_lock.release()
            raise
        self._os_lock, self.held = os_lock, True
        remove_stale_temporaries(self.path.parent, self.note)
        return self

    def _refusal(self, pid: Any, host: Any) -> RunLockError:
        return RunLockError(
            f"another run holds the lock file {str(self.path)!r} (pid {pid!r} on host {host!r}): wait for it to "
            "finish or use another --output_dir / output_dir; delete the file only if that run is gone"
        )

    def _take_record(self) -> None:
        host = socket.gethostname()
        record = {"pid": os.getpid(), "host": host, "token": self.token, "start": _process_start(os.getpid()),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        tmp = self.path.with_name(f".{LOCK_FILE}.{self.token}")
        tmp.write_text(json.dumps(record))
        try:
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                    return
                except FileExistsError:
                    holder = self._holder()
                if holder is None:
                    continue  # released between the two calls: try again
                pid, holder_host = holder.get("pid"), holder.get("host")
                if not self._stale(holder, host):
                    raise self._refusal(pid, holder_host)
                if self._remove_stale(holder):
                    self.note(f"taking over the stale lock {self.path} of pid {pid} on {host} (no such process)")
            raise RunLockError(f"cannot take the lock file {str(self.path)!r}: it keeps changing")
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _stale(holder: dict[str, Any], host: str) -> bool:
        """A record of this host whose process is gone, or whose pid now belongs to a process started later."""
        pid = holder.get("pid")
        if holder.get("host") != host or isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            return False
        if not _pid_alive(pid):
            return True
        saved, now = holder.get("start"), _process_start(pid)
        return saved is not None and now is not None and saved != now

    def _remove_stale(self, stale: dict[str, Any]) -> bool:
        """Move the lock file aside; if it is no longer the ``stale`` record (another run took the lock over in the
        meantime), put it back. Returns whether the stale lock was removed."""
        aside = self.path.with_name(f".{LOCK_FILE}.stale-{self.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            moved = load_json(aside)
        except (OSError, ValueError):
            moved = None
        if moved == stale:
            aside.unlink(missing_ok=True)
            return True
        try:  # a fresh lock of another run: restore it (the next attempt reports its holder)
            os.link(aside, self.path)
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)
        return False

    def _holder(self) -> dict[str, Any] | None:
        try:
            holder = load_json(self.path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            holder = {}
        return holder if isinstance(holder, dict) else {}

    def release(self) -> None:
        """Remove the record if this lock holds it and release the OS lock (idempotent)."""
        if not self.held:
            return
        self.held = False
        try:
            holder = self._holder()
            if holder is not None and holder.get("token") == self.token:
                self.path.unlink(missing_ok=True)
        finally:
            if self._os_lock is not None:
                self._os_lock.release()
                self._os_lock = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def claim_output_dir(
    output_dir: Path,
    overwrite: bool,
    note: Callable[[str], None] = print,
    *,
    resumed: str | Path | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> None:
    """Check that a new run may start in ``output_dir`` (call it on the main process, holding the lock).

    Args:
        output_dir: The run's output folder.
        overwrite: Delete what a previous run of ours left first (:func:`remove_previous_run`: only what it wrote).
        note: Where the note about the deletion goes.
        resumed: The ``--resume`` value that found no checkpoint to continue (``"latest"``), if any: the run starts
            from scratch only in a folder without a previous run (or with ``overwrite``), said in one note.
        run_config: This run's :func:`run_config`, to name the settings of another run found in the folder.

    Raises:
        OutputDirError: the folder holds checkpoints or a ``final/`` folder of a previous run and ``overwrite`` is
            false; the message names the folder, what is there (another run, and the settings that differ, when
            ``resumed``), and the ways out.
    """
    found = previous_run_artifacts(output_dir)
    if resumed is not None:
        if found and not overwrite:
            raise OutputDirError(_nothing_to_resume(Path(output_dir), found, resumed, run_config))
        what = "nothing there can continue this run" if found else "no checkpoint there"
        note(f"--resume {resumed}: {what} ({Path(output_dir) / 'checkpoints'}); starting from scratch")
    if not found:
        return
    if not overwrite:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise OutputDirError(
            f"output_dir {str(output_dir)!r} already holds a previous run ({shown}); continue it with --resume "
            "latest (Trainer.train(resume_from='latest')), choose another --output_dir, or pass "
            "--overwrite_output_dir true (overwrite_output_dir=True) to delete the previous run first"
        )
    removed = remove_previous_run(output_dir)
    note(f"--overwrite_output_dir: deleted the previous run in {output_dir} ({', '.join(removed)})")


def leave_process_group(status: int = 2, timeout_s: float = 60.0) -> None:
    """End a multi-process run that every process refuses alike (its one error line printed) with ``status`` on every
    process: wait for the other processes, destroy the process group, then leave at once (``os._exit`` after
    flushing the output). A process never exits while a peer still holds a connection to it (a gloo process torn down
    at interpreter exit after its peer closed the connection can abort with SIGABRT), and no process is caught in the
    interpreter's slow teardown when ``torchrun`` sends SIGTERM to the remaining workers as soon as the first one
    exits (it would die of the signal instead of reporting ``status``; a SIGTERM during the wait ends the process with
    ``status`` too). Returns (doing nothing) without an initialised process group: the caller then exits as usual.
    The wait gives up after ``timeout_s``."""
    import datetime
    import signal
    import sys
    import threading

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return

    def leave(*_: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, leave)
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
        else:
            dist.barrier()
    except Exception:  # noqa: S110 - a peer already gone: the group is destroyed all the same
        pass
    finally:
        dist.destroy_process_group()
    leave()


def on_main_process(accelerator: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on the main process only; an exception it raises is raised on every process (so that no process
    waits forever at the next barrier). Returns ``fn()`` on the main process, ``None`` elsewhere."""
    result, error = None, None
    if accelerator.is_main_process:
        try:
            result = fn()
        except Exception as e:  # re-raised below on every process
            error = e
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error], from_process=0)[0]
    if error is not None:
        raise error
    return result


def _nothing_to_resume(output_dir: Path, found: list[str], resumed: Any, config: Mapping[str, Any] | None) -> str:
    """The refusal of ``--resume latest`` in a folder whose previous run has nothing this run can continue: another
    run's (named by ``run.json``, with the settings that differ) or this run's unusable checkpoints."""
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    try:
        previous = load_json(output_dir / RUN_FILE, expected=dict)
    except (OSError, ValueError):
        previous = {}
    theirs = previous.get("fingerprint")
    ours = run_fingerprint(config) if config is not None else None
    if isinstance(theirs, str) and ours is not None and theirs != ours:
        saved = previous.get("config") if isinstance(previous.get("config"), dict) else {}
        differ = config_differences(saved, config or {}) or "settings not recorded"
        return (
            f"--resume {resumed}: output_dir {str(output_dir)!r} holds another run (its run.json: fingerprint "
            f"{theirs[:12]}, this run {ours[:12]}; settings that differ: {differ[:600]}) and nothing there can "
            f"continue this run ({shown}): choose another --output_dir for this run, resume that run with its own "
            "settings, or pass --overwrite_output_dir true to delete it and start anew"
        )
    why = "; why is said above" if any(f.startswith("checkpoints/") for f in found) else ""
    return (
        f"--resume {resumed}: nothing in {str(output_dir)!r} can continue this run ({shown}{why}): pass "
        "--overwrite_output_dir true to delete it and start anew, or choose another --output_dir"
    )
