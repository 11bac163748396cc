"""hub_configs: one YAML file per published setting (paper hyper-parameters, dataset, Hub metadata, paper numbers).

A hub_config is plain YAML with the sections below. Every key of the option sections is a field of the option
dataclasses of :mod:`pml_suprank.training` (``TrainingConfig``, ``ModelOptions``, ``DataOptions``, ``LossOptions``,
``RunOptions``) and the name of a recipe option (``recipes/train_happier.py --help``, ``loss.name`` is ``--loss``), so
``--config file.yaml`` simply sets the recipe's defaults; ``name``, ``description``, ``notes`` and the whole ``hub``
section are metadata (model card, bookkeeping). :data:`HUB_CONFIG_SCHEMA` is derived from those dataclasses, and a
file is validated by building the real objects (``TrainingConfig``, the loss; the backbone name is checked against
timm without building the network).

Files can be partial: ``load_hub_config(path, partial=True)`` accepts a file with only the keys it changes, and
:func:`merge_hub_configs` lays such files over a base (the recipes' ``--config base.yaml --config override.yaml``).

Schema (``*`` = required in a complete file; types in brackets; defaults are the recipes'):

``name``\\* [str]
    Identifier; must equal the file name without ``.yaml``.
``description`` [str], ``notes`` [str | list of str]
    Free text (deviations from the reference, where the numbers come from, ...).
``model``\\*
    ``backbone``\\* [timm name], ``pretrained`` [bool], ``pooling`` [avg | gem | max], ``embedding_size`` [int],
    ``layer_norm`` [bool], ``freeze_batch_norm`` [bool], ``backbone_kwargs`` [mapping].
``data``\\*
    ``dataset``\\* [``"synthetic"``, ``"synthetic_multilabel"`` (several shapes per image; HAPPIER, no memory), a
    benchmark name of :data:`pml_suprank.data.benchmarks.BENCHMARKS` (``sop``,
    ``cub``, ``inat_base``, ``dyml_vehicle``, ``gldv2_hier``, ...: read from its archive under ``data_root``, usually
    given on the command line as ``--data_root``), a Hub dataset id, or a local folder / parquet path (e.g. a copy
    written by ``recipes/prepare_dataset.py``)], ``data_root`` [str, benchmarks only], ``label_columns`` [list of
    str, fine → coarse; required unless synthetic; optional for a benchmark, where it must equal the benchmark's
    label names], ``train_split`` / ``test_split`` [str, ``"a+b"`` concatenates; default ``train`` / ``test``, or
    the benchmark's own training / test split],
    ``image_size`` [int], ``crop_scale`` [two floats], ``num_per_class`` [int, SyntheticShapes],
    ``open_set`` [bool: train/test fine classes must be disjoint], ``train_classes_per_coarse`` [int] or
    ``train_class_fraction`` [float] (the open-set class partition, see :func:`pml_suprank.data.open_set_classes`).
``loss``\\*
    ``name``\\* [HAPPIER | ROADMAP | ROD-NDCG], ``decomposability`` [calibration | proxy, ROADMAP only],
    ``decomposability_weight`` [λ], ``alpha`` [H-AP relevance exponent, HAPPIER only], ``tau``, ``rho``, ``delta``,
    ``start``, ``offset`` [SupRank H⁻ parameters; ``offset: null`` = the continuous σ(δ/τ) + start].
``optimizer``
    ``optimizer`` [adam | adamw | sgd], ``lr_backbone``, ``lr_head``, ``lr_proxies``, ``weight_decay``,
    ``proxies_weight_decay``, ``momentum``.
``scheduler``
    ``scheduler`` [cosine | constant], ``min_lr_ratio`` [final lr as a fraction of the initial one].
``sampler_options``
    ``sampler`` [m_per_class | hierarchical], ``batch_size``, ``samples_per_class``, ``batches_per_super_tuple``,
    ``super_classes_per_batch``.
``memory``
    ``memory_size`` [int, 0 = none], ``memory_warmup_steps`` [int].
``training``
    ``epochs``, ``warmup_epochs`` [backbone frozen], ``seed``, ``grad_clip``, ``mixed_precision`` [no | fp16 | bf16],
    ``max_train_steps``, ``checkpoint_every``, ``keep_checkpoints``, ``num_workers``, ``log_every``.
``evaluation``
    ``k_values`` [list of int], ``eval_every`` [epochs, 0 = end], ``eval_batch_size``.
``hub``
    ``tags`` [list of str], ``license`` [str], ``datasets`` [list of Hub dataset ids for the card], ``paper`` [str],
    ``paper_url`` [str], ``paper_table`` [str], ``paper_results`` [metric key → number in percent, keys as the
    evaluator's: ``recall_at_1``, ``map_at_r``, ``ap``, ``h_ap``, ``asi``, ``ndcg``, ``ap_level{h}`` ...; empty when
    no number was published for the setting].

Example:
    >>> cfg = load_hub_config("hub_configs/happier_sop.yaml")  # doctest: +SKIP
    >>> model = RetrievalModel(**model_kwargs(cfg))             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .data.benchmarks.registry import BENCHMARKS, BenchmarkSpec, benchmark_label_names
from .training.config import OptionCheck, TrainingConfig, is_number, is_str, list_of
from .training.options import LOSS_CLASSES, OPTION_CLASSES, option_fields
from .training.options import build_loss as _build_loss_by_name

__all__ = [
    "HUB_CONFIG_SCHEMA",
    "LOSS_CLASSES",
    "build_dataset",
    "build_loss",
    "data_option_errors",
    "dataset_kwargs",
    "flat_options",
    "load_hub_config",
    "loss_kwargs",
    "merge_hub_configs",
    "multilabel_option_errors",
    "model_kwargs",
    "nest_options",
    "recipe_options",
    "resolved_split",
    "validate_hub_config",
]


# the built-in datasets (pml_suprank.data.synthetic_dataset) and the losses with a multi-label variant
SYNTHETIC_NAMES = ("synthetic", "synthetic_multilabel")
MULTILABEL_LOSSES = ("HAPPIER",)


def _results(v: Any) -> bool:
    return isinstance(v, Mapping) and all(is_str()(k) and is_number(0.0, high=100.0)(x) for k, x in v.items())


_HUB_SECTION: dict[str, OptionCheck] = {
    "tags": list_of(is_str(), "a list of strings", min_len=0),
    "license": is_str("a license id such as mit"),
    "datasets": list_of(is_str(), "a list of Hub dataset ids", min_len=0),
    "paper": is_str("the paper title"),
    "paper_url": is_str("a URL"),
    "paper_table": is_str("where the paper numbers come from"),
    "paper_results": OptionCheck(_results, "a mapping metric key -> number in [0, 100] (percent)"),
}


def _option_locations() -> dict[tuple[str, str], tuple[type, str]]:
    """``(section, key)`` of every file option → ``(option class, field name)``."""
    out = {}
    for cls, f in option_fields(*OPTION_CLASSES):
        if f.metadata.get("section") is not None:
            out[(f.metadata["section"], f.metadata["key"] or f.name)] = (cls, f.name)
    return out


_LOCATIONS = _option_locations()
_SECTIONS = ("model", "data", "loss", "optimizer", "scheduler", "sampler_options", "memory", "training", "evaluation")


def _derive_schema() -> dict[str, dict[str, tuple[Any, str]]]:
    schema: dict[str, dict[str, tuple[Any, str]]] = {s: {} for s in _SECTIONS}
    checks = {f.name: f.metadata["check"] for _, f in option_fields(*OPTION_CLASSES)}
    for (section, key), (_, name) in _LOCATIONS.items():
        schema[section][key] = (checks[name], checks[name].expected)
    schema["hub"] = {k: (c, c.expected) for k, c in _HUB_SECTION.items()}
    return schema


#: ``{section: {key: (check, expectation)}}``, derived from the option dataclasses (``hub``: model-card metadata)
HUB_CONFIG_SCHEMA: dict[str, dict[str, tuple[Any, str]]] = _derive_schema()
_REQUIRED = {"model": ("backbone",), "data": ("dataset",), "loss": ("name",)}
_TOP_LEVEL = {
    "name": is_str(),
    "description": is_str(),
    "notes": OptionCheck(lambda v: is_str()(v) or list_of(is_str(), "")(v), "a string or a list of strings"),
}


def validate_hub_config(
    config: Any, source: str = "hub_config", *, partial: bool = False, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Check ``config`` against :data:`HUB_CONFIG_SCHEMA` and by building its objects; return it unchanged (a plain
    dict) or raise ``ValueError``.

    Every error names the file, the key, what was expected and what was found; unknown sections and keys are
    errors (a typo must not be silently ignored). ``partial=True`` accepts an override file without the required
    keys (``name``, ``model.backbone``, ``data.dataset``, ``loss.name``). ``defaults`` (option name → value, e.g. a
    recipe's defaults) fill the options the file leaves out when the objects are built; default: the dataclass
    defaults.
    """
    if not isinstance(config, dict):
        raise ValueError(f"{source}: a hub_config must be a YAML mapping; got {type(config).__name__}")
    errors = _schema_errors(config)
    if not partial:
        if "name" not in config:
            errors.append("missing required key 'name'")
        for section, keys in _REQUIRED.items():
            for k in keys:
                if not isinstance(config.get(section), dict) or k not in config[section]:
                    errors.append(f"missing required key '{section}.{k}'")
    if not errors:
        errors += data_option_errors(config.get("data") or {}) + _build_errors(config, defaults or {})
        options = {**(defaults or {}), **recipe_options(config)}
        errors += multilabel_option_errors(
            options.get("dataset"), options.get("loss"), options.get("memory_size"), options.get("sampler")
        )
    if errors:
        raise ValueError(f"{source}: invalid hub_config:\n  - " + "\n  - ".join(errors))
    return config


def _schema_errors(config: dict[str, Any]) -> list[str]:
    errors = []
    for key, value in config.items():
        if key in _TOP_LEVEL:
            if not _TOP_LEVEL[key](value):
                errors.append(f"'{key}' has an invalid value {value!r}")
        elif key in HUB_CONFIG_SCHEMA:
            if not isinstance(value, dict):
                errors.append(f"section '{key}' must be a mapping; got {type(value).__name__}")
                continue
            allowed = HUB_CONFIG_SCHEMA[key]
            for sub, v in value.items():
                if sub not in allowed:
                    errors.append(f"unknown key '{key}.{sub}' (valid keys of '{key}': {sorted(allowed)})")
                elif not allowed[sub][0](v):
                    errors.append(f"'{key}.{sub}' must be {allowed[sub][1]}; got {v!r}")
        else:
            errors.append(f"unknown top-level key '{key}' (valid: {sorted([*_TOP_LEVEL, *HUB_CONFIG_SCHEMA])})")
    return errors


def _benchmark(dataset: Any) -> BenchmarkSpec | None:
    return BENCHMARKS.get(dataset) if isinstance(dataset, str) else None


def data_option_errors(data: Mapping[str, Any], *, require_root: bool = False) -> list[str]:
    """The problems of a ``data`` section (or of the recipes' data options nested by :func:`nest_options`), as
    messages naming the keys; ``[]`` when it is consistent.

    Checks the label columns (required for a Hub / local dataset, forbidden for the synthetic one, equal to the
    benchmark's label names when given for a benchmark), the splits of a benchmark, the open-set rules, and refuses
    ``synthetic_multilabel`` under any loss but HAPPIER or with a memory (:func:`multilabel_option_errors`).
    ``require_root=True`` also requires ``data_root`` for a benchmark (a complete run; a shipped file leaves it to
    the command line).
    """
    errors = []
    dataset = data.get("dataset")
    spec = _benchmark(dataset)
    if spec is not None:
        errors += _benchmark_errors(spec, data, require_root)
    elif dataset is not None and dataset not in SYNTHETIC_NAMES and "label_columns" not in data:
        errors.append("'data.label_columns' is required unless data.dataset is 'synthetic' or a benchmark name")
    if spec is None and "data_root" in data:
        errors.append(f"'data.data_root' is for a benchmark dataset ({', '.join(BENCHMARKS)}); got dataset {dataset!r}")
    if dataset in SYNTHETIC_NAMES and "label_columns" in data:
        errors.append(f"'data.label_columns' must not be set for the built-in dataset {dataset} (it has its own)")
    rules = [k for k in ("train_classes_per_coarse", "train_class_fraction") if k in data]
    if len(rules) > 1:
        errors.append(f"'data' sets both {rules}; give one open-set rule")
    if rules and not data.get("open_set", False):
        errors.append(f"'data.{rules[0]}' needs 'data.open_set: true'")
    if rules and dataset in SYNTHETIC_NAMES:
        errors.append("the synthetic dataset has its own open-set split; drop the open-set rule")
    if rules and spec is not None:
        errors.append(f"benchmark {dataset} has its own train / test splits; drop 'data.{rules[0]}'")
    if "train_classes_per_coarse" in data and len(data.get("label_columns", [])) < 2:
        errors.append("'data.train_classes_per_coarse' needs at least two label_columns (fine and coarse)")
    return errors


def multilabel_option_errors(dataset: Any, loss: Any, memory_size: Any, sampler: Any = None) -> list[str]:
    """The problems of training the multi-label ``synthetic_multilabel`` dataset with ``loss``, a memory of
    ``memory_size`` and the batch ``sampler`` option, as messages naming the options; ``[]`` for any other dataset or
    a supported setting.

    Only HAPPIER has a multi-label variant (``relevance="multilabel"``: the thesis' Algorithm 1 relevance);
    ROADMAP and ROD-NDCG have none yet, the cross-batch memory does not store label sets yet, and the batches are
    drawn by :class:`pml_suprank.samplers.MultiLabelSampler` (``sampler`` must keep its default ``m_per_class``).
    """
    if dataset != "synthetic_multilabel":
        return []
    errors = []
    if loss is not None and loss not in MULTILABEL_LOSSES:
        errors.append(
            f"'loss' {loss} has no multi-label variant: dataset synthetic_multilabel (several labels per image) "
            f"trains with {' or '.join(MULTILABEL_LOSSES)} only"
        )
    if memory_size:
        errors.append(
            f"'memory_size' {memory_size}: the memory does not store multi-label label sets yet; "
            "use memory_size 0 with dataset synthetic_multilabel"
        )
    if sampler not in (None, "m_per_class"):
        errors.append(
            f"'sampler' {sampler}: dataset synthetic_multilabel is sampled by MultiLabelSampler (m items per label); "
            "keep sampler m_per_class"
        )
    return errors


def _benchmark_errors(spec: BenchmarkSpec, data: Mapping[str, Any], require_root: bool) -> list[str]:
    errors = []
    for part in ("train", "test"):
        split = data.get(f"{part}_split")
        if split is not None and split not in spec.splits:
            errors.append(
                f"'data.{part}_split' must be a split of benchmark {spec.name} {list(spec.splits)}; got {split!r}"
            )
    if data.get("test_split") is None and spec.test_split is None:
        errors.append(
            f"benchmark {spec.name} has no single test split (it is evaluated per query / gallery pair by "
            f"recipes/evaluate.py --benchmark {spec.name}); set 'data.test_split' to one of {list(spec.splits)}"
        )
    train_split = data.get("train_split") or spec.train_split
    if "label_columns" in data and train_split in spec.splits:
        names = list(benchmark_label_names(spec.name, train_split))
        if list(data["label_columns"]) != names:
            errors.append(
                f"'data.label_columns' {list(data['label_columns'])} does not match the label names {names} of "
                f"benchmark {spec.name} (split {train_split!r}); drop label_columns or give exactly these"
            )
    if require_root and not data.get("data_root"):
        errors.append(
            f"benchmark {spec.name} is read from its archive: give its folder with --data_root (data.data_root); "
            f"expected layout: {spec.layout}"
        )
    return errors


def _build_errors(config: dict[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """Build what the file describes: the backbone name (checked against timm), the loss, the TrainingConfig."""
    from .models import check_backbone_name

    errors = []
    options = recipe_options(config)
    if "backbone" in options:
        try:
            check_backbone_name(options["backbone"])
        except (ValueError, TypeError) as e:
            errors.append(f"'model.backbone': {e}")
    name = options.get("loss")
    if name is not None:
        accepted = LOSS_CLASSES[name][1]
        for k in config.get("loss") or {}:
            if k != "name" and k not in accepted:
                errors.append(f"'loss.{k}' does not apply to loss {name} (valid: {list(accepted)})")
        if not errors:
            values = {**defaults, **options}
            try:
                _build_loss_by_name(name, values, num_classes=2, embedding_size=values.get("embedding_size") or 8)
            except (ValueError, TypeError) as e:
                errors.append(f"'loss': {e}")
    training = {k: v for k, v in {**defaults, **options}.items() if _owner(k) is TrainingConfig}
    try:
        TrainingConfig.from_dict(training)
    except (ValueError, TypeError) as e:
        errors.append(f"training options: {e}")
    return errors


def _owner(name: str) -> type | None:
    for cls, field_name in _LOCATIONS.values():
        if field_name == name:
            return cls
    return None


def merge_hub_configs(*configs: Mapping[str, Any]) -> dict[str, Any]:
    """Lay ``configs`` over each other in order: later sections' keys replace earlier ones, top-level values
    (``name``, ``notes``...) are replaced whole. Returns a new dict; the inputs are not modified."""
    out: dict[str, Any] = {}
    for cfg in configs:
        for key, value in cfg.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = {**out[key], **value}
            else:
                out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def load_hub_config(
    path: str | Path, *, partial: bool = False, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Read and validate a hub_config YAML file (see the module docstring for the schema).

    Args:
        path: The YAML file, or a bare name looked up as ``hub_configs/<name>.yaml`` from the working directory.
        partial: Accept an override file with only the keys it changes (no required key; ``name``, when given,
            must still equal the file name).
        defaults: Values of the options the file leaves out, used to build its objects (see
            :func:`validate_hub_config`).

    Returns:
        The configuration as a plain nested dict.
    """
    import yaml

    p = Path(path)
    if not p.is_file() and p.suffix == "" and (Path("hub_configs") / f"{path}.yaml").is_file():
        p = Path("hub_configs") / f"{path}.yaml"
    if not p.is_file():
        raise FileNotFoundError(f"hub_config {str(path)!r} does not exist")
    try:
        config = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML: {e}") from e
    validate_hub_config(config, source=str(p), partial=partial, defaults=defaults)
    if (not partial or "name" in config) and config["name"] != p.stem:
        raise ValueError(f"{p}: 'name' must equal the file name without .yaml ({p.stem!r}); got {config['name']!r}")
    return config


def recipe_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The option sections as ``{option name: value}`` (the recipes' argparse destinations; ``loss.name`` →
    ``loss``); the metadata (``name``, ``hub``...) is dropped."""
    out: dict[str, Any] = {}
    for section in _SECTIONS:
        for k, v in (config.get(section) or {}).items():
            if (section, k) in _LOCATIONS:
                out[_LOCATIONS[(section, k)][1]] = v
    return out


def flat_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The option sections flattened to ``{recipe option: value}`` (metadata — ``hub``, ``loss.name`` — dropped)."""
    out = recipe_options(config)
    out.pop("loss", None)
    return out


def nest_options(values: Mapping[str, Any], *, drop_none: bool = True) -> dict[str, Any]:
    """The inverse of :func:`recipe_options`: option values (e.g. ``vars(args)``) as hub_config sections; names
    that are no file option are ignored, and so are ``None`` values with ``drop_none``."""
    where = {name: (section, key) for (section, key), (_, name) in _LOCATIONS.items()}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in where and not (drop_none and value is None):
            section, key = where[name]
            out.setdefault(section, {})[key] = list(value) if isinstance(value, tuple) else value
    return out


def model_kwargs(config: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """Constructor kwargs of :class:`pml_suprank.models.RetrievalModel` for this setting."""
    model = dict(config.get("model") or {})
    keys = ("backbone", "pretrained", "pooling", "embedding_size", "layer_norm", "backbone_kwargs", "projection_init")
    kwargs = {k: model[k] for k in keys if k in model}
    kwargs.update({k: model[k] for k in ("crop_pct", "crop_mode") if model.get(k) is not None})
    image_size = (config.get("data") or {}).get("image_size")
    if image_size is not None:
        kwargs["image_size"] = image_size
    kwargs.update(overrides)
    return kwargs


def loss_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of the setting's loss (without ``num_classes`` / ``embedding_size``)."""
    return {k: v for k, v in (config.get("loss") or {}).items() if k != "name"}


def build_loss(config: Mapping[str, Any], num_classes: int, embedding_size: int) -> Any:
    """Instantiate the setting's loss (``HAPPIERLoss``, ``ROADMAPLoss`` or ``RODNDCGLoss``) with the one loss builder
    :func:`pml_suprank.training.build_loss`."""
    name = (config.get("loss") or {}).get("name")
    if name not in LOSS_CLASSES:
        raise ValueError(f"loss.name must be one of {sorted(LOSS_CLASSES)}; got {name!r}")
    return _build_loss_by_name(name, loss_kwargs(config), num_classes, embedding_size)


def resolved_split(config: Mapping[str, Any], part: str) -> str:
    """The split name of the ``part`` (``"train"`` / ``"test"``) dataset: ``data.<part>_split`` when set, else the
    benchmark's own training / test split for a benchmark name, else ``part``."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test'; got {part!r}")
    data = config.get("data") or {}
    split = data.get(f"{part}_split")
    if split is not None:
        return split
    spec = _benchmark(data.get("dataset"))
    if spec is None:
        return part
    split = spec.train_split if part == "train" else spec.test_split
    if split is None:
        raise ValueError(
            f"benchmark {spec.name} has no single test split (evaluate it with recipes/evaluate.py --benchmark "
            f"{spec.name}); set data.test_split (--test_split) to one of {list(spec.splits)}"
        )
    return split


def dataset_kwargs(config: Mapping[str, Any], part: str, *, data_root: str | Path | None = None) -> dict[str, Any]:
    """Arguments for the ``part`` (``"train"`` or ``"test"``) dataset of this setting.

    Returns ``{"synthetic": True, "split", "num_per_class", "image_size"}`` for SyntheticShapes,
    ``{"benchmark": name, "root", "split"}`` for a benchmark name (the arguments of
    :func:`pml_suprank.data.load_benchmark`), else the kwargs of :func:`pml_suprank.data.load_retrieval_dataset`
    (``source``, ``label_columns``, ``split``, ``open_set`` and the open-set rule).

    Args:
        config: A loaded hub_config (or the recipes' options nested by :func:`nest_options`).
        part: ``"train"`` or ``"test"``.
        data_root: The benchmark's folder; replaces ``data.data_root``.

    Raises:
        ValueError: A bad ``part``, an inconsistent ``data`` section (see :func:`data_option_errors`), e.g. a
            benchmark without ``data_root``.
    """
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test'; got {part!r}")
    data = dict(config.get("data") or {})
    if data_root is not None:
        data["data_root"] = str(data_root)
    if data.get("dataset") in SYNTHETIC_NAMES:
        out: dict[str, Any] = {"synthetic": True if data["dataset"] == "synthetic" else data["dataset"], "split": part}
        for k in ("num_per_class", "image_size"):
            if k in data:
                out[k] = data[k]
        return out
    errors = data_option_errors(data, require_root=True)
    if errors:
        raise ValueError("data options: " + "; ".join(errors))
    split = resolved_split({"data": data}, part)
    if _benchmark(data["dataset"]) is not None:
        return {"benchmark": data["dataset"], "root": data["data_root"], "split": split}
    out = {"source": data["dataset"], "label_columns": list(data["label_columns"]), "split": split}
    if data.get("open_set"):
        out["open_set"] = part
        for k in ("train_classes_per_coarse", "train_class_fraction"):
            if k in data:
                out[k] = data[k]
    return out


def build_dataset(
    config: Mapping[str, Any],
    part: str,
    transform: Any = None,
    *,
    seed: int = 0,
    data_root: str | Path | None = None,
    **kwargs: Any,
) -> Any:
    """The ``part`` (``"train"`` / ``"test"``) dataset of this setting: ``SyntheticShapes``, a benchmark read from its
    archive (:func:`pml_suprank.data.load_benchmark`) or :func:`pml_suprank.data.load_retrieval_dataset` with the
    open-set split applied.

    Args:
        config: A loaded hub_config.
        part: ``"train"`` or ``"test"``.
        transform: Callable on a PIL image (e.g. :func:`pml_suprank.data.build_transforms`).
        seed: SyntheticShapes seed.
        data_root: The benchmark's folder (replaces ``data.data_root``).
        **kwargs: Extra or overriding arguments for the loader (e.g. ``cache_dir``, ``num_per_class``); a benchmark
            takes none.
    """
    from . import data

    kw = {**dataset_kwargs(config, part, data_root=data_root), **kwargs}
    synthetic = kw.pop("synthetic", False)
    if synthetic:
        name = synthetic if isinstance(synthetic, str) else "synthetic"
        return data.synthetic_dataset(name, kw.pop("split", "train"), seed=seed, transform=transform, **kw)
    if "benchmark" in kw:
        name, root, split = kw.pop("benchmark"), kw.pop("root"), kw.pop("split")
        if kw:
            raise TypeError(f"benchmark {name} takes no loader arguments; got {sorted(kw)}")
        return data.load_benchmark(name, root, split, transform)
    return data.load_retrieval_dataset(kw.pop("source"), transform=transform, **kw)
