"""Run identity and ownership of an output folder: the fingerprint (SHA-256 of :func:`run_config`; a checkpoint
continues only its own run), ``run.json``, the lock (an OS file lock released when its process dies, plus the record
``run.lock`` naming the holder) and the claim (a previous run in the folder is refused, or deleted with
``--overwrite_output_dir``: only what a run of ours wrote).
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
from functools import partial
from pathlib import Path
from typing import Any

from .._safe_json import atomic_write, load_json
from .checkpoint import (
    CheckpointError,
    CheckpointSaveError,
    _refuse,
    find_checkpoints,
    jsonable,
    recorded_fingerprint,
)

__all__ = [
    "LOCK_FILE",
    "OS_LOCK_FILE",
    "RESUMABLE_CHANGES",
    "RUN_FILE",
    "RUN_FOLDER_ERRORS",
    "OutputDirError",
    "RunLock",
    "RunLockError",
    "check_compatible",
    "check_outside_inputs",
    "claim_output_dir",
    "config_differences",
    "leave_process_group",
    "on_main_process",
    "prepare_output_dir",
    "remove_stale_temporaries",
    "run_config",
    "run_fingerprint",
    "write_run_file",
]

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
OS_LOCK_FILE = ".run.lock.flock"  #: the file :class:`filelock.FileLock` locks (kept: deleting it would race)

#: TrainingConfig fields that may change between a run and its resumption (they do not change the trained weights).
RESUMABLE_CHANGES = frozenset(
    {
        "output_dir",
        "stop_after_steps",
        "num_workers",
        "log_every",
        "keep_checkpoints",
        "checkpoint_every",
        "eval_every",
        "eval_batch_size",
        "k_values",
        "alpha",
        "pca_samples",
        "max_nonfinite_steps",
    }
)


class OutputDirError(ValueError):
    """The output folder cannot take this run: it holds another run, is a file, or cannot be written."""


class RunLockError(RuntimeError):
    """Another live run holds the lock file of the output folder."""


#: the errors a command line reports as their message only (no traceback): the output folder or a checkpoint refused
RUN_FOLDER_ERRORS = (CheckpointError, CheckpointSaveError, OutputDirError, RunLockError)


# -- identity ------------------------------------------------------------------------------------------------------
def run_config(training: Mapping[str, Any], run_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"training": TrainingConfig.to_dict() without RESUMABLE_CHANGES, **run_options}``: what identifies a run
    (``run_options``: the resolved model / data / loss sections)."""
    extra = dict(run_options or {})
    if "training" in extra:
        raise ValueError("run_options must not have a 'training' key (the TrainingConfig fields go there)")
    return jsonable({"training": {k: v for k, v in training.items() if k not in RESUMABLE_CHANGES}, **extra})


def run_fingerprint(config: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a :func:`run_config` dict."""
    text = json.dumps(jsonable(dict(config)), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """``"lr_head: 0.001 -> 0.005, model.backbone: 'a' -> 'b'"``: the settings two :func:`run_config` differ in."""

    def flat(config: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for section, values in config.items():
            prefix = "" if section == "training" else f"{section}."
            out.update(
                {f"{prefix}{k}": v for k, v in values.items()} if isinstance(values, Mapping) else {section: values}
            )
        return out

    a, b, unset = flat(saved), flat(current), object()
    shown = [
        (k, a.get(k, unset), b.get(k, unset)) for k in sorted(set(a) | set(b)) if a.get(k, unset) != b.get(k, unset)
    ]
    return ", ".join(
        f"{k}: {'(unset)' if x is unset else repr(x)} -> {'(unset)' if y is unset else repr(y)}" for k, x, y in shown
    )


def check_compatible(
    path: Path,
    state: dict[str, Any],
    steps_per_epoch: int,
    total_steps: int,
    run_config: Mapping[str, Any],
    fingerprint: str,
    ignore_config_change: bool = False,
) -> None:
    """Raise :class:`CheckpointError` if the validated checkpoint ``state`` cannot continue this run: beyond its end,
    another run (another fingerprint, unless ``ignore_config_change``: the settings that differ are named), another
    number of steps per epoch."""
    refuse = partial(_refuse, path)
    if state["global_step"] > total_steps:
        raise refuse(f"is at step {state['global_step']}, beyond this run's {total_steps} steps")
    if not ignore_config_change and state["fingerprint"] != fingerprint:
        differ = config_differences(state["run_config"], run_config) or "settings not recorded"
        raise refuse(
            f"was written by another run, with other hyper-parameters ({differ}); resume with the same settings, "
            "start a new run in another output_dir, or continue anyway with --resume_ignore_config true "
            "(Trainer.train(..., ignore_config_change=True))",
        )
    if state["steps_per_epoch"] != steps_per_epoch:
        raise refuse(
            f"has {state['steps_per_epoch']} steps per epoch; this run has {steps_per_epoch} (different data, batch "
            "size or sampler)",
        )


def write_json_atomically(path: Path, data: Any, indent: int = 1) -> Path:
    """``data`` as JSON in ``path`` (tensors, NumPy values and paths as JSON values, other objects as text), written
    atomically: a reader never sees half a file."""
    text = json.dumps(jsonable(data), indent=indent, default=str)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return path


def write_run_file(output_dir: Path, config: Mapping[str, Any], fingerprint: str, **extra: Any) -> Path:
    """Write ``output_dir/run.json`` atomically: fingerprint, seed, the resolved configuration, pid, host, time."""
    path = Path(output_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "fingerprint": fingerprint,
        "seed": dict(config.get("training") or {}).get("seed"),
        "config": dict(config),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }
    return write_json_atomically(path, record)


# -- the folder ----------------------------------------------------------------------------------------------------
def prepare_output_dir(output_dir: str | Path) -> Path:
    """Create ``output_dir`` (with its parents) and check that files can be written into it.

    Raises:
        OutputDirError: it is a file, or cannot be created or written (naming the folder and the cause).
    """
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise OutputDirError(
            f"--output_dir {str(path)!r} is a file, not a folder: choose a folder path (it is created if missing)"
        )
    probe = path / f".write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        reason = (
            "a part of the path is a file"
            if isinstance(e, (FileExistsError, NotADirectoryError))
            else (e.strerror or type(e).__name__)
        )
        raise OutputDirError(
            f"--output_dir {str(path)!r} cannot be {'written' if path.is_dir() else 'created'} "
            f"({reason}): choose a folder you can write to"
        ) from None
    return path


def check_outside_inputs(output_dir: str | Path, inputs: Mapping[str, Any]) -> None:
    """Raise :class:`OutputDirError` if ``output_dir`` lies inside one of the local input folders ``{"--flag":
    path}`` (its files would be read back as data)."""
    from ..data.paths import is_inside

    for flag, value in inputs.items():
        if isinstance(value, (str, Path)) and Path(value).is_dir() and is_inside(value, output_dir):
            raise OutputDirError(
                f"--output_dir {str(output_dir)!r} lies inside the input folder {flag} {str(value)!r}: the run's "
                "files would be read back as data (and the folder is yours); choose an --output_dir outside it"
            )


def claim_output_dir(
    output_dir: Path,
    overwrite: bool,
    note: Callable[[str], None] = print,
    *,
    resumed: str | Path | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> None:
    """Check that a new run may start in ``output_dir`` (main process, lock held); with ``overwrite``, first delete
    what a previous run of ours left: ``checkpoints/step_*``, a ``final/`` whose ``training_summary.json`` names a
    run, ``run.json`` (and ``metrics_before.json``) holding a fingerprint; never through a symbolic link.
    ``resumed``: the ``--resume`` value that found nothing to continue; ``run_config``: this run's, to name the
    settings another run in the folder differs in.

    Raises:
        OutputDirError: the folder holds a previous run and not ``overwrite``, or ``overwrite`` meets a ``final/``
            that is not ours or a symbolic link (nothing is deleted).
    """
    out = Path(output_dir)
    final, run_file = out / "final", out / RUN_FILE
    found = [f"checkpoints/{p.name}" for p in find_checkpoints(out)] + (["final/"] if final.exists() else [])
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    if resumed is not None:
        if found and not overwrite:
            raise OutputDirError(_nothing_to_resume(out, shown, resumed, run_config, found))
        what = "nothing there can continue this run" if found else "no checkpoint there"
        note(f"--resume {resumed}: {what} ({out / 'checkpoints'}); starting from scratch")
    if not found:
        return
    if not overwrite:
        raise OutputDirError(
            f"output_dir {str(out)!r} already holds a previous run ({shown}); continue it with --resume latest "
            "(Trainer.train(resume_from='latest')), choose another --output_dir, or pass --overwrite_output_dir true "
            "(overwrite_output_dir=True) to delete the previous run first"
        )
    if (
        final.exists()
        and not final.is_symlink()
        and recorded_fingerprint(final / "training_summary.json", "run_fingerprint") is None
    ):
        raise OutputDirError(
            f"--overwrite_output_dir: {str(final)!r} was not written by a run of this package (no "
            "training_summary.json naming a run fingerprint), so it is not deleted; move it away or "
            "choose another --output_dir"
        )
    ours = run_file.is_file() and recorded_fingerprint(run_file) is not None
    own_files = [run_file, out / "metrics_before.json"] if ours else []
    named = [final, out / "checkpoints", run_file, *own_files]
    targets = [*find_checkpoints(out), final, *own_files]
    if links := [p for p in named + targets if p.is_symlink()]:
        shown = ", ".join(f"{p.relative_to(out)} -> {os.readlink(p)}" for p in dict.fromkeys(links))
        raise OutputDirError(
            f"--overwrite_output_dir: {str(out)!r} holds symbolic links ({shown}); the previous run "
            "is not deleted through a link: remove the link yourself, or choose another "
            "--output_dir"
        )
    removed = []
    for target in (t for t in targets if t.exists()):
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
        removed.append(str(target.relative_to(out)))
    if (out / "checkpoints").is_dir() and not any((out / "checkpoints").iterdir()):
        (out / "checkpoints").rmdir()
    note(f"--overwrite_output_dir: deleted the previous run in {out} ({', '.join(removed)})")


def _nothing_to_resume(out: Path, shown: str, resumed: Any, config: Mapping[str, Any] | None, found: list) -> str:
    """The refusal of ``--resume latest`` where nothing continues this run (another run's folder, or unusable
    checkpoints)."""
    try:
        previous = load_json(out / RUN_FILE, expected=dict)
    except (OSError, ValueError):
        previous = {}
    theirs, ours = previous.get("fingerprint"), run_fingerprint(config) if config is not None else None
    if isinstance(theirs, str) and ours is not None and theirs != ours:
        saved = previous.get("config") if isinstance(previous.get("config"), dict) else {}
        differ = config_differences(saved, config or {}) or "settings not recorded"
        return (
            f"--resume {resumed}: output_dir {str(out)!r} holds another run (its run.json: fingerprint {theirs[:12]}, "
            f"this run {ours[:12]}; settings that differ: {differ[:600]}) and nothing there can continue this run "
            f"({shown}): choose another --output_dir for this run, resume that run with its own settings, or pass "
            "--overwrite_output_dir true to delete it and start anew"
        )
    why = "; why is said above" if any(f.startswith("checkpoints/") for f in found) else ""
    return (
        f"--resume {resumed}: nothing in {str(out)!r} can continue this run ({shown}{why}): pass "
        "--overwrite_output_dir true to delete it and start anew, or choose another --output_dir"
    )


def remove_stale_temporaries(output_dir: Path, note: Callable[[str], None] = print) -> list[str]:
    """Delete (lock held) what interrupted runs left in ``output_dir``: ``checkpoints/.tmp-step_*``,
    ``.tmp-final-*``, ``.run.json.*.tmp``, ``.run.lock.*``, and a previous ``final/`` set aside while a new one was
    renamed into place (``.old-final-*``: put back as ``final`` when the crash left none). Returns the names removed
    (one note lists them)."""
    out = Path(output_dir)
    for old in sorted(out.glob(".old-final-*")):
        if not (out / "final").exists():
            os.replace(old, out / "final")
            note(f"restored {out / 'final'} from {old.name}, set aside by an interrupted run")
    found = [*(out / "checkpoints").glob(".tmp-step_*"), *out.glob(".tmp-final-*"), *out.glob(f".{RUN_FILE}.*.tmp")]
    found += out.glob(".old-final-*")
    found += [p for p in out.glob(f".{LOCK_FILE}.*") if p.name != OS_LOCK_FILE]
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    removed = sorted(str(p.relative_to(out)) for p in found)
    if removed:
        note(f"removed what an interrupted run left in {out}: {', '.join(removed)}")
    return removed


# -- the lock ------------------------------------------------------------------------------------------------------
def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/<pid>/stat`` field 22), or ``None`` where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _stale(holder: dict[str, Any]) -> bool:
    """A record of this host whose process is gone, or whose pid now belongs to a process started later."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        pass
    saved, now = holder.get("start"), _process_start(pid)
    return saved is not None and now is not None and saved != now


class RunLock:
    """The lock of one run's output folder (take it on the main process only).

    The OS lock (:class:`filelock.FileLock` on ``.run.lock.flock``) picks one holder, which writes the record
    ``run.lock`` (pid, host, process start time) naming it to a refused run. A record found by the new holder is
    taken over (with a note) when its process is gone or its pid was reused, else refused (a live run of this host
    without the OS lock, or one of another host). Taking the lock removes the folder's stale temporaries.
    """

    def __init__(self, output_dir: str | Path, note: Callable[[str], None] = print) -> None:
        self.path = Path(output_dir) / LOCK_FILE
        self.note = note
        self.token = uuid.uuid4().hex
        self._os_lock: Any = None

    def acquire(self) -> RunLock:
        """Take the lock.

        Raises:
            RunLockError: another live run (or one on another host) holds it; the message names its pid and host.
        """
        from filelock import FileLock, Timeout

        prepare_output_dir(self.path.parent)
        os_lock = FileLock(str(self.path.with_name(OS_LOCK_FILE)), timeout=0, thread_local=False)
        try:
            os_lock.acquire()
        except Timeout:
            raise self._refusal(self._holder() or {}) from None
        try:
            holder = self._holder()
            if holder is not None and not _stale(holder):
                raise self._refusal(holder)
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "token": self.token,
                "start": _process_start(os.getpid()),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            write_json_atomically(self.path, record)
        except BaseException:
            os_lock.release()
            raise
        if holder is not None:
            self.note(
                f"taking over the stale lock {self.path} of pid {holder.get('pid')} on {holder.get('host')} "
                "(no such process)"
            )
        self._os_lock = os_lock
        remove_stale_temporaries(self.path.parent, self.note)
        return self

    def _refusal(self, holder: dict[str, Any]) -> RunLockError:
        return RunLockError(
            f"another run holds the lock file {str(self.path)!r} (pid {holder.get('pid')!r} on host "
            f"{holder.get('host')!r}): wait for it to finish or use another --output_dir / output_dir; delete the "
            "file only if that run is gone"
        )

    def _holder(self) -> dict[str, Any] | None:
        """The record in ``run.lock`` (``{}`` when unreadable), or ``None`` without one."""
        try:
            holder = load_json(self.path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def release(self) -> None:
        """Remove the record if this lock holds it and release the OS lock (idempotent)."""
        if self._os_lock is None:
            return
        try:
            if (self._holder() or {}).get("token") == self.token:
                self.path.unlink(missing_ok=True)
        finally:
            self._os_lock.release()
            self._os_lock = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


# -- several processes ---------------------------------------------------------------------------------------------
def on_main_process(accelerator: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` on the main process (``None`` elsewhere); an exception it raises is raised on every process."""
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


def leave_process_group(status: int = 2, timeout_s: float = 60.0) -> None:
    """End a multi-process run that every process refuses alike with ``status``: wait for the peers (at most
    ``timeout_s``), destroy the process group, then ``os._exit`` after flushing (a SIGTERM during the wait also exits
    with ``status``). Without an initialised process group it does nothing."""
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
