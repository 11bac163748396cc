"""The files of one checkpoint, each validated before anything is loaded: weights, optimizer, RNG states.

``accelerator.save_state`` writes ``model.safetensors`` (the :class:`~pml_suprank.training.LossModule`: network,
loss proxies, memory buffers), ``optimizer.bin`` (a ``torch.save`` of the optimizer state) and one
``random_states_<process>.pkl`` per process (a ``torch.save`` of the Python, NumPy, torch CPU and accelerator RNG
states); the trainer adds ``trainer_state.json`` (counters, sampler position, scheduler). A resume is exact only if
every one of them is restored, so each is read here first (pickled files with ``weights_only=True``: nothing is
unpickled beyond tensors, numbers, strings and NumPy arrays) and checked against a schema (types, shapes, lengths)
and, with :func:`check_against_trainer`, against the model, optimizer and sampler being resumed. Accelerate's own
RNG loading gives up silently ("Could not load random states", logged at INFO); :func:`restore_rng_states` sets the
validated states itself after ``load_state``.
"""

from __future__ import annotations

import codecs
import copy
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "OPTIMIZER_FILE",
    "CheckpointError",
    "check_against_trainer",
    "check_optimizer_file",
    "check_weights_files",
    "optimizer_state_indices",
    "read_rng_states",
    "restore_rng_states",
    "rng_file",
    "weights_shapes",
]

OPTIMIZER_FILE = "optimizer.bin"
_MT_WORDS = 624  # the Mersenne-Twister state of Python's random and NumPy's RandomState
#: the keys Accelerate writes into random_states_<i>.pkl (device RNG lists only where that device exists)
_DEVICE_RNG_KEYS = frozenset({"torch_cuda_manual_seed", "torch_xpu_manual_seed", "torch_mlu_manual_seed",
                              "torch_sdaa_manual_seed", "torch_musa_manual_seed", "torch_hpu_manual_seed",
                              "torch_neuron_manual_seed"})  # fmt: skip
_RNG_KEYS = frozenset({"step", "random_state", "numpy_random_seed", "torch_manual_seed", "xm_seed"}) | _DEVICE_RNG_KEYS


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                       torch.bool: "BOOL"}  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, corrupt or was written by an incompatible run."""


def rng_file(path: Path, process_index: int) -> Path:
    """``path/random_states_<process_index>.pkl``."""
    return Path(path) / f"random_states_{process_index}.pkl"


def _load_pickled_tensors(file: Path, where: str) -> Any:
    """``torch.load(file, weights_only=True)`` allowing NumPy arrays (RNG states); refuses anything else."""
    if not file.is_file():
        raise CheckpointError(f"{where} is incomplete: {file.name} is missing")
    core = np._core if hasattr(np, "_core") else np.core  # numpy >= 2 renamed its core package
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]
    if hasattr(np, "dtypes"):
        allowed.append(np.dtypes.UInt32DType)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, garbage, a pickle of anything but tensors: all refused
        raise CheckpointError(f"{where} is corrupt: cannot read {file.name} ({_short(e)})") from e


def _short(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(x: Any, low: int | None = None, high: int | None = None) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        return False
    return (low is None or x >= low) and (high is None or x <= high)


def read_rng_states(path: Path, process_index: int) -> dict[str, Any]:
    """The validated RNG states of ``path/random_states_<process_index>.pkl``.

    Schema: ``step`` an int >= 0; ``random_state`` = ``(3, 625 ints in [0, 2³²), None | float)`` (the last int, the
    position, <= 624); ``numpy_random_seed`` = ``("MT19937", uint32 array (624,), position in [0, 624], has_gauss
    0/1, cached float)``; ``torch_manual_seed`` a uint8 tensor as long as this torch's CPU state; the CUDA states (a
    list of uint8 tensors, one per visible device) present exactly when CUDA is available here.

    Raises:
        CheckpointError: the file is missing, unreadable, a pickle of anything else, or breaks the schema.
    """
    file = rng_file(path, process_index)
    where = f"checkpoint {str(path)!r}"
    states = _load_pickled_tensors(file, where)
    bad = f"{where} is corrupt: {file.name} "
    if not isinstance(states, dict) or set(states) - _RNG_KEYS:
        keys = sorted(map(str, states)) if isinstance(states, dict) else type(states).__name__
        raise CheckpointError(bad + f"must be a dict with keys in {sorted(_RNG_KEYS)}; got {keys}")
    for key in ("step", "random_state", "numpy_random_seed", "torch_manual_seed"):
        if key not in states:
            raise CheckpointError(bad + f"lacks {key!r}")
    if not _is_int(states["step"], 0):
        raise CheckpointError(bad + f"'step' must be an int >= 0; got {states['step']!r}")
    _check_python_state(bad, states["random_state"])
    _check_numpy_state(bad, states["numpy_random_seed"])
    cpu = states["torch_manual_seed"]
    size = torch.get_rng_state().numel()
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8 and cpu.shape == (size,)):
        raise CheckpointError(bad + f"'torch_manual_seed' must be a uint8 tensor of shape ({size},); got {_desc(cpu)}")
    _check_cuda_state(bad, states.get("torch_cuda_manual_seed"))
    return states


def _desc(x: Any) -> str:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return f"{type(x).__name__} of dtype {x.dtype} and shape {tuple(x.shape)}"
    return type(x).__name__


def _check_python_state(bad: str, value: Any) -> None:
    ok = isinstance(value, tuple) and len(value) == 3 and value[0] == 3 and isinstance(value[1], tuple)
    ok = ok and len(value[1]) == _MT_WORDS + 1 and (value[2] is None or isinstance(value[2], float))
    ok = ok and all(_is_int(w, 0, 2**32 - 1) for w in value[1]) and value[1][-1] <= _MT_WORDS
    if not ok:
        raise CheckpointError(bad + "'random_state' must be Python's random.getstate(): (3, 625 ints, None or float)")


def _check_numpy_state(bad: str, value: Any) -> None:
    ok = isinstance(value, tuple) and len(value) == 5 and value[0] == "MT19937"
    ok = ok and isinstance(value[1], np.ndarray) and value[1].dtype == np.uint32 and value[1].shape == (_MT_WORDS,)
    ok = ok and _is_int(value[2], 0, _MT_WORDS) and _is_int(value[3], 0, 1) and isinstance(value[4], float)
    if not ok:
        raise CheckpointError(
            bad + "'numpy_random_seed' must be numpy.random.get_state(): ('MT19937', uint32 array (624,), position, "
            "has_gauss, cached_gaussian)"
        )


def _check_cuda_state(bad: str, value: Any) -> None:
    if not torch.cuda.is_available():
        if value is not None:
            raise CheckpointError(bad + "holds CUDA RNG states but CUDA is not available here: the resume would not "
                                  "be exact")  # fmt: skip
        return
    count = torch.cuda.device_count()
    ok = isinstance(value, (list, tuple)) and len(value) == count
    ok = ok and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 for t in value)
    if not ok:
        raise CheckpointError(bad + f"'torch_cuda_manual_seed' must be {count} uint8 tensors (one per visible CUDA "
                              f"device); got {_desc(value)}")  # fmt: skip


def restore_rng_states(states: dict[str, Any], accelerator: Any = None) -> None:
    """Set the Python, NumPy, torch CPU (and CUDA) generators from validated ``states`` (:func:`read_rng_states`),
    and ``accelerator.step`` from ``states["step"]`` when an accelerator is given."""
    if accelerator is not None:
        accelerator.step = states["step"]
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(states["torch_cuda_manual_seed"]))


def check_weights_files(path: Path) -> list[Path]:
    """The ``model*.safetensors`` files of ``path``, each readable (header and data length).

    Raises:
        CheckpointError: there is none, or one cannot be read (truncated, garbage, a pickle).
    """
    weights = sorted(Path(path).glob("model*.safetensors"))
    if not weights:
        raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: no model weights (model.safetensors)")
    for w in weights:
        try:
            weights_shapes(w)
        except Exception as e:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: cannot read {w.name} ({_short(e)})") from e
    return weights


def weights_shapes(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, safetensors dtype)}`` of a safetensors file (opening it checks the header and that the file
    holds every tensor's bytes: a truncated or damaged file raises)."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(file), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            view = f.get_slice(key)
            out[key] = (tuple(view.get_shape()), str(view.get_dtype()))
    return out


def optimizer_state_indices(optimizer: Any) -> list[int]:
    """The indices (as in ``optimizer.state_dict()``: parameters numbered through the groups in order) of the
    parameters that have optimizer state (e.g. Adam's moments): recorded in ``trainer_state.json`` so that a resume
    can require exactly these in ``optimizer.bin``."""
    params = (p for g in optimizer.param_groups for p in g["params"])
    return [i for i, p in enumerate(params) if optimizer.state.get(p)]


def check_optimizer_file(path: Path, with_state: list[int] | None = None, step: int = 0) -> dict[str, Any]:
    """The validated ``path/optimizer.bin``: ``{"state": {int: {str: tensor | number}}, "param_groups": [{"params":
    [int, ...], ...}, ...]}`` with every state index listed by a group, and per-parameter state where the optimizer
    had it: for exactly the parameters ``with_state`` (``trainer_state.json`` ``"optimizer_state"``) or, when that
    is not recorded, for at least one parameter after a step (``step > 0``); otherwise the moments of Adam (or
    SGD's momentum) would silently restart at zero.

    Raises:
        CheckpointError: the file is missing, unreadable, a pickle of anything else, or breaks the schema.
    """
    where = f"checkpoint {str(path)!r}"
    state = _load_pickled_tensors(Path(path) / OPTIMIZER_FILE, where)
    bad = f"{where} is corrupt: {OPTIMIZER_FILE} "
    if not isinstance(state, dict) or set(state) != {"state", "param_groups"}:
        raise CheckpointError(bad + "must be an optimizer state_dict with keys 'state' and 'param_groups'")
    groups = state["param_groups"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                               for g in groups):  # fmt: skip
        raise CheckpointError(bad + "'param_groups' must be a list of dicts with a 'params' list")
    ids = [i for g in groups for i in g["params"]]
    if not all(_is_int(i, 0) for i in ids) or len(set(ids)) != len(ids):
        raise CheckpointError(bad + "'param_groups' must list distinct parameter indices (ints >= 0)")
    per_param = state["state"]
    if not isinstance(per_param, dict) or not set(per_param) <= set(ids):
        raise CheckpointError(bad + "'state' must map parameter indices listed in 'param_groups' to their state")
    for i, entry in per_param.items():
        if not isinstance(entry, dict) or not all(
            isinstance(k, str) and isinstance(v, (torch.Tensor, int, float, bool, type(None))) for k, v in entry.items()
        ):
            raise CheckpointError(bad + f"'state[{i}]' must map names to tensors or numbers")
        if not entry:
            raise CheckpointError(bad + f"'state[{i}]' is empty")
    if with_state is not None and set(per_param) != set(with_state):
        lost, extra = sorted(set(with_state) - set(per_param)), sorted(set(per_param) - set(with_state))
        raise CheckpointError(
            bad + f"holds state for {len(per_param)} parameters but trainer_state.json 'optimizer_state' lists "
            f"{len(with_state)} (missing {lost[:8]}, unexpected {extra[:8]}): the optimizer would restart their "
            "moments at zero"
        )
    if with_state is None and step > 0 and not per_param:
        raise CheckpointError(bad + f"holds no per-parameter state at step {step}: the optimizer would restart its "
                              "moments at zero")  # fmt: skip
    return state


def check_against_trainer(
    path: Path, model_state: dict[str, torch.Tensor], optimizer: Any, sampler: Any, state: dict[str, Any]
) -> dict[str, Any]:
    """Check that the files of checkpoint ``path`` fit what is being resumed, before anything is loaded: the weights
    (names, shapes, dtypes) fit ``model_state`` (the LossModule's state dict: network, proxies, memory), the optimizer
    state fits ``optimizer`` (groups, parameters per group, the shape of every per-parameter tensor), and
    the sampler state of the trainer ``state`` (``trainer_state.json``) loads into a copy of ``sampler``. Returns
    ``state``.

    Raises:
        CheckpointError: naming the checkpoint, the file and the first mismatch.
    """
    where = f"checkpoint {str(path)!r}"
    saved: dict[str, tuple[tuple[int, ...], str]] = {}
    for w in check_weights_files(path):
        saved.update(weights_shapes(w))
    current = {k: (tuple(v.shape), _SAFETENSORS_DTYPES.get(v.dtype, str(v.dtype))) for k, v in model_state.items()}
    if saved.keys() != current.keys():
        extra, missing = sorted(saved.keys() - current.keys()), sorted(current.keys() - saved.keys())
        raise CheckpointError(f"{where}: model.safetensors does not fit this model (unexpected {extra[:5]}, missing "
                              f"{missing[:5]})")  # fmt: skip
    for k, v in current.items():
        if saved[k] != v:
            raise CheckpointError(f"{where}: model.safetensors has {k!r} of shape/dtype {saved[k]}; this model {v}")
    _check_optimizer_fits(where, check_optimizer_file(path), optimizer)
    base_lrs = (state.get("scheduler") or {}).get("base_lrs")
    if isinstance(base_lrs, list) and len(base_lrs) != len(optimizer.param_groups):
        raise CheckpointError(f"{where}: trainer_state.json 'scheduler.base_lrs' has {len(base_lrs)} entries; this "
                              f"optimizer has {len(optimizer.param_groups)} parameter groups")  # fmt: skip
    if hasattr(sampler, "load_state_dict"):
        if not state.get("sampler"):
            raise CheckpointError(
                f"{where}: trainer_state.json has no sampler state ('sampler' is {state.get('sampler')!r}) but this "
                f"run's sampler ({type(sampler).__name__}) keeps one: it would restart at epoch 0 and the resumed run "
                "would train on other batches"
            )
        try:
            copy.deepcopy(sampler).load_state_dict(state["sampler"])
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from e
    elif state["step_in_epoch"] > 0:
        raise CheckpointError(
            f"{where} is inside an epoch (step_in_epoch={state['step_in_epoch']}) but this run's sampler "
            f"({type(sampler).__name__}) has no state_dict() / load_state_dict(): its position cannot be restored "
            "and the resumed run would train on other batches; resume from a checkpoint at the end of an epoch "
            "(checkpoint_every=0 writes one per epoch) or give the sampler state_dict() / load_state_dict()"
        )
    return state


def _check_optimizer_fits(where: str, state: dict[str, Any], optimizer: Any) -> None:
    groups = optimizer.param_groups
    saved = state["param_groups"]
    if [len(g["params"]) for g in saved] != [len(g["params"]) for g in groups]:
        raise CheckpointError(
            f"{where}: {OPTIMIZER_FILE} has parameter groups of sizes {[len(g['params']) for g in saved]}; this "
            f"optimizer {[len(g['params']) for g in groups]}"
        )
    params = {i: p for sg, g in zip(saved, groups, strict=True) for i, p in zip(sg["params"], g["params"], strict=True)}
    group_of = {i: k for k, sg in enumerate(saved) for i in sg["params"]}
    expected = [_state_layout(optimizer, g) for g in groups]
    for i, entry in state["state"].items():
        layout = expected[group_of[i]]
        if layout is not None:
            _check_state_entry(where, i, entry, layout, type(getattr(optimizer, "optimizer", optimizer)).__name__)
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[i].shape:
                raise CheckpointError(
                    f"{where}: {OPTIMIZER_FILE} 'state[{i}][{name!r}]' has shape {tuple(value.shape)}; the parameter "
                    f"has {tuple(params[i].shape)}"
                )


def _state_layout(optimizer: Any, group: dict[str, Any]) -> dict[str, torch.dtype | None] | None:
    """``{state key: tensor dtype, or None for a number}`` that ``optimizer``'s class keeps for a parameter of
    ``group`` (found by one step of a fresh optimizer of that class, same hyper-parameters, on a 2-element parameter
    of the group's dtype and device); ``None`` when it cannot be found (an optimizer that does not take this)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # an accelerate AcceleratedOptimizer wraps the torch one
    if not group["params"]:
        return None
    ref = group["params"][0]
    try:
        probe = torch.zeros(2, dtype=ref.dtype, device=ref.device, requires_grad=True)
        fresh = type(inner)([{**{k: v for k, v in group.items() if k != "params"}, "params": [probe]}])
        probe.grad = torch.zeros_like(probe)
        fresh.step()
        kept = fresh.state[probe]
    except Exception:  # noqa: BLE001 - an optimizer class that cannot be probed: its keys are not checked
        return None
    return {k: (v.dtype if isinstance(v, torch.Tensor) else None) for k, v in kept.items()}


def _check_state_entry(where: str, i: int, entry: dict[str, Any], layout: dict[str, Any], kind: str) -> None:
    """``optimizer.bin``'s ``state[i]`` has the keys ``layout`` names, tensors of its dtypes."""
    if set(entry) != set(layout):
        raise CheckpointError(
            f"{where}: {OPTIMIZER_FILE} 'state[{i}]' has keys {sorted(entry)}; this optimizer ({kind}) keeps "
            f"{sorted(layout)} for every parameter it updates"
        )
    for name, dtype in layout.items():
        value = entry[name]
        if dtype is not None and not (isinstance(value, torch.Tensor) and value.dtype == dtype):
            raise CheckpointError(
                f"{where}: {OPTIMIZER_FILE} 'state[{i}][{name!r}]' must be a tensor of dtype {dtype}; got "
                f"{_desc(value)}"
            )
