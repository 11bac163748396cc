"""Hugging Face Hub integration: ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` and model cards.

A saved model is a folder (or Hub repo) with

* ``config.json`` — the constructor kwargs (``model_args``, STYLE.md R8) plus what a user of the embedding needs:
  backbone name, embedding size, the data config (``pretrained_cfg``: mean / std / input size / interpolation /
  crop_pct) and training metadata (``training``: loss, label hierarchy names, dataset, hub_config name, ...);
* ``model.safetensors`` — the weights. Pickle checkpoints (``*.bin``, ``*.pt``, ...) are never loaded;
* ``README.md`` — a generated model card: YAML metadata (library_name, tags, datasets, metrics), a results table
  with our numbers beside the paper's (from the hub_config), and the training plots when present;
* optionally ``metrics.json`` and ``plots/*.png``.

Design (spec/ecosystem.md §4): the same contract as huggingface_hub's ``PyTorchModelHubMixin`` (``save_pretrained``,
``from_pretrained(repo_id or folder)`` through ``hf_hub_download`` — hence the local Hub cache and
``HF_HUB_OFFLINE=1`` work — and ``push_to_hub`` = ``HfApi.create_repo`` + ``HfApi.upload_folder``), with three
deliberate differences: loading is strict (missing / unexpected / mis-shaped weights raise a ``ValueError`` listing
them), pickles are refused, and the backbone is always rebuilt with ``pretrained=False`` so restoring never
downloads ImageNet weights.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from .version import __version__

logger = logging.getLogger(__name__)

__all__ = [
    "CONFIG_NAME",
    "LIBRARY_NAME",
    "MODEL_CARD_NAME",
    "WEIGHTS_NAME",
    "build_config",
    "from_pretrained",
    "generate_model_card",
    "load_config",
    "push_folder_to_hub",
    "push_to_hub",
    "save_pretrained",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_CARD_NAME = "README.md"
METRICS_NAME = "metrics.json"
LIBRARY_NAME = "pml-suprank"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
REPO_URL = "https://github.com/pml-suprank/pml-suprank"

_TPAMI = ("Optimization of Rank Losses for Image Retrieval (Ramzi et al., TPAMI)", "https://arxiv.org/abs/2309.08250")
_ECCV = (
    "Hierarchical Average Precision Training for Pertinent Image Retrieval (Ramzi et al., ECCV 2022)",
    "https://arxiv.org/abs/2207.04873",
)
_PAPERS = {"HAPPIER": _ECCV, "HAPPIERLoss": _ECCV, "SupHAPLoss": _ECCV}
_DEFAULT_PAPER = _TPAMI

# display names of the metric keys of pml_suprank.metrics.RetrievalEvaluator
_METRIC_NAMES = {
    "h_ap": "H-AP",
    "ndcg": "NDCG",
    "asi": "ASI",
    "ap": "mAP",
    "map_at_r": "mAP@R",
    "r_precision": "R-precision",
    "sum_w_ap": "ΣwAP",
}
# shown first in the card and listed in its metadata; the other rates follow in a collapsed table
_HEADLINE = ("h_ap", "ndcg", "asi", "ap", "map_at_r", "recall_at_1")
_METRIC_PATTERNS = (
    ("true_recall_at_", "true recall@{}"),
    ("recall_at_", "R@{}"),
    ("precision_at_", "P@{}"),
    ("map_at_", "mAP@{}"),
)


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _jsonable(value: Any, name: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be JSON-serialisable (dicts, lists, str, numbers, bool, None); {e}") from e


def build_config(model: nn.Module, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.json`` content of ``model``.

    Args:
        model: A module with ``get_config()`` returning its JSON-able constructor kwargs (e.g. ``RetrievalModel``),
            and optionally ``data_config``, ``embedding_size``, ``num_features`` and a ``hub_metadata`` dict.
        metadata: Training metadata merged over ``model.hub_metadata``; conventional keys are ``loss`` (e.g.
            ``"HAPPIERLoss"``), ``label_names`` (fine → coarse), ``dataset``, ``hub_config`` and ``loss_kwargs``.

    Returns:
        ``{"architecture", "library_name", "library_version", "model_args", "backbone", "embedding_size",
        "num_features", "num_classes", "pretrained_cfg", "training"}``.
    """
    if not hasattr(model, "get_config"):
        raise TypeError(f"model must provide get_config() (e.g. a RetrievalModel); got {type(model).__name__}")
    model_args = _jsonable(model.get_config(), "model.get_config()")
    training = dict(getattr(model, "hub_metadata", None) or {})
    training.update(metadata or {})
    config: dict[str, Any] = {
        "architecture": type(model).__name__,
        "library_name": LIBRARY_NAME,
        "library_version": __version__,
        "model_args": model_args,
        "backbone": model_args.get("backbone"),
        "embedding_size": getattr(model, "embedding_size", None),
        "num_features": getattr(model, "num_features", None),
        "num_classes": model_args.get("num_classes", 0),
        "training": _jsonable(training, "metadata"),
    }
    data_config = getattr(model, "data_config", None)
    if data_config:
        keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
        config["pretrained_cfg"] = _jsonable({k: data_config[k] for k in keys if k in data_config}, "data_config")
    return config


def save_pretrained(
    model: nn.Module,
    save_directory: str | Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str | Path] | None = None,
    model_card: bool = True,
    repo_id: str | None = None,
) -> Path:
    """Write ``config.json``, ``model.safetensors`` and (by default) ``README.md`` into ``save_directory``.

    Every file is written to a temporary name and renamed, so an interrupted save never leaves a truncated file.

    Args:
        model: The model (``RetrievalModel`` or any module with ``get_config()``).
        save_directory: Output folder, created if needed; existing files other than ours are left alone.
        metadata: Training metadata stored under ``config["training"]`` (see :func:`build_config`).
        metrics: Final test metrics (``RetrievalEvaluator`` keys, values in [0, 1]); written to ``metrics.json``
            and shown in the model card.
        hub_config: The loaded hub_config dict (:func:`pml_suprank.hub_config.load_hub_config`); its ``hub``
            section gives the card's tags, datasets and the paper's numbers.
        plots: Image files to embed in the card; files outside ``save_directory`` are copied to ``plots/``.
            ``*.png`` files already in ``save_directory`` or ``save_directory/plots`` are embedded too.
        model_card: Write the generated ``README.md``.
        repo_id: Repo id used in the card's usage snippet.

    Returns:
        The folder path.
    """
    import safetensors.torch

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    save_directory = Path(save_directory)
    if save_directory.exists() and not save_directory.is_dir():
        raise ValueError(f"save_directory must be a folder; got the file {save_directory}")
    save_directory.mkdir(parents=True, exist_ok=True)
    metrics = _check_metrics(metrics)

    config = build_config(model, metadata)
    if hub_config is not None:
        config["training"].setdefault("hub_config", _hub_config_name(hub_config))

    fd, tmp = tempfile.mkstemp(prefix=f".{WEIGHTS_NAME}.", dir=save_directory)
    os.close(fd)
    try:
        safetensors.torch.save_model(model, tmp, metadata={"format": "pt", "library": LIBRARY_NAME})
        os.replace(tmp, save_directory / WEIGHTS_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _atomic_write_text(save_directory / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
    if metrics:
        _atomic_write_text(save_directory / METRICS_NAME, json.dumps(metrics, indent=2, sort_keys=True) + "\n")

    plot_paths = _collect_plots(save_directory, plots)
    if model_card:
        card = generate_model_card(
            config, metrics=metrics, hub_config=hub_config, plots=plot_paths, repo_id=repo_id or save_directory.name
        )
        _atomic_write_text(save_directory / MODEL_CARD_NAME, card)
    return save_directory


def _hub_config_name(hub_config: Mapping[str, Any]) -> str | None:
    name = hub_config.get("name") if isinstance(hub_config, Mapping) else None
    return str(name) if name is not None else None


def _check_metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
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


def _collect_plots(save_directory: Path, plots: Sequence[str | Path] | None) -> list[str]:
    rel: list[str] = []
    for p in plots or []:
        p = Path(p)
        if not p.is_file():
            raise FileNotFoundError(f"plot file {p} does not exist")
        try:
            rel.append(p.resolve().relative_to(save_directory.resolve()).as_posix())
        except ValueError:
            (save_directory / "plots").mkdir(exist_ok=True)
            shutil.copyfile(p, save_directory / "plots" / p.name)
            rel.append(f"plots/{p.name}")
    for folder in (save_directory, save_directory / "plots"):
        if folder.is_dir():
            for f in sorted(folder.glob("*.png")):
                r = f.relative_to(save_directory).as_posix()
                if r not in rel:
                    rel.append(r)
    return rel


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return f"{float(value):.2f}"
    return str(value)


def _metric_label(key: str, label_names: Sequence[str] | None = None) -> str:
    """Display name of an evaluator key, e.g. ``recall_at_1_level1`` → ``R@1 (coarse_label)``."""
    base, level = key, None
    if "_level" in key:
        head, _, tail = key.rpartition("_level")
        if tail.isdigit():
            base, level = head, int(tail)
    name = _METRIC_NAMES.get(base)
    if name is None and base == "ap":
        name = "AP"
    if name is None:
        for prefix, fmt in _METRIC_PATTERNS:
            if base.startswith(prefix):
                name = fmt.format(base[len(prefix) :])
                break
    name = name or base
    if level is not None:
        if base == "ap":
            name = "AP"
        where = label_names[level] if label_names and level < len(label_names) else f"level {level}"
        name = f"{name} ({where})"
    return name


def generate_model_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str] | None = None,
    repo_id: str | None = None,
) -> str:
    """Model card text (``README.md``) with YAML metadata, a results table and embedded plots.

    Args:
        config: The ``config.json`` dict (:func:`build_config`).
        metrics: Our metrics, values in [0, 1] (shown in percent).
        hub_config: Loaded hub_config; uses ``hub.tags``, ``hub.datasets``, ``hub.license``, ``hub.paper`` and
            ``hub.paper_results`` (percent, keyed like the evaluator's metrics), and ``data.source``.
        plots: Image paths relative to the card's folder.
        repo_id: Repo id shown in the usage snippet.
    """
    from huggingface_hub import ModelCardData

    metrics = _check_metrics(metrics)
    hub = dict((hub_config or {}).get("hub") or {})
    training = dict(config.get("training") or {})
    loss = training.get("loss")
    paper_results = {str(k): v for k, v in (hub.get("paper_results") or {}).items()}

    datasets = list(hub.get("datasets") or [])
    source = ((hub_config or {}).get("data") or {}).get("source") or training.get("dataset")
    if not datasets and isinstance(source, str) and "/" in source and not os.path.isabs(source):
        datasets = [source]
    tags = ["pml-suprank", "image-retrieval", "metric-learning", "pytorch-metric-learning", "timm"]
    for t in [*(hub.get("tags") or []), loss]:
        if t and str(t) not in tags:
            tags.append(str(t))
    counts = {k: v for k, v in metrics.items() if k.startswith("num_")}
    rates = {k: v for k, v in metrics.items() if k not in counts}
    main_keys = [k for k in _HEADLINE if k in rates or k in paper_results]
    main_keys += [k for k in paper_results if k not in main_keys]
    other_keys = [k for k in rates if k not in main_keys]
    metric_keys = main_keys + other_keys
    card_data = ModelCardData(
        library_name=LIBRARY_NAME,
        license=hub.get("license"),
        tags=tags,
        datasets=datasets or None,
        metrics=main_keys or None,
        pipeline_tag="image-feature-extraction",
        model_name=repo_id,
    )
    name = repo_id or str(hub.get("name") or (hub_config or {}).get("name") or "pml-suprank retrieval model")
    args = dict(config.get("model_args") or {})
    pcfg = dict(config.get("pretrained_cfg") or {})
    title, url = _PAPERS.get(str(loss), _DEFAULT_PAPER)
    if hub.get("paper"):
        title, url = str(hub["paper"]), str(hub.get("paper_url") or url)

    lines = [
        "---",
        card_data.to_yaml(),
        "---",
        "",
        f"# {name}",
        "",
        f"An image-retrieval embedding model trained with [pml-suprank]({REPO_URL})"
        + (f" using `{loss}`" if loss else "")
        + (f" on `{source}`" if source else "")
        + ".",
        "",
        "| | |",
        "|---|---|",
        f"| backbone | `{args.get('backbone')}` (timm) |",
        f"| pooling | {args.get('pooling')}{' + LayerNorm (no affine)' if args.get('layer_norm') else ''} |",
        f"| embedding size | {config.get('embedding_size')} (L2-normalised) |",
        f"| input size | {pcfg.get('input_size')} |",
        f"| mean / std | {pcfg.get('mean')} / {pcfg.get('std')} |",
    ]
    if training.get("label_names"):
        lines.append(f"| label hierarchy (fine → coarse) | {', '.join(map(str, training['label_names']))} |")
    if training.get("hub_config"):
        lines.append(f"| hub_config | `{training['hub_config']}` |")
    lines.append("")

    label_names = training.get("label_names")
    if metric_keys:
        lines += [
            "## Results",
            "",
            "Exact metrics over the whole test gallery, in percent (ties ranked pessimistically). The paper column "
            f"reports the published numbers of the corresponding setting ({title}).",
            "",
            "| metric | this model | paper |",
            "|---|---|---|",
        ]
        for k in main_keys:
            ours = 100.0 * rates[k] if k in rates else None
            lines.append(f"| {_metric_label(k, label_names)} | {_fmt(ours)} | {_fmt(paper_results.get(k))} |")
        lines.append("")
        if "num_queries" in counts:
            lines += [f"Evaluated with {int(counts['num_queries'])} queries.", ""]
        if other_keys:
            lines += ["<details><summary>All metrics</summary>", "", "| metric | this model |", "|---|---|"]
            lines += [f"| {_metric_label(k, label_names)} | {_fmt(100.0 * rates[k])} |" for k in other_keys]
            lines += ["", "</details>", ""]
    if plots:
        lines += ["## Plots", ""]
        for p in plots:
            lines += [f"![{Path(p).stem}]({p})", ""]
    lines += [
        "## Usage",
        "",
        "```python",
        "from pml_suprank.models import RetrievalModel",
        "from pml_suprank.data import build_transforms",
        "",
        f'model = RetrievalModel.from_pretrained("{repo_id or "path/to/folder"}")  # never downloads backbone weights',
        "transform = build_transforms(model.data_config, train=False)",
        "embeddings = model(transform(pil_image)[None])  # (1, D), L2-normalised",
        "```",
        "",
        "## Citation",
        "",
        f"{title}: {url}",
        "",
    ]
    return "\n".join(lines)


def load_config(
    pretrained_model_name_or_path: str | Path,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
    force_download: bool = False,
) -> dict[str, Any]:
    """Read and validate ``config.json`` from a folder or a Hub repo id (through the local cache when offline)."""
    path = _resolve_file(
        pretrained_model_name_or_path, CONFIG_NAME, revision, cache_dir, local_files_only, token, force_download
    )
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON (corrupt config.json): {e}") from e
    if not isinstance(config, dict) or not isinstance(config.get("model_args"), dict):
        raise ValueError(
            f"{path} is not a pml-suprank config: expected a JSON object with a 'model_args' dict; "
            f"got keys {sorted(config) if isinstance(config, dict) else type(config).__name__}"
        )
    return config


def _resolve_file(
    name_or_path: str | Path,
    filename: str,
    revision: str | None,
    cache_dir: str | Path | None,
    local_files_only: bool,
    token: str | bool | None,
    force_download: bool,
) -> Path:
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path):
        raise TypeError(f"pretrained_model_name_or_path must be a folder path or a Hub repo id; got {name_or_path!r}")
    local = Path(name_or_path)
    if local.is_dir():
        path = local / filename
        if not path.is_file():
            pickles = sorted(p.name for p in local.iterdir() if p.suffix in PICKLE_SUFFIXES)
            if filename == WEIGHTS_NAME and pickles:
                raise ValueError(
                    f"{local} has no {WEIGHTS_NAME} but pickle checkpoints {pickles}; pml-suprank only loads "
                    "safetensors weights (pickles can execute code). Convert them with safetensors.torch.save_model."
                )
            raise FileNotFoundError(f"{local} has no {filename}; expected a folder written by save_pretrained")
        return path
    repo_id = str(name_or_path)
    if repo_id.count("/") > 1 or repo_id.startswith((".", "/", "~")) or local.exists():
        raise FileNotFoundError(f"{repo_id} is neither an existing folder nor a Hub repo id of the form 'org/name'")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(
            hf_hub_download(
                repo_id=repo_id,
                filename=filename,
                revision=revision,
                cache_dir=cache_dir,
                local_files_only=local_files_only,
                token=token,
                force_download=force_download,
            )
        )
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"{filename} of {repo_id!r} is not in the local Hub cache and downloading is disabled "
            f"(offline mode or local_files_only=True): {e}"
        ) from e
    except EntryNotFoundError as e:
        extra = " (pickle checkpoints are not supported: only safetensors)" if filename == WEIGHTS_NAME else ""
        raise FileNotFoundError(f"Hub repo {repo_id!r} has no {filename}{extra}") from e
    except HFValidationError as e:
        raise ValueError(f"{repo_id!r} is neither an existing folder nor a valid Hub repo id: {e}") from e
    except RepositoryNotFoundError as e:
        raise FileNotFoundError(f"Hub repo {repo_id!r} does not exist or is private: {e}") from e


def from_pretrained(
    pretrained_model_name_or_path: str | Path,
    *,
    model_class: type[nn.Module] | None = None,
    map_location: str = "cpu",
    strict: bool = True,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
    force_download: bool = False,
    **model_kwargs: Any,
) -> nn.Module:
    """Restore a model saved by :func:`save_pretrained` from a folder or a Hub repo id.

    Repo ids go through ``huggingface_hub.hf_hub_download``: with ``HF_HUB_OFFLINE=1`` (or ``local_files_only``)
    they are read from the local Hub cache. The backbone is rebuilt with ``pretrained=False``.

    Args:
        pretrained_model_name_or_path: Folder path or ``"org/name"``.
        model_class: Class to instantiate (default :class:`pml_suprank.models.RetrievalModel`); must match the
            saved ``architecture``.
        map_location: Device of the loaded weights.
        strict: Raise ``ValueError`` on missing, unexpected or mis-shaped weights (default); otherwise log them.
        revision, cache_dir, local_files_only, token, force_download: Passed to ``hf_hub_download``.
        **model_kwargs: Constructor kwargs overriding the saved ones (``pretrained`` is always False).

    Returns:
        The model in eval mode, with ``model.hub_metadata`` set to the saved training metadata.
    """
    import safetensors
    import safetensors.torch

    if model_class is None:
        from .models import RetrievalModel

        model_class = RetrievalModel
    hub_kwargs = dict(revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token)
    config = load_config(pretrained_model_name_or_path, force_download=force_download, **hub_kwargs)
    arch = config.get("architecture")
    if arch is not None and arch != model_class.__name__:
        raise ValueError(
            f"{pretrained_model_name_or_path} holds a {arch!r}; it cannot be loaded as {model_class.__name__}"
        )
    weights = _resolve_file(
        pretrained_model_name_or_path, WEIGHTS_NAME, revision, cache_dir, local_files_only, token, force_download
    )
    kwargs = {**config["model_args"], **model_kwargs, "pretrained": False}
    import inspect

    params = inspect.signature(model_class.__init__).parameters
    if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ValueError(
                f"config.json of {pretrained_model_name_or_path} has model_args {unknown} that "
                f"{model_class.__name__} does not accept (saved by a newer pml-suprank?)"
            )
    model = model_class(**kwargs)

    try:
        state = safetensors.torch.load_file(str(weights), device=map_location)
    except (safetensors.SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{weights} is not a readable safetensors file (corrupt or truncated checkpoint): {e}") from e
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state) - _tied_aliases(expected, set(state)))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(state) & set(expected)
        if state[k].shape != expected[k].shape
    )
    if missing or unexpected or mismatched:
        msg = (
            f"weights in {weights} do not match {model_class.__name__}({config['model_args'].get('backbone')!r}): "
            f"missing {missing[:20]}{' ...' if len(missing) > 20 else ''} ({len(missing)}), "
            f"unexpected {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''} ({len(unexpected)}), "
            f"shape mismatches {mismatched[:10]} ({len(mismatched)})"
        )
        if strict:
            raise ValueError(msg)
        logger.warning(msg)
        state = {k: v for k, v in state.items() if k in expected and v.shape == expected[k].shape}
    # every key is accounted for above; tied weights saved once by safetensors load through their saved alias
    model.load_state_dict(state, strict=False)
    model.to(map_location)
    if hasattr(model, "hub_metadata"):
        model.hub_metadata = dict(config.get("training") or {})
    model.eval()
    return model


def _tied_aliases(expected: Mapping[str, Any], present: set[str]) -> set[str]:
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


def push_to_hub(
    model: nn.Module,
    repo_id: str,
    *,
    save_directory: str | Path | None = None,
    commit_message: str = "Upload pml-suprank model",
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    **save_kwargs: Any,
) -> Any:
    """Save ``model`` (see :func:`save_pretrained`) and upload the folder to the Hub repo ``repo_id``.

    Args:
        model: The model.
        repo_id: ``"org/name"``.
        save_directory: Where to write the files before uploading; they stay there whatever happens. Without it a
            temporary folder is used, removed after a successful upload and kept (its path is in the error) when
            the upload fails.
        commit_message, private, token, revision, create_pr: Passed to ``HfApi.create_repo`` / ``upload_folder``.
        **save_kwargs: ``metadata``, ``metrics``, ``hub_config``, ``plots`` for :func:`save_pretrained`.

    Returns:
        The ``CommitInfo`` of ``HfApi.upload_folder``.
    """
    _check_repo_id(repo_id)
    keep = save_directory is not None
    folder = Path(save_directory) if keep else Path(tempfile.mkdtemp(prefix="pml_suprank_push_"))
    save_pretrained(model, folder, repo_id=repo_id, **save_kwargs)
    result = push_folder_to_hub(
        folder,
        repo_id,
        commit_message=commit_message,
        private=private,
        token=token,
        revision=revision,
        create_pr=create_pr,
    )
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def push_folder_to_hub(
    folder: str | Path,
    repo_id: str,
    *,
    commit_message: str = "Upload pml-suprank model",
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    ignore_patterns: Sequence[str] | None = None,
) -> Any:
    """Upload an already written model folder (e.g. a recipe's output: weights, config, card, metrics, plots).

    The folder must hold ``config.json`` and ``model.safetensors``; pickles, checkpoints and hidden files are not
    uploaded. The folder is never modified: if the upload fails, a ``RuntimeError`` says where the files are.
    """
    from huggingface_hub import HfApi

    _check_repo_id(repo_id)
    folder = Path(folder)
    for required in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / required).is_file():
            raise FileNotFoundError(f"{folder} has no {required}; write it with save_pretrained before pushing")
    ignore = [*(f"*{s}" for s in PICKLE_SUFFIXES), ".*", "checkpoint*/**", "checkpoints/**", *(ignore_patterns or [])]
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id=repo_id, private=private, exist_ok=True)
        target = getattr(url, "repo_id", None) or repo_id
        return api.upload_folder(
            repo_id=target,
            repo_type="model",
            folder_path=str(folder),
            commit_message=commit_message,
            revision=revision,
            create_pr=create_pr,
            ignore_patterns=ignore,
        )
    except Exception as e:
        raise RuntimeError(
            f"pushing {folder} to the Hub repo {repo_id!r} failed ({type(e).__name__}: {e}); "
            f"the local files are kept in {folder.resolve()}"
        ) from e


def _check_repo_id(repo_id: Any) -> str:
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo_id must look like 'org/name'; got {repo_id!r}")
    return repo_id
