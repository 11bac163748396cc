"""Checkpoints ``output_dir/checkpoints/step_XXXXXXXX``: ``accelerator.save_state`` files plus ``trainer_state.json``
(counters, sampler position, the scheduler as JSON, history, the run fingerprint), written aside and renamed.

``accelerator.load_state`` runs only after :func:`validate_checkpoint` has read every file once
(``torch.load(weights_only=True)``, NumPy arrays allowed) and loaded each state into a fresh object of its kind; a
folder holding a ``custom_checkpoint_*.pkl`` (which Accelerate would unpickle in full) is refused.
"""

from __future__ import annotations

import codecs
import copy
import errno
import json
import math
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._safe_json import load_json
from .._validation import OptionCheck, is_int, is_number, shorten
from .optimizer_state import OPTIMIZER_FILE, optimizer_file_problem, optimizer_fit_problem

try:
    from safetensors import SafetensorError
except ImportError:  # the core install: no safetensors, and no accelerate to write checkpoints with
    SafetensorError = OSError

__all__ = [
    "CHECKPOINT_PREFIX",
    "TRAINER_STATE",
    "CheckpointError",
    "CheckpointSaveError",
    "find_checkpoints",
    "jsonable",
    "latest_checkpoint",
    "latest_valid_checkpoint",
    "load_scheduler_state",
    "recorded_fingerprint",
    "save_checkpoint",
    "scheduler_state",
    "validate_checkpoint",
]

CHECKPOINT_PREFIX = "step_"
TRAINER_STATE = "trainer_state.json"
SCALER_FILE = "scaler.pt"  #: accelerate.utils.SCALER_NAME: the GradScaler state of an fp16 run


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, corrupt or was written by an incompatible run."""


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (full disk, read-only folder); the message names the folder, the cause and
    what was kept."""


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {str(path)!r} {what}")


def _short(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(x: Any, low: int = 0) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= low


# -- finding -------------------------------------------------------------------------------------------------------
def find_checkpoints(output_dir: str | Path) -> list[Path]:
    """The folders ``output_dir/checkpoints/step_XXXXXXXX`` sorted by step (not ``.tmp-step_X`` nor another run's
    ``step_X-run-<fingerprint>``)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = {p: p.name[len(CHECKPOINT_PREFIX) :] for p in root.iterdir() if p.name.startswith(CHECKPOINT_PREFIX)}
    return sorted((p for p, digits in steps.items() if digits.isdigit() and p.is_dir()), key=lambda p: int(steps[p]))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The most recent complete checkpoint of ``output_dir``, or ``None``."""
    ckpts = find_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def latest_valid_checkpoint(
    output_dir: str | Path, note: Callable[[str], None] = print, validate: Callable[[Path], Any] | None = None
) -> Path | None:
    """The newest checkpoint of ``output_dir`` that ``validate`` (default :func:`validate_checkpoint`) accepts; one
    line to ``note`` names the newer ones skipped, why, and the one chosen."""
    skipped, chosen = [], None
    for ckpt in reversed(find_checkpoints(output_dir)):
        try:
            (validate or validate_checkpoint)(ckpt)
        except CheckpointError as e:
            skipped.append(f"{ckpt.name} ({str(e).removeprefix(f'checkpoint {str(ckpt)!r} ')[:300]})")
            continue
        chosen = ckpt
        break
    if skipped:
        target = f"resuming from {chosen.name}" if chosen is not None else "no checkpoint validates"
        note(f"--resume latest: skipping {'; '.join(skipped)}; {target}")
    return chosen


# -- writing -------------------------------------------------------------------------------------------------------
def save_checkpoint(accelerator: Any, output_dir: Path, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write ``output_dir/checkpoints/step_<global_step>`` (into ``.tmp-step_<global_step>``, then one rename) and
    delete this run's (``trainer_state["fingerprint"]``) oldest checkpoints beyond ``keep`` (0 keeps all); another
    run's checkpoint of that step is kept aside as ``step_<step>-run-<its fingerprint>``. Call it on every process.

    Raises:
        CheckpointSaveError: the write failed (the partial folder is removed).
    """
    acc, root, fingerprint = accelerator, Path(output_dir) / "checkpoints", trainer_state["fingerprint"]
    name = f"{CHECKPOINT_PREFIX}{trainer_state['global_step']:08d}"
    final, tmp = root / name, root / f".tmp-{name}"
    if acc.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    acc.wait_for_everyone()
    try:
        acc.save_state(str(tmp), safe_serialization=True)
        acc.wait_for_everyone()
        if acc.is_main_process:
            (tmp / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=1))
            if final.exists():
                owner = recorded_fingerprint(final / TRAINER_STATE)
                if owner not in (None, fingerprint):  # another run's: kept aside
                    final.rename(root / f"{name}-run-{owner[:12]}")
                else:
                    shutil.rmtree(final)
            tmp.rename(final)
    except (OSError, RuntimeError, SafetensorError) as e:  # a full disk: "RuntimeError: ... unexpected pos"
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointSaveError(_save_failure(root, name, tmp, e)) from e
    if acc.is_main_process and keep > 0:
        ours = [c for c in find_checkpoints(output_dir) if recorded_fingerprint(c / TRAINER_STATE) == fingerprint]
        for old in ours[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()
    return final


def recorded_fingerprint(file: Path, key: str = "fingerprint") -> str | None:
    """The string ``key`` of the JSON file ``file`` (``None`` if unreadable or absent): the run fingerprint of a
    ``trainer_state.json``, ``run.json`` or ``final/training_summary.json`` (``key="run_fingerprint"``)."""
    try:
        value = load_json(file, expected=dict).get(key)
    except (OSError, ValueError):  # missing, corrupt, too deep: a bad file must not stop a save
        return None
    return value if isinstance(value, str) else None


def _save_failure(root: Path, name: str, tmp: Path, error: BaseException) -> str:
    """The path, the cause (the errno, also as safetensors writes it: ``Os { code: 28, ...``) and what was kept."""
    code = getattr(error, "errno", None)
    if code is None and (found := re.search(r"\bcode: (\d+)", str(error))):
        code = int(found.group(1))
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
    kept_text = "no earlier checkpoint exists"
    if kept:
        older = f" and {len(kept) - 3} older" if len(kept) > 3 else ""
        kept_text = (
            f"the previous checkpoints are kept unchanged ({', '.join(kept[-3:])}{older}; --resume latest "
            f"continues from {kept[-1]})"
        )
    return (
        f"cannot write checkpoint {name} into {str(tmp)!r}: {cause} ({_short(error)}); the partial folder was "
        f"removed and {kept_text}; free space or choose another --output_dir"
    )


def jsonable(x: Any) -> Any:
    """``x`` with tensors, NumPy values and paths turned into JSON values (recursively)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, Tensor):
        return x.item() if x.numel() == 1 else x.tolist()
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    return str(x) if isinstance(x, Path) else x


# -- the scheduler, as JSON ----------------------------------------------------------------------------------------
_SCHEDULER_KEYS = frozenset(
    {"base_lrs", "last_epoch", "_step_count", "_last_lr", "lr_lambdas", "verbose", "_get_lr_called_within_step"}
    | {"_is_initial"}
)


def scheduler_state(scheduler: Any) -> dict[str, Any]:
    """The state of a ``LambdaLR`` of plain functions as JSON."""
    state = scheduler.state_dict()
    if set(state) - _SCHEDULER_KEYS or any(x is not None for x in state.get("lr_lambdas", [])):
        raise TypeError(f"only a LambdaLR of plain functions can be checkpointed as JSON; got keys {sorted(state)}")
    return jsonable(state)


def load_scheduler_state(scheduler: Any, state: dict[str, Any]) -> None:
    """Load a validated :func:`scheduler_state` into ``scheduler``."""
    scheduler.load_state_dict({**state, "lr_lambdas": [None] * len(scheduler.base_lrs)})


def _check_scheduler(path: Path, state: dict[str, Any], step: int) -> None:
    where = f"{TRAINER_STATE} 'scheduler"
    if set(state) - _SCHEDULER_KEYS:
        raise _refuse(path, f"{where}' must be a LambdaLR state with keys in {sorted(_SCHEDULER_KEYS)}")
    for key in ("base_lrs", "_last_lr"):
        values, base = state.get(key), state.get("base_lrs")
        numbers = isinstance(values, list) and all(type(v) in (int, float) and math.isfinite(v) for v in values)
        if not (numbers and isinstance(base, list) and len(values) == len(base) > 0):
            raise _refuse(path, f"{where}.{key}' must be one finite number per parameter group; got {str(values)[:80]}")
        if any(v < 0 for v in values):
            raise _refuse(path, f"{where}.{key}' must be learning rates >= 0; got {str(values)[:80]}")
    for key in ("last_epoch", "_step_count"):
        if not _is_int(state.get(key), -1):
            raise _refuse(path, f"{where}.{key}' must be an int >= -1; got {state.get(key)!r}")
    if not 0 <= state["last_epoch"] <= step or state["_step_count"] != state["last_epoch"] + 1:
        raise _refuse(
            path,
            f"{where}' is inconsistent: 'last_epoch' {state['last_epoch']} must be in [0, global_step {step}] and "
            f"'_step_count' {state['_step_count']} one more (the schedule would restart elsewhere)",
        )
    for key in ("_is_initial", "_get_lr_called_within_step"):
        if key in state and type(state[key]) is not bool:
            raise _refuse(path, f"{where}.{key}' must be true or false; got {shorten(repr(state[key]), 40)}")


# -- reading -------------------------------------------------------------------------------------------------------
_COUNTERS = dict.fromkeys(("global_step", "epoch", "step_in_epoch", "total_steps"), 0) | {
    "num_processes": 1,
    "steps_per_epoch": 1,
    "skipped_nonfinite_steps": 0,
    "consecutive_nonfinite_steps": 0,
}
_TYPES = {"sampler": dict, "fingerprint": str, "run_config": dict, "scheduler": dict, "history": list}
_TYPES["optimizer_state"] = list
_RNG_KEYS = frozenset(
    {"step", "random_state", "numpy_random_seed", "torch_manual_seed", "xm_seed"}
    | {f"torch_{d}_manual_seed" for d in ("cuda", "xpu", "mlu", "sdaa", "musa", "hpu", "neuron")}
)


def validate_checkpoint(
    path: str | Path,
    num_processes: int | None = None,
    *,
    module: Any = None,
    optimizer: Any = None,
    sampler: Any = None,
    scaler: Any = None,
) -> dict[str, Any]:
    """The trainer state of the complete :class:`~pml_suprank.training.Trainer` checkpoint ``path``, each file read
    once and checked: consistent counters (``global_step = epoch · steps_per_epoch + step_in_epoch``, the folder's
    step, the sampler position), readable ``model*.safetensors``, ``optimizer.bin`` state for exactly the parameters
    ``trainer_state.json`` lists, one loadable ``random_states_<i>.pkl`` per process (``num_processes``), a
    ``scaler.pt`` (fp16) holding a usable GradScaler state. It must also fit what is resumed: ``module``'s weight
    names, shapes and dtypes, ``optimizer``'s groups, keys, dtypes and shapes, one scheduler entry per group, the
    sampler state (one without state resumes only at an epoch's end), an enabled ``scaler``'s state.

    Raises:
        CheckpointError: naming the folder, the file and what is missing, unreadable, inconsistent or does not fit.
    """
    path = Path(path)
    if not path.is_dir():
        raise _refuse(path, "does not exist or is not a folder")
    if not (path / TRAINER_STATE).is_file():
        raise _refuse(path, f"is incomplete: {TRAINER_STATE} is missing")
    if planted := sorted(p.name for p in path.glob("custom_checkpoint_*")):
        raise _refuse(path, f"holds {planted} (Accelerate would unpickle them with code execution): not loaded")
    try:
        state = load_json(path / TRAINER_STATE, expected=dict, what="checkpoint state")
    except (OSError, ValueError) as e:
        raise _refuse(path, f"is corrupt: {TRAINER_STATE} cannot be read ({_short(e)})") from e
    _check_trainer_state(path, state)
    if num_processes is not None and state["num_processes"] != num_processes:
        raise _refuse(
            path,
            f"was written by {state['num_processes']} processes; this run has {num_processes} (the "
            "sampler streams and RNG states are per process)",
        )
    _check_scheduler(path, state["scheduler"], state["global_step"])
    weights = _weights_layout(path)
    saved_optimizer = _load_tensors(path, OPTIMIZER_FILE)
    if problem := optimizer_file_problem(saved_optimizer, state.get("optimizer_state"), state["global_step"]):
        raise _refuse(path, problem)
    for index in range(state["num_processes"]):
        _check_rng_states(path, f"random_states_{index}.pkl")
    _check_scaler_file(path, scaler)
    if module is not None:
        _check_weights_fit(path, weights, module)
    if optimizer is not None:
        if problem := optimizer_fit_problem(saved_optimizer, getattr(optimizer, "optimizer", optimizer)):
            raise _refuse(path, problem)
        if len(state["scheduler"]["base_lrs"]) != len(optimizer.param_groups):
            raise _refuse(
                path,
                f"{TRAINER_STATE} 'scheduler.base_lrs' has {len(state['scheduler']['base_lrs'])} entries; "
                f"this optimizer has {len(optimizer.param_groups)} parameter groups",
            )
    if sampler is not None:
        _check_sampler_fits(path, state, sampler)
    return state


def _check_trainer_state(path: Path, state: dict[str, Any]) -> None:
    bad = f"is corrupt: {TRAINER_STATE} "
    required = ("global_step", "epoch", "step_in_epoch", "steps_per_epoch", "num_processes", "sampler", "scheduler")
    required += ("fingerprint", "run_config")
    if missing := [k for k in required if k not in state]:
        raise _refuse(path, bad + f"lacks {missing} (a checkpoint of an older version, or damaged)")
    for key, low in _COUNTERS.items():
        if key in state and not _is_int(state[key], low):
            raise _refuse(path, bad + f"'{key}' must be an int >= {low}; got {state[key]!r}")
    for key, kind in _TYPES.items():
        if key in state and not isinstance(state[key], kind) and (key in required or state[key] is not None):
            raise _refuse(path, bad + f"'{key}' must be a {kind.__name__}; got {type(state[key]).__name__}")
    step, epoch, pos, spe = (state.get(k) for k in ("global_step", "epoch", "step_in_epoch", "steps_per_epoch"))
    bad += "is inconsistent: "
    for key, counter in (("epoch", "epoch"), ("position", "step_in_epoch")) if state["sampler"] else ():
        value = state["sampler"].get(key)
        if not _is_int(value) or value != state[counter]:
            raise _refuse(path, bad + f"'sampler.{key}' is {value!r} but '{counter}' is {state[counter]!r}")
    if pos >= spe or step != epoch * spe + pos:
        raise _refuse(
            path,
            bad + f"'global_step' is {step} but epoch {epoch} x {spe} steps per epoch + step_in_epoch "
            f"{pos} = {epoch * spe + pos}",
        )
    digits = path.name.removeprefix(CHECKPOINT_PREFIX)
    if digits.isdigit() and int(digits) != step:
        raise _refuse(path, bad + f"the folder {path.name} is step {int(digits)} but 'global_step' is {step}")
    skipped, row = state.get("skipped_nonfinite_steps", 0), state.get("consecutive_nonfinite_steps", 0)
    if not row <= skipped <= step:
        raise _refuse(
            path,
            bad + f"'consecutive_nonfinite_steps' {row} <= 'skipped_nonfinite_steps' {skipped} <= "
            f"'global_step' {step} does not hold",
        )
    indices = state.get("optimizer_state")
    if indices is not None and (len(set(indices)) != len(indices) or not all(_is_int(i) for i in indices)):
        raise _refuse(path, bad + "'optimizer_state' must list distinct parameter indices (ints >= 0)")


def _load_tensors(path: Path, name: str) -> Any:
    """``torch.load(path/name, weights_only=True)``, NumPy arrays allowed (the RNG states)."""
    if not (path / name).is_file():
        raise _refuse(path, f"is incomplete: {name} is missing")
    core = np._core if hasattr(np, "_core") else np.core  # numpy >= 2 renamed its core package
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]
    allowed += [np.dtypes.UInt32DType] if hasattr(np, "dtypes") else []
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path / name, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, garbage, a pickle of anything but tensors: all refused
        raise _refuse(path, f"is corrupt: cannot read {name} ({_short(e)})") from e


def _check_rng_states(path: Path, name: str) -> None:
    """Each RNG state of ``name`` loads into a fresh generator; one CUDA state per visible device."""
    states = _load_tensors(path, name)
    bad = f"is corrupt: {name} "
    if not isinstance(states, dict) or set(states) - _RNG_KEYS:
        keys = sorted(map(str, states)) if isinstance(states, dict) else type(states).__name__
        raise _refuse(path, bad + f"must be a dict with keys in {sorted(_RNG_KEYS)}; got {keys}")
    trials = {
        "random_state": random.Random().setstate,
        "numpy_random_seed": np.random.RandomState().set_state,
        "torch_manual_seed": torch.Generator().set_state,
    }
    if missing := [k for k in ("step", *trials) if k not in states]:
        raise _refuse(path, bad + f"lacks {missing[0]!r}")
    if not _is_int(states["step"]):
        raise _refuse(path, bad + f"'step' must be an int >= 0; got {states['step']!r}")
    for key, trial in trials.items():
        try:
            trial(states[key])
        except Exception as e:
            raise _refuse(path, bad + f"'{key}' is not a state of that generator ({_short(e, 120)})") from e
    cuda, count = states.get("torch_cuda_manual_seed"), torch.cuda.device_count() if torch.cuda.is_available() else 0
    tensors = isinstance(cuda, (list, tuple)) and all(isinstance(t, Tensor) and t.dtype == torch.uint8 for t in cuda)
    if (cuda is not None or count) and not (tensors and len(cuda) == count):
        raise _refuse(
            path, bad + f"'torch_cuda_manual_seed' must be {count} uint8 tensors (one per visible CUDA device)"
        )


#: the keys of a ``GradScaler.state_dict()`` and their checks
_SCALER_STATE: dict[str, OptionCheck] = {
    "scale": is_number(0, strict=True),
    "growth_factor": is_number(1, strict=True),
    "backoff_factor": is_number(0, strict=True, high=1, open_high=True),
    "growth_interval": is_int(1),
    "_growth_tracker": is_int(0),
}


def _check_scaler_file(path: Path, scaler: Any) -> None:
    """``scaler.pt`` (written by Accelerate for an fp16 run, loaded into ``scaler``) is a ``GradScaler.state_dict()``
    whose scale and factors keep training finite: a NaN scale or a backoff factor of 2 would poison every step. An
    enabled ``scaler`` needs the file and a non-empty state (``{}``: a disabled scaler's)."""
    enabled = scaler is not None and bool(getattr(scaler, "is_enabled", lambda: True)())
    if not (path / SCALER_FILE).is_file() and not enabled:
        return
    if not (path / SCALER_FILE).is_file():
        raise _refuse(
            path,
            f"is incomplete: {SCALER_FILE} is missing (this run trains with fp16: its GradScaler state would be lost)",
        )
    state, bad = _load_tensors(path, SCALER_FILE), f"is corrupt: {SCALER_FILE} "
    if not isinstance(state, dict) or ((state or enabled) and set(state) != set(_SCALER_STATE)):
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise _refuse(path, bad + f"must be a GradScaler state_dict with keys {sorted(_SCALER_STATE)}; got {keys}")
    for key, check in _SCALER_STATE.items():
        if key in state and not check(state[key]):
            raise _refuse(path, bad + f"'{key}' must be {check.expected}; got {shorten(repr(state[key]), 80)}")
    if state and state["_growth_tracker"] >= state["growth_interval"]:
        raise _refuse(
            path,
            f"is inconsistent: {SCALER_FILE} '_growth_tracker' must be below 'growth_interval' "
            f"{state['growth_interval']} (else the scale never grows again); got {state['_growth_tracker']}",
        )


def _weights_layout(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, safetensors dtype)}`` of the ``model*.safetensors`` files of ``path`` (headers checked)."""
    from safetensors import safe_open

    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise _refuse(path, "is incomplete: no model weights (model.safetensors)")
    out = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    view = f.get_slice(key)
                    out[key] = (tuple(view.get_shape()), view.get_dtype())
        except Exception as e:
            raise _refuse(path, f"is corrupt: cannot read {file.name} ({_short(e)})") from e
    return out


# -- fitting what is resumed ---------------------------------------------------------------------------------------
def _check_weights_fit(path: Path, saved: dict[str, tuple[tuple[int, ...], str]], module: Any) -> None:
    current = {
        k: (tuple(v.shape), _SAFETENSORS_DTYPES.get(v.dtype, str(v.dtype))) for k, v in module.state_dict().items()
    }
    for k in sorted(saved.keys() | current.keys()):
        if saved.get(k) != current.get(k):
            raise _refuse(
                path,
                f"model.safetensors does not fit this model: {k!r} (shape, dtype) is {saved.get(k)}, this "
                f"model's {current.get(k)}",
            )


def _check_sampler_fits(path: Path, state: dict[str, Any], sampler: Any) -> None:
    if not hasattr(sampler, "load_state_dict"):
        if state["step_in_epoch"] > 0:
            raise _refuse(
                path,
                f"is inside an epoch (step_in_epoch={state['step_in_epoch']}) but this run's sampler "
                f"({type(sampler).__name__}) has no state_dict() / load_state_dict(): the resumed run would train "
                "on other batches; resume from the end of an epoch (checkpoint_every=0 writes one per epoch)",
            )
        return
    if not state["sampler"]:
        raise _refuse(
            path,
            f"{TRAINER_STATE} has no sampler state ('sampler' is {state['sampler']!r}) but this run's "
            f"sampler ({type(sampler).__name__}) keeps one: it would restart at epoch 0 and the resumed run "
            "would train on other batches",
        )
    try:
        copy.deepcopy(sampler).load_state_dict(state["sampler"])
    except ValueError as e:
        raise _refuse(path, f"{TRAINER_STATE} 'sampler': {e}") from e


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}
_SAFETENSORS_DTYPES |= {torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8"}
_SAFETENSORS_DTYPES[torch.bool] = "BOOL"
