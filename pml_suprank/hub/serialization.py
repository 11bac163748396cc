"""On-disk format of a saved model or detector: ``config.json`` + ``model.safetensors``, written atomically.

A saved folder holds

* ``config.json`` — one layout for every saved object: ``architecture`` (the class name), ``library_name``,
  ``library_version``, ``task``, ``model_args`` (the JSON-able constructor kwargs, so the object is rebuilt by calling
  its class with them) and ``training`` (free-form metadata: loss, label names, dataset, ...), plus keys specific to
  the object (e.g. ``embedding_size`` and ``pretrained_cfg`` of a retrieval model, ``fitted`` of a detector);
* ``model.safetensors`` — the tensors. Only safetensors and JSON are ever read: nothing is unpickled;
* optionally ``metrics.json``, ``README.md`` (the model card) and ``plots/*.png``.

Every file is written to a hidden temporary name in the target folder and renamed into place only once all of them
were written (:class:`AtomicFolderWriter`), so a failed save never leaves a truncated or half-updated folder.
Loaded tensors are validated against what the object expects (names, shapes, dtype kinds, finite values) before any
of them is used.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._safe_json import MAX_JSON_BYTES, MAX_JSON_DEPTH, json_depth
from .._safe_json import loads_json as loads_bounded
from ..version import __version__

__all__ = [
    "CONFIG_NAME",
    "DETECTOR_TASK",
    "LIBRARY_NAME",
    "METRICS_NAME",
    "MODEL_CARD_NAME",
    "PICKLE_SUFFIXES",
    "RETRIEVAL_TASK",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "WEIGHTS_NAME",
    "AtomicFolderWriter",
    "StateReport",
    "check_metrics",
    "check_state",
    "json_depth",
    "jsonable",
    "loads_bounded",
    "make_config",
    "read_config",
    "read_weights",
    "tied_aliases",
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


def read_config(path: str | Path) -> dict[str, Any]:
    """Parse and validate a ``config.json`` (``ValueError`` naming the file when corrupt, too deeply nested or too
    large, or not ours)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (corrupt config.json): {str(e)[:200]}") from e
    config = loads_bounded(text, path, what="config.json")
    if isinstance(config, dict):
        config = _upgrade_config(config)
    if not isinstance(config, dict) or not isinstance(config.get("model_args"), dict):
        keys = sorted(map(str, config))[:20] if isinstance(config, dict) else type(config).__name__
        raise ValueError(
            f"{path} is not a pml-suprank config: expected a JSON object with a 'model_args' dict; got keys "
            f"{str(keys)[:300]}"
        )
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
class AtomicFolderWriter:
    """Stage files as hidden temporaries inside ``directory`` and rename them into place together on success.

    Use as a context manager; on an exception every staged temporary is deleted, and folders the writer created are
    removed again when they are left empty, so the folder is either fully updated or untouched::

        with AtomicFolderWriter(folder) as w:
            w.write_text("config.json", text)
            w.write_weights("model.safetensors", module_or_state)
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._staged: list[tuple[Path, Path]] = []
        self._created: list[Path] = []

    def __enter__(self) -> AtomicFolderWriter:
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"save_directory must be a folder; got the file {self.directory}")
        self._mkdir(self.directory)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            for tmp, final in self._staged:
                os.replace(tmp, final)
            return
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        for folder in reversed(self._created):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    def _mkdir(self, folder: Path) -> None:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        self._created.extend(reversed(missing))

    def _stage(self, name: str) -> Path:
        final = self.directory / name
        self._mkdir(final.parent)
        while True:  # like tempfile.mkstemp, but with the umask's permissions (mkstemp makes 0600 files)
            tmp = final.parent / f".{final.name}.{secrets.token_hex(6)}.tmp"
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                break
            except FileExistsError:
                continue
        self._staged.append((tmp, final))
        return tmp

    def write_text(self, name: str, text: str) -> None:
        """Stage ``text`` (UTF-8) as ``directory/name``."""
        self._stage(name).write_text(text, encoding="utf-8")

    def write_json(self, name: str, value: Any) -> None:
        """Stage ``value`` as indented, key-sorted JSON."""
        self.write_text(name, json.dumps(value, indent=2, sort_keys=True) + "\n")

    def copy_file(self, source: str | Path, name: str) -> None:
        """Stage a copy of the file ``source`` as ``directory/name``."""
        shutil.copyfile(source, self._stage(name))

    def write_weights(self, name: str, source: nn.Module | Mapping[str, Tensor], metadata: dict[str, str]) -> None:
        """Stage a safetensors file of a module (tied tensors stored once) or of a ``{name: Tensor}`` dict."""
        import safetensors.torch

        tmp = self._stage(name)
        mode = tmp.stat().st_mode & 0o777  # safetensors re-creates the file as 0600: keep the umask's permissions
        if isinstance(source, nn.Module):
            safetensors.torch.save_model(source, str(tmp), metadata=metadata)
        else:
            state = {k: v.detach().cpu().contiguous() for k, v in source.items()}
            safetensors.torch.save_file(state, str(tmp), metadata=metadata)
        tmp.chmod(mode)


# ---------------------------------------------------------------------------------------------------------- reading
def read_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Tensors of a safetensors file on ``device`` (``ValueError`` when the file is corrupt or truncated)."""
    import safetensors
    import safetensors.torch

    try:
        return safetensors.torch.load_file(str(path), device=str(device))
    except (safetensors.SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path} is not a readable safetensors file (corrupt or truncated checkpoint): {e}") from e


class StateReport:
    """What :func:`check_state` found: ``missing`` / ``unexpected`` names and ``mismatched`` shapes or dtypes."""

    def __init__(self, missing: list[str], unexpected: list[str], mismatched: list[str]) -> None:
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        def cut(names: list[str], n: int) -> str:
            return f"{names[:n]}{' ...' if len(names) > n else ''} ({len(names)})"

        return (
            f"missing {cut(self.missing, 20)}, unexpected {cut(self.unexpected, 20)}, "
            f"shape mismatches {cut(self.mismatched, 10)}"
        )


def _kind(t: Tensor) -> str:
    if t.is_floating_point() or t.is_complex():
        return "floating"
    return "bool" if t.dtype == torch.bool else "integer"


def check_state(
    state: Mapping[str, Tensor],
    source: str | Path,
    *,
    expected: Mapping[str, Tensor] | None = None,
    allowed: Collection[str] | None = None,
) -> StateReport:
    """Validate loaded tensors before they are used.

    Always raises ``ValueError`` for a non-tensor value, a complex tensor, or non-finite values where the expected
    tensor is finite (every floating tensor when ``expected`` is not given). With ``allowed``, names outside it are
    an error. With ``expected`` (e.g. a freshly built module's ``state_dict()``), the returned report lists missing
    and unexpected names and shape / dtype-kind mismatches; the caller decides whether they are fatal.

    Args:
        state: The loaded ``{name: Tensor}``.
        source: The file the state came from (named in the errors).
        expected: The tensors the object holds now, by name.
        allowed: The only names the object accepts.
    """
    for name, value in state.items():
        if not isinstance(value, Tensor) or value.is_complex():
            raise ValueError(f"{source}: tensor {name!r} must be a real or integer tensor; got {type(value).__name__}")
    if allowed is not None:
        unknown = sorted(set(state) - set(allowed))
        if unknown:
            raise ValueError(f"{source} holds tensors {unknown} that are not part of the state {sorted(allowed)}")
    for name, value in state.items():
        ref = expected.get(name) if expected is not None else None
        must_be_finite = ref is None or (ref.is_floating_point() and bool(torch.isfinite(ref).all()))
        if value.is_floating_point() and must_be_finite and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{source}: tensor {name!r} holds NaN or infinite values (corrupt checkpoint?)")
    if expected is None:
        return StateReport([], [], [])
    missing = sorted(set(expected) - set(state) - tied_aliases(expected, set(state)))
    unexpected = sorted(set(state) - set(expected))
    mismatched = []
    for k in sorted(set(state) & set(expected)):
        got, want = state[k], expected[k]
        if got.shape != want.shape:
            mismatched.append(f"{k}: checkpoint {tuple(got.shape)} vs model {tuple(want.shape)}")
        elif _kind(got) != _kind(want):
            mismatched.append(f"{k}: checkpoint {got.dtype} vs model {want.dtype}")
    return StateReport(missing, unexpected, mismatched)


def tied_aliases(expected: Mapping[str, Any], present: set[str]) -> set[str]:
    """Names of tensors sharing storage with a saved tensor (``safetensors.torch.save_model`` keeps one name)."""
    by_storage: dict[tuple[Any, int], list[str]] = {}
    for name, t in expected.items():
        try:
            key = (t.device, t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # e.g. meta tensors
            continue
        by_storage.setdefault(key, []).append(name)
    aliases: set[str] = set()
    for names in by_storage.values():
        if len(names) > 1 and any(n in present for n in names):
            aliases.update(n for n in names if n not in present)
    return aliases
