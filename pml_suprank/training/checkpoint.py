"""Checkpoints of the training loop: find, validate, write atomically, restore.

A checkpoint is the folder ``output_dir/checkpoints/step_XXXXXXXX`` written by ``accelerator.save_state`` (model,
optimizer, scheduler, RNG states per process) plus ``trainer_state.json`` (step, epoch, sampler position, history,
configuration, the run fingerprint and the resolved configuration it hashes). It is written into a temporary folder
renamed once complete, so an interrupted save never leaves a folder that looks complete.

Nothing here unpickles: weights are safetensors, the scheduler / sampler / counters are JSON (Accelerate loads the
optimizer and RNG files with ``weights_only=True``). A checkpoint continues a run only if it validates (types,
ranges, the sampler state where the counters say) and belongs to the same run (:func:`check_compatible`).
"""

from __future__ import annotations

import errno
import json
import math
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from .._safe_json import load_json
from .checkpoint_files import CheckpointError, check_optimizer_file, check_weights_files, read_rng_states

__all__ = [
    "CHECKPOINT_PREFIX",
    "CheckpointSaveError",
    "TRAINER_STATE",
    "CheckpointError",
    "RESUMABLE_CHANGES",
    "check_compatible",
    "config_differences",
    "find_checkpoints",
    "latest_checkpoint",
    "latest_valid_checkpoint",
    "save_checkpoint_atomically",
    "validate_checkpoint",
]

CHECKPOINT_PREFIX = "step_"
TRAINER_STATE = "trainer_state.json"


def find_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders ``output_dir/checkpoints/step_XXXXXXXX`` sorted by step (temporary folders of an
    interrupted save are ignored)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and p.name[len(CHECKPOINT_PREFIX) :].isdigit():
            found.append((int(p.name[len(CHECKPOINT_PREFIX) :]), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The most recent complete checkpoint of ``output_dir``, or ``None``."""
    ckpts = find_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def latest_valid_checkpoint(
    output_dir: str | Path,
    note: Callable[[str], None] = print,
    validate: Callable[[Path], Any] | None = None,
) -> Path | None:
    """The newest checkpoint of ``output_dir`` that validates (:func:`validate_checkpoint`, or ``validate``, which
    raises :class:`CheckpointError`). When newer ones are skipped (a missing, truncated or corrupt file, e.g. after a
    crash or a full disk), one line goes to ``note`` naming them, why, and the checkpoint chosen."""
    check = validate if validate is not None else validate_checkpoint
    skipped: list[str] = []
    chosen = None
    for ckpt in reversed(find_checkpoints(output_dir)):
        try:
            check(ckpt)
        except CheckpointError as e:
            reason = str(e).replace(f"checkpoint {str(ckpt)!r} ", "").replace(f"checkpoint {str(ckpt)!r}: ", "")
            skipped.append(f"{ckpt.name} ({reason[:300]})")
            continue
        chosen = ckpt
        break
    if skipped:
        target = f"resuming from {chosen.name}" if chosen is not None else "no checkpoint validates"
        note(f"--resume latest: skipping {'; '.join(skipped)}; {target}")
    return chosen


def validate_checkpoint(path: str | Path, num_processes: int | None = None) -> dict[str, Any]:
    """Check that ``path`` is a complete checkpoint written by :class:`Trainer` and return its trainer state: every
    file it needs is there and readable, pickled ones with ``weights_only=True`` and checked against a schema
    (``trainer_state.json`` with its scheduler and sampler state, ``model*.safetensors``, ``optimizer.bin``, one
    ``random_states_<i>.pkl`` per process; see :mod:`.checkpoint_files`). With ``num_processes``, a checkpoint of
    another number of processes is refused first.

    Raises:
        CheckpointError: naming the folder and what is missing or unreadable (corrupt JSON, truncated weights).
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a folder")
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {TRAINER_STATE} is missing")
    try:
        state = load_json(state_file, expected=dict, what="checkpoint state")
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt: {TRAINER_STATE} cannot be read ({type(e).__name__}: {str(e)[:300]})"
        ) from e
    required = ("global_step", "epoch", "step_in_epoch", "sampler", "num_processes")
    if any(k not in state for k in required):
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {TRAINER_STATE} lacks one of {required}")
    _check_state_values(path, state)
    if num_processes is not None:
        _check_world_size(path, state, num_processes)
    check_scheduler_state(path, state.get("scheduler"))
    check_weights_files(path)
    check_optimizer_file(path, state.get("optimizer_state"), state["global_step"])
    for index in range(state["num_processes"]):
        read_rng_states(path, index)
    return state


_STATE_TYPES = {"global_step": (int, 0), "epoch": (int, 0), "step_in_epoch": (int, 0), "num_processes": (int, 1)}

#: TrainingConfig fields that may change between a run and its resumption (they do not change the trained weights).
RESUMABLE_CHANGES = frozenset(
    {"output_dir", "stop_after_steps", "num_workers", "log_every", "keep_checkpoints", "checkpoint_every",
     "eval_every", "eval_batch_size", "k_values", "alpha", "pca_samples", "max_nonfinite_steps"}
)


def _check_state_values(path: Path, state: dict[str, Any]) -> None:
    where = f"checkpoint {str(path)!r} is corrupt: {TRAINER_STATE} "
    for key, (kind, low) in _STATE_TYPES.items():
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, kind) or value < low:
            raise CheckpointError(where + f"'{key}' must be an int >= {low}; got {value!r}")
    if not isinstance(state["sampler"], dict):  # {} where the sampler keeps no state (never null)
        raise CheckpointError(where + f"'sampler' must be a dict (the sampler state); got {state['sampler']!r}")
    for key, kind in (("history", list), ("config", dict), ("scheduler", dict), ("fingerprint", str),
                      ("run_config", dict), ("optimizer_state", list)):  # fmt: skip
        if key in state and state[key] is not None and not isinstance(state[key], kind):
            raise CheckpointError(where + f"'{key}' must be a {kind.__name__}; got {type(state[key]).__name__}")
    indices = state.get("optimizer_state")
    if indices is not None and (len(set(indices)) != len(indices) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices)):  # fmt: skip
        raise CheckpointError(where + "'optimizer_state' must list distinct parameter indices (ints >= 0)")
    _check_sampler_position(where, state)
    _check_counters(path, where, state)
    _check_skipped_steps(where, state)


def _check_counters(path: Path, where: str, state: dict[str, Any]) -> None:
    """The counters must agree: ``global_step = epoch · steps_per_epoch + step_in_epoch`` with ``step_in_epoch <
    steps_per_epoch``, and a ``step_<N>`` folder holds step ``N`` (otherwise later checkpoints would overwrite earlier
    steps)."""
    spe = state.get("steps_per_epoch")
    if spe is not None:
        if isinstance(spe, bool) or not isinstance(spe, int) or spe < 1:
            raise CheckpointError(where + f"'steps_per_epoch' must be an int >= 1; got {spe!r}")
        expected = state["epoch"] * spe + state["step_in_epoch"]
        if state["step_in_epoch"] >= spe or state["global_step"] != expected:
            raise CheckpointError(
                where + f"is inconsistent: 'global_step' is {state['global_step']} but epoch {state['epoch']} x "
                f"{spe} steps per epoch + step_in_epoch {state['step_in_epoch']} = {expected}"
            )
    digits = path.name[len(CHECKPOINT_PREFIX) :]
    if path.name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() and int(digits) != state["global_step"]:
        raise CheckpointError(
            where + f"is inconsistent: the folder {path.name} is step {int(digits)} but 'global_step' is "
            f"{state['global_step']}"
        )


def _check_skipped_steps(where: str, state: dict[str, Any]) -> None:
    """The non-finite step counters (:mod:`.nonfinite`): ints with ``0 <= consecutive <= skipped <= global_step``.
    A checkpoint written before they existed lacks both: its run applied every step, so they are 0."""
    skipped, consecutive = (state.get(k, 0) for k in ("skipped_nonfinite_steps", "consecutive_nonfinite_steps"))
    for key, value in (("skipped_nonfinite_steps", skipped), ("consecutive_nonfinite_steps", consecutive)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(where + f"'{key}' must be an int >= 0; got {value!r}")
    if not consecutive <= skipped <= state["global_step"]:
        raise CheckpointError(
            where + f"is inconsistent: 'consecutive_nonfinite_steps' {consecutive} <= 'skipped_nonfinite_steps' "
            f"{skipped} <= 'global_step' {state['global_step']} does not hold"
        )


def _check_sampler_position(where: str, state: dict[str, Any]) -> None:
    """The sampler state must sit where the counters say: its epoch is ``epoch``, its position ``step_in_epoch``."""
    sampler = state["sampler"]
    if not sampler:
        return
    for key, counter in (("epoch", "epoch"), ("position", "step_in_epoch")):
        value = sampler.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value != state[counter]:
            raise CheckpointError(
                where + f"is inconsistent: 'sampler.{key}' is {value!r} but '{counter}' is {state[counter]!r}"
            )


def check_compatible(
    path: Path,
    state: dict[str, Any],
    num_processes: int,
    steps_per_epoch: int,
    total_steps: int | None = None,
    config: dict[str, Any] | None = None,
    *,
    fingerprint: str | None = None,
    run_config: Mapping[str, Any] | None = None,
    ignore_config_change: bool = False,
) -> None:
    """Raise :class:`CheckpointError` if the checkpoint ``state`` cannot continue this run: other number of processes,
    other number of steps per epoch, a position beyond this run's end, or another run (other fingerprint; without
    one, a checkpoint of an older version: every ``TrainingConfig`` field outside :data:`RESUMABLE_CHANGES` must be
    equal). ``ignore_config_change=True`` lets another configuration through (the structural checks remain)."""
    if total_steps is not None and state["global_step"] > total_steps:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is at step {state['global_step']}, beyond this run's {total_steps} steps"
        )
    if state["step_in_epoch"] >= max(steps_per_epoch, 1):
        raise CheckpointError(
            f"checkpoint {str(path)!r} has step_in_epoch={state['step_in_epoch']} but an epoch has "
            f"{steps_per_epoch} steps"
        )
    if not ignore_config_change:
        _check_same_run(path, state, config, fingerprint, run_config)
    _check_world_size(path, state, num_processes)
    if state.get("steps_per_epoch", steps_per_epoch) != steps_per_epoch:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has {state['steps_per_epoch']} steps per epoch; this run has "
            f"{steps_per_epoch} (different data, batch size or sampler)"
        )


def _check_world_size(path: Path, state: dict[str, Any], num_processes: int) -> None:
    if state["num_processes"] != num_processes:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by {state['num_processes']} processes; this run has "
            f"{num_processes} (the sampler streams and RNG states are per process)"
        )


def _check_same_run(
    path: Path,
    state: dict[str, Any],
    config: dict[str, Any] | None,
    fingerprint: str | None,
    run_config: Mapping[str, Any] | None,
) -> None:
    listing = ""
    if fingerprint is not None and state.get("fingerprint") is not None:
        if state["fingerprint"] == fingerprint:
            return
        listing = config_differences(state.get("run_config") or {}, run_config or {}) or "settings not recorded"
    elif config is not None and isinstance(state.get("config"), dict):
        saved = state["config"]
        fixed = (k for k in config if k not in RESUMABLE_CHANGES and k in saved)
        listing = ", ".join(f"{k}: {saved[k]!r} -> {config[k]!r}" for k in sorted(fixed) if saved[k] != config[k])
    if listing:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by another run, with other hyper-parameters ({listing}); resume "
            "with the same settings, start a new run in another output_dir, or continue anyway with "
            "--resume_ignore_config true (Trainer.train(..., ignore_config_change=True))"
        )


def _flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section, values in config.items():
        if isinstance(values, Mapping):
            prefix = "" if section == "training" else f"{section}."
            out.update({f"{prefix}{k}": v for k, v in values.items()})
        else:
            out[section] = values
    return out


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """``"lr_head: 0.001 -> 0.005, model.backbone: 'a' -> 'b'"``: the settings that differ between two
    :func:`~pml_suprank.training.run_folder.run_config` dicts (``TrainingConfig`` fields unprefixed, the other
    sections as ``section.key``)."""
    a, b = _flatten(saved), _flatten(current)
    missing = object()
    changed = [(k, a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b))]
    changed = [(k, x, y) for k, x, y in changed if x != y]
    return ", ".join(
        f"{k}: {'(unset)' if x is missing else repr(x)} -> {'(unset)' if y is missing else repr(y)}"
        for k, x, y in changed
    )



_SCHEDULER_KEYS = frozenset({"base_lrs", "last_epoch", "_step_count", "_last_lr", "lr_lambdas", "verbose",
                             "_get_lr_called_within_step", "_is_initial"})


def scheduler_state(scheduler: Any) -> dict[str, Any]:
    """The JSON form of a ``LambdaLR`` state (stored in ``trainer_state.json``: a scheduler is never pickled).

    Accelerate would store a registered scheduler as ``custom_checkpoint_0.pkl`` and unpickle it without restriction
    on resume (arbitrary code); a ``LambdaLR`` built by :func:`build_scheduler` holds only numbers (its
    ``lr_lambdas`` entries are ``None`` for plain functions).
    """
    state = scheduler.state_dict()
    unknown = sorted(set(state) - _SCHEDULER_KEYS)
    if unknown or any(x is not None for x in state.get("lr_lambdas", [])):
        raise TypeError(f"only a LambdaLR of plain functions can be checkpointed as JSON; got keys {unknown}")
    return jsonable(state)


def load_scheduler_state(path: Path, scheduler: Any, state: Any) -> None:
    """Validate the JSON scheduler ``state`` of checkpoint ``path`` and load it into ``scheduler``.

    Raises:
        CheckpointError: the state is missing (a checkpoint of an older version, which pickled it), has unknown
            keys, or its values are not finite numbers matching the optimizer's parameter groups.
    """
    groups = len(scheduler.base_lrs)
    check_scheduler_state(path, state, groups)
    restored = dict(state)
    restored["lr_lambdas"] = [None] * groups
    scheduler.load_state_dict(restored)


def check_scheduler_state(path: Path, state: Any, groups: int | None = None) -> None:
    """Validate the JSON scheduler ``state`` of checkpoint ``path`` (``groups``: the optimizer's parameter groups, when
    known; otherwise the lists must only agree with each other).

    Raises:
        CheckpointError: the state is missing (a checkpoint of an older version, which pickled it), has unknown
            keys, or its values are not finite numbers matching the parameter groups.
    """
    where = f"checkpoint {str(path)!r}: {TRAINER_STATE} "
    if state is None:
        raise CheckpointError(
            where + "has no 'scheduler' entry (written by an older pml-suprank that pickled the scheduler into "
            "custom_checkpoint_0.pkl; pickles are never loaded): start a new run or resume with that version"
        )
    if not isinstance(state, dict) or set(state) - _SCHEDULER_KEYS:
        raise CheckpointError(where + f"'scheduler' must be a LambdaLR state with keys in {sorted(_SCHEDULER_KEYS)}")
    if groups is None:
        base = state.get("base_lrs")
        groups = len(base) if isinstance(base, list) and base else -1
    for key in ("base_lrs", "_last_lr"):
        values = state.get(key)
        if not (isinstance(values, list) and len(values) == groups and all(_finite(v) for v in values)):
            shown = values if not isinstance(values, list) or len(values) <= 8 else f"{len(values)} values"
            raise CheckpointError(where + f"'scheduler.{key}' must be {groups} finite numbers; got {shown!r}")
    for key in ("last_epoch", "_step_count"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise CheckpointError(where + f"'scheduler.{key}' must be an int >= -1; got {value!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def save_checkpoint_atomically(
    accelerator: Any,
    output_dir: Path,
    step: int,
    trainer_state: dict[str, Any],
    keep: int,
    fingerprint: str | None = None,
) -> Path:
    """Write ``output_dir/checkpoints/step_<step>`` (``save_state`` into a temporary folder, then one rename) and
    delete the oldest checkpoints of this run (those whose ``trainer_state.json`` has ``fingerprint``; all when it
    is ``None``) beyond ``keep`` (0 keeps all). A checkpoint of another run at the same step is renamed
    ``step_<step>-run-<its fingerprint>`` (kept, no longer a resume candidate). Every process must call it."""
    acc = accelerator
    root = Path(output_dir) / "checkpoints"
    name = f"{CHECKPOINT_PREFIX}{step:08d}"
    final, tmp = root / name, root / f".tmp-{name}"
    if acc.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    acc.wait_for_everyone()
    try:
        acc.save_state(str(tmp), safe_serialization=True)
        if acc.is_main_process:
            (tmp / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=1))
    except _WRITE_ERRORS as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointSaveError(_save_failure(root, name, tmp, e)) from e
    acc.wait_for_everyone()
    if acc.is_main_process:
        try:
            _put_in_place(root, name, fingerprint)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointSaveError(_save_failure(root, name, tmp, e)) from e
        if keep > 0:
            for old in _run_checkpoints(output_dir, fingerprint)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()
    return final


def _put_in_place(root: Path, name: str, fingerprint: str | None) -> None:
    """Rename the written ``root/.tmp-<name>`` to ``root/<name>``. A checkpoint already there is replaced, unless it
    belongs to another run (other fingerprint): that one is renamed ``<name>-run-<its fingerprint>`` and kept (one
    whose ``trainer_state.json`` cannot be read is replaced: it can never be resumed)."""
    final, tmp = root / name, root / f".tmp-{name}"
    if final.exists():
        owner = _owner(final)
        if fingerprint is not None and owner is not None and owner != fingerprint:  # another run's: kept aside
            final.rename(root / f"{name}-run-{owner[:12]}")
        else:
            shutil.rmtree(final)
    tmp.rename(final)


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a failed checkpoint write raises: ``OSError``; ``RuntimeError`` (a full disk surfaces from
    ``torch.save`` as "RuntimeError: ... unexpected pos"); safetensors' ``SafetensorError`` (its writer's I/O
    errors, e.g. "IoError(Os { code: 28, kind: StorageFull ... })")."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        try:  # an older safetensors: its error is exported from the Rust extension only
            from safetensors.safetensors_rust import SafetensorError
        except ImportError:  # no safetensors (the core install): nothing of it can fail
            return (OSError, RuntimeError)
    return (OSError, RuntimeError, SafetensorError)


_WRITE_ERRORS = _write_errors()


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (full disk, read-only or unwritable folder); the message names the folder,
    the cause and what was kept."""


def _save_failure(root: Path, name: str, tmp: Path, error: BaseException) -> str:
    """The message of a failed checkpoint save: path, cause (disk full / read-only when the error or the free space
    says so), and what was kept."""
    code = getattr(error, "errno", None)
    if code is None:  # safetensors reports the OS error in its message: "Os { code: 28, kind: StorageFull, ..."
        found = re.search(r"\bcode: (\d+)", str(error))
        code = int(found.group(1)) if found else None
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    if code in (errno.ENOSPC, errno.EDQUOT) or (free is not None and free < 64 * 2**20):
        cause = "the disk is full" + (f" ({free / 2**20:.1f} MiB free)" if free is not None else "")
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
        cause = "the folder is read-only or not writable"
    else:
        cause = "the write failed" + (f" ({free / 2**30:.1f} GiB free on that disk)" if free is not None else "")
    kept = [p.name for p in find_checkpoints(root.parent)]
    if kept:
        older = f" and {len(kept) - 3} older" if len(kept) > 3 else ""
        kept_text = (f"the previous checkpoints are kept unchanged ({', '.join(kept[-3:])}{older}; --resume latest "
                     f"continues from {kept[-1]})")  # fmt: skip
    else:
        kept_text = "no earlier checkpoint exists"
    detail = f"{type(error).__name__}: {error}".replace("\n", " ")[:300]
    return (
        f"cannot write checkpoint {name} into {str(tmp)!r}: {cause} ({detail}); the partial folder was removed and "
        f"{kept_text}; free space or choose another --output_dir"
    )


def _run_checkpoints(output_dir: Path, fingerprint: str | None) -> list[Path]:
    """The checkpoints of ``output_dir`` written by the run ``fingerprint`` (all of them when ``None``)."""
    if fingerprint is None:
        return find_checkpoints(output_dir)
    return [ckpt for ckpt in find_checkpoints(output_dir) if _owner(ckpt) == fingerprint]


def _owner(ckpt: Path) -> str | None:
    """The run fingerprint in ``ckpt/trainer_state.json`` (``None`` if unreadable or absent)."""
    try:
        state = load_json(ckpt / TRAINER_STATE, what="checkpoint state")
    except (OSError, ValueError):  # missing, unreadable, corrupt, too deep (a bad checkpoint must not stop a save)
        return None
    owner = state.get("fingerprint") if isinstance(state, dict) else None
    return owner if isinstance(owner, str) else None


def jsonable(x: Any) -> Any:
    """``x`` with tensors, numpy values and paths turned into JSON values (recursively)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, Tensor):
        return x.item() if x.numel() == 1 else x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    return x
