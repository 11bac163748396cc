"""On-disk format of a saved model or detector: ``config.json`` + ``model.safetensors``, staged then renamed.

``config.json`` has one layout for every saved object: ``architecture`` (the class name), ``library_name``,
``library_version``, ``task``, ``model_args`` (the JSON-able constructor kwargs: the object is rebuilt by calling its
class with them), ``training`` (free-form metadata) and object-specific keys (``embedding_size``, ``pretrained_cfg``,
``fitted``...). Tensors are in ``model.safetensors``: nothing is unpickled. Saves are staged (:func:`staged_folder`);
loaded tensors are validated before use (:func:`check_state`, :func:`check_loaded_values`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._safe_json import load_json
from .._validation import OptionCheck, is_int, shorten
from ..version import __version__
from .schema import check_names, check_tensor, kind_of

__all__ = [
    "CONFIG_NAME",
    "DETECTOR_TASK",
    "LIBRARY_NAME",
    "METRICS_NAME",
    "MODEL_CARD_NAME",
    "PICKLE_SUFFIXES",
    "RETRIEVAL_TASK",
    "WEIGHTS_NAME",
    "check_loaded_values",
    "check_metrics",
    "check_state",
    "check_training_metadata",
    "jsonable",
    "make_config",
    "read_config",
    "read_weights",
    "sha256_file",
    "staged_folder",
    "write_weights",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_CARD_NAME = "README.md"
METRICS_NAME = "metrics.json"
LIBRARY_NAME = "pml-suprank"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
RETRIEVAL_TASK = "image-retrieval"
DETECTOR_TASK = "ood-detection"


# ---------------------------------------------------------------------------------------------------------- config
def jsonable(value: Any, name: str) -> Any:
    """``value`` round-tripped through JSON (so tuples become lists); ``TypeError`` naming ``name`` otherwise."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be JSON-serialisable (dicts, lists, str, numbers, bool, None); {e}") from e


def make_config(
    architecture: str,
    model_args: Mapping[str, Any],
    *,
    task: str,
    metadata: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The common ``config.json`` layout (see the module docstring); ``extra`` adds object-specific keys."""
    config: dict[str, Any] = {
        "architecture": str(architecture),
        "library_name": LIBRARY_NAME,
        "library_version": __version__,
        "task": task,
        "model_args": jsonable(dict(model_args), "model_args"),
        "training": jsonable(dict(metadata or {}), "metadata"),
    }
    config.update(extra)
    return config


def _upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """Map the detector layout written by pml-suprank <= 0.x (``detector`` / ``library`` / ``config`` keys) onto
    the common layout; other configs are returned unchanged."""
    if "model_args" in config or "detector" not in config or not isinstance(config.get("config", {}), dict):
        return config
    return {
        "architecture": config["detector"],
        "library_name": LIBRARY_NAME,
        "library_version": config.get("library_version"),
        "task": DETECTOR_TASK,
        "model_args": dict(config.get("config", {})),
        "training": {},
        "fitted": config.get("fitted", False),  # a non-bool is refused by the loader, not converted
    }


def _kind(kind: type, what: str) -> OptionCheck:
    """``null`` or a value of type ``kind`` (a bool does not count as an int)."""
    return OptionCheck(lambda v: v is None or (isinstance(v, kind) and not isinstance(v, bool)), f"null or {what}")


_OBJECT, _INT = _kind(dict, what="a JSON object"), _kind(int, what="an int")
_COUNT = is_int(0)
_COUNTS = OptionCheck(lambda v: _OBJECT(v) and all(map(_COUNT, (v or {}).values())),
                      "null or a JSON object of ints >= 0")  # fmt: skip
#: the ``training`` metadata a model card reads (``dotted.key``: check); other keys are free-form
TRAINING_METADATA: dict[str, OptionCheck] = {
    **dict.fromkeys(("loss", "dataset", "hub_config"), _kind(str, what="a string")),
    "label_names": OptionCheck(lambda v: v is None or isinstance(v, list) and all(isinstance(n, str) for n in v),
                               "null or a list of strings"),
    **dict.fromkeys(("card_hub", "data_summary", "training_config", "loss_kwargs", "compute", "schedule",
                     "card_hub.paper_results", "data_summary.train", "data_summary.test"), _OBJECT),
    **dict.fromkeys(("card_hub.tags", "card_hub.datasets"), _kind(list, what="a list")),
    **dict.fromkeys(("data_summary.train.class_counts", "data_summary.test.class_counts"), _COUNTS),
    **dict.fromkeys(("schedule.steps_per_epoch", "schedule.total_steps", "training_config.epochs",
                     "training_config.max_train_steps"), _INT),
    **dict.fromkeys(("data_summary.train.images", "data_summary.train.classes", "data_summary.test.images",
                     "data_summary.test.classes"), _COUNT),
}  # fmt: skip


def check_training_metadata(training: Any, path: str | Path) -> None:
    """Refuse (``ValueError`` naming ``path`` and the key) ``training`` metadata that is not a JSON object, or whose
    :data:`TRAINING_METADATA` keys hold another kind of value (a card written from them would fail half-way)."""
    if not isinstance(training, dict):
        raise ValueError(f"{path}: 'training' must be a JSON object (the training metadata); got "
                         f"{type(training).__name__}")  # fmt: skip
    for key, check in TRAINING_METADATA.items():  # a section before its keys: each section is a dict or null here
        *heads, tail = key.split(".")
        section = training
        for head in heads:
            section = section.get(head) or {}
        if tail in section and not check(value := section[tail]):
            raise ValueError(f"{path}: 'training.{key}' must be {check.expected}; got {shorten(repr(value), 80)}")


def read_config(path: str | Path) -> dict[str, Any]:
    """Parse and validate a ``config.json`` (``ValueError`` naming the file when corrupt, too deeply nested or too
    large, not ours, or with ``training`` metadata a card cannot read: :func:`check_training_metadata`)."""
    config = load_json(path, what="config.json")
    if isinstance(config, dict):
        config = _upgrade_config(config)
    if not isinstance(config, dict) or not isinstance(config.get("model_args"), dict):
        keys = sorted(map(str, config))[:20] if isinstance(config, dict) else type(config).__name__
        raise ValueError(
            f"{path} is not a pml-suprank config: expected a JSON object with a 'model_args' dict; got keys "
            f"{str(keys)[:300]}"
        )
    check_training_metadata({} if config.get("training") is None else config["training"], path)
    return config


def check_metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
    """``metrics`` as a ``{str: float}`` dict (``TypeError`` naming the offending entry)."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict of metric name -> number; got {type(metrics).__name__}")
    out = {}
    for k, v in metrics.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError) as e:
            raise TypeError(f"metrics[{k!r}] must be a number; got {type(v).__name__} {v!r}") from e
    return out


# ---------------------------------------------------------------------------------------------------------- writing
@contextlib.contextmanager
def staged_folder(target: str | Path) -> Iterator[Path]:
    """Yield a new hidden folder beside ``target`` to write a save into.

    On success the staged folder is renamed to ``target`` when that does not exist yet; otherwise each staged file
    replaces its namesake in ``target`` (files of ``target`` that the save does not write are left alone). On an
    exception the staged folder is deleted, with the parent folders created for it, so ``target`` is as it was.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"save_directory must be a folder; got the file {target}")
    created = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    stage.mkdir()  # with the umask's permissions (tempfile.mkdtemp makes 0700 folders)
    try:
        yield stage
        if not target.exists():
            os.replace(stage, target)
        for path in sorted(stage.rglob("*")):
            if path.is_file():
                final = target / path.relative_to(stage)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        for folder in created:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    shutil.rmtree(stage, ignore_errors=True)


def write_weights(path: Path, source: nn.Module | Mapping[str, Tensor], metadata: dict[str, str]) -> None:
    """Write a safetensors file of a module (tied tensors stored once) or of a ``{name: Tensor}`` dict, with the
    umask's permissions (safetensors makes 0600 files)."""
    import safetensors.torch

    path.touch()
    mode = path.stat().st_mode & 0o777
    if isinstance(source, nn.Module):
        safetensors.torch.save_model(source, str(path), metadata=metadata)
    else:
        state = {k: v.detach().cpu().contiguous() for k, v in source.items()}
        safetensors.torch.save_file(state, str(path), metadata=metadata)
    path.chmod(mode)


# ---------------------------------------------------------------------------------------------------------- reading
def read_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Tensors of a safetensors file on ``device`` (``ValueError`` when the file is corrupt or truncated)."""
    import safetensors
    import safetensors.torch

    try:
        return safetensors.torch.load_file(str(path), device=str(device))
    except (safetensors.SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path} is not a readable safetensors file (corrupt or truncated checkpoint): {e}") from e


def sha256_file(path: str | Path) -> str:
    """SHA-256 (hex) of the bytes of the file ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_state(
    state: Mapping[str, Tensor],
    source: str | Path,
    *,
    expected: Mapping[str, Tensor] | None = None,
    allowed: Collection[str] | None = None,
) -> str:
    """Validate the loaded ``{name: Tensor}`` of the file ``source`` before use; return what does not match
    ``expected`` (the tensors the object holds now, e.g. a fresh module's ``state_dict()``): missing and unexpected
    names, shape / dtype-kind mismatches (``""``: nothing; the caller decides whether they are fatal).

    Always raises ``ValueError`` (naming ``source`` and the key) for a non-tensor value, a complex tensor, non-finite
    values where the expected tensor is finite (every floating tensor without ``expected``) and, with ``allowed``, a
    name outside it.
    """
    if allowed is not None:
        check_names(state, source, allowed)
    for name, value in state.items():
        ref = expected.get(name) if expected is not None else None
        check_tensor(name, value, source, finite=ref is None or bool(torch.isfinite(ref).all()))
    if expected is None:
        return ""
    missing = sorted(set(expected) - set(state) - _tied_aliases(expected, set(state)))
    unexpected = sorted(set(state) - set(expected))
    mismatched = []
    for k in sorted(set(state) & set(expected)):
        got, want = state[k], expected[k]
        if got.shape != want.shape:
            mismatched.append(f"{k}: checkpoint {tuple(got.shape)} vs model {tuple(want.shape)}")
        elif kind_of(got) != kind_of(want):
            mismatched.append(f"{k}: checkpoint {got.dtype} vs model {want.dtype}")
    if not (missing or unexpected or mismatched):
        return ""

    def cut(names: list[str], n: int) -> str:
        return f"{names[:n]}{' ...' if len(names) > n else ''} ({len(names)})"

    return f"missing {cut(missing, 20)}, unexpected {cut(unexpected, 20)}, shape mismatches {cut(mismatched, 10)}"


def _tied_aliases(expected: Mapping[str, Any], present: set[str]) -> set[str]:
    """Names of tensors sharing storage with a saved tensor (``safetensors.torch.save_model`` keeps one name)."""
    by_storage: dict[tuple[Any, int], list[str]] = {}
    for name, t in expected.items():
        try:
            key = (t.device, t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # e.g. meta tensors
            continue
        by_storage.setdefault(key, []).append(name)
    return {n for names in by_storage.values() if any(m in present for m in names) for n in names if n not in present}


def check_loaded_values(state: Mapping[str, Tensor], source: str | Path) -> None:
    """Refuse tensors no trained ``RetrievalModel`` holds: an all-zero projection weight, a GeM exponent ``<= 0``,
    a negative BatchNorm running variance (``ValueError`` naming ``source`` and the key). Shapes, dtypes and
    finiteness are checked against the rebuilt module by :func:`check_state`."""
    for name, value in state.items():
        if not isinstance(value, Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        if name == "projection.weight" and not bool((value != 0).any()):
            raise ValueError(f"{source}: tensor {name!r} is all zeros (every embedding would be 0); corrupt file?")
        if name == "pool.gem.p" and not bool((value > 0).all()):
            raise ValueError(f"{source}: tensor {name!r} (the GeM exponent) must be > 0; got {value.tolist()}")
        if name.endswith("running_var") and bool((value.to(torch.float64) < 0).any()):
            raise ValueError(f"{source}: tensor {name!r} (a BatchNorm variance) has negative values; corrupt file?")
