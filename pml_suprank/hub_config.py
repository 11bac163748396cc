"""hub_configs: one YAML file per published setting (paper hyper-parameters, dataset, Hub metadata, paper numbers).

A hub_config is plain YAML with the sections below. Every key of the option sections is the name of a recipe
option (``recipes/train_happier.py --help``), so ``--config file.yaml`` simply sets the recipe's defaults; ``name``,
``description``, ``notes``, ``loss.name`` and the whole ``hub`` section are metadata (model card, bookkeeping).

Schema (``*`` = required; types in brackets; defaults are the recipes'):

``name``\\* [str]
    Identifier; must equal the file name without ``.yaml``.
``description`` [str], ``notes`` [str | list of str]
    Free text (deviations from the reference, where the numbers come from, ...).
``model``\\*
    ``backbone``\\* [timm name], ``pretrained`` [bool], ``pooling`` [avg | gem | max], ``embedding_size`` [int],
    ``layer_norm`` [bool], ``freeze_batch_norm`` [bool].
``data``\\*
    ``dataset``\\* [``"synthetic"``, a Hub dataset id, or a local folder / parquet path], ``label_columns`` [list of
    str, fine → coarse; required unless synthetic], ``train_split`` / ``test_split`` [str, ``"a+b"`` concatenates],
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
    ``epochs``, ``warmup_epochs`` [backbone frozen], ``seed``, ``grad_clip``, ``mixed_precision`` [no | fp16 | bf16].
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

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "HUB_CONFIG_SCHEMA",
    "LOSS_CLASSES",
    "build_dataset",
    "build_loss",
    "dataset_kwargs",
    "flat_options",
    "load_hub_config",
    "loss_kwargs",
    "model_kwargs",
    "validate_hub_config",
]

# value checkers -------------------------------------------------------------------------------------------------------


def _str(v):
    return isinstance(v, str) and bool(v)


def _bool(v):
    return isinstance(v, bool)


def _int(low=0):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _num(low=0.0, strict=False, high=math.inf):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            return False
        return (v > low if strict else v >= low) and v <= high

    return check


def _opt(check):
    return lambda v: v is None or check(v)


def _choice(*values):
    f = lambda v: v in values  # noqa: E731
    f.choices = values
    return f


def _list_of(check, min_len=1):
    return lambda v: isinstance(v, list) and len(v) >= min_len and all(check(x) for x in v)


def _pair(v):
    return isinstance(v, list) and len(v) == 2 and all(_num(0, strict=True, high=1)(x) for x in v) and v[0] <= v[1]


def _str_or_list(v):
    return _str(v) or _list_of(_str)(v)


def _results(v):
    return isinstance(v, Mapping) and all(_str(k) and _num(0.0, high=100.0)(x) for k, x in v.items())


# (checker, description) per key; the description is used in error messages
HUB_CONFIG_SCHEMA: dict[str, dict[str, tuple[Any, str]]] = {
    "model": {
        "backbone": (_str, "a timm model name"),
        "pretrained": (_bool, "a bool"),
        "pooling": (_choice("avg", "gem", "max"), "one of avg, gem, max"),
        "embedding_size": (_int(1), "an int >= 1"),
        "layer_norm": (_bool, "a bool"),
        "freeze_batch_norm": (_bool, "a bool"),
    },
    "data": {
        "dataset": (_str, "'synthetic', a Hub dataset id or a local path"),
        "label_columns": (_list_of(_str), "a non-empty list of column names (fine → coarse)"),
        "train_split": (_str, "a split name"),
        "test_split": (_str, "a split name"),
        "image_size": (_int(8), "an int >= 8"),
        "crop_scale": (_pair, "two numbers 0 < low <= high <= 1"),
        "num_per_class": (_int(1), "an int >= 1"),
        "open_set": (_bool, "a bool"),
        "train_classes_per_coarse": (_int(1), "an int >= 1"),
        "train_class_fraction": (_num(0.0, strict=True, high=0.999), "a number in (0, 1)"),
    },
    "loss": {
        "name": (_choice("HAPPIER", "ROADMAP", "ROD-NDCG"), "one of HAPPIER, ROADMAP, ROD-NDCG"),
        "decomposability": (_choice("calibration", "proxy"), "one of calibration, proxy"),
        "decomposability_weight": (_num(0.0, high=1.0), "a number in [0, 1]"),
        "alpha": (_num(0.0, strict=True), "a number > 0"),
        "tau": (_num(0.0, strict=True), "a number > 0"),
        "rho": (_num(0.0), "a number >= 0"),
        "delta": (_num(0.0), "a number >= 0"),
        "start": (_num(0.0, high=1.0), "a number in [0, 1]"),
        "offset": (_opt(_num(0.0)), "null or a number >= 0"),
    },
    "optimizer": {
        "optimizer": (_choice("adam", "adamw", "sgd"), "one of adam, adamw, sgd"),
        "lr_backbone": (_num(0.0), "a number >= 0"),
        "lr_head": (_num(0.0), "a number >= 0"),
        "lr_proxies": (_num(0.0), "a number >= 0"),
        "weight_decay": (_num(0.0), "a number >= 0"),
        "proxies_weight_decay": (_num(0.0), "a number >= 0"),
        "momentum": (_num(0.0, high=1.0), "a number in [0, 1]"),
    },
    "scheduler": {
        "scheduler": (_choice("cosine", "constant"), "one of cosine, constant"),
        "min_lr_ratio": (_num(0.0, high=1.0), "a number in [0, 1]"),
    },
    "sampler_options": {
        "sampler": (_choice("m_per_class", "hierarchical"), "one of m_per_class, hierarchical"),
        "batch_size": (_int(2), "an int >= 2"),
        "samples_per_class": (_int(2), "an int >= 2"),
        "batches_per_super_tuple": (_int(1), "an int >= 1"),
        "super_classes_per_batch": (_int(1), "an int >= 1"),
    },
    "memory": {
        "memory_size": (_int(0), "an int >= 0"),
        "memory_warmup_steps": (_int(0), "an int >= 0"),
    },
    "training": {
        "epochs": (_int(1), "an int >= 1"),
        "warmup_epochs": (_int(0), "an int >= 0"),
        "seed": (_int(0), "an int >= 0"),
        "grad_clip": (_opt(_num(0.0, strict=True)), "null or a number > 0"),
        "mixed_precision": (_choice("no", "fp16", "bf16"), "one of no, fp16, bf16"),
    },
    "evaluation": {
        "k_values": (_list_of(_int(1)), "a non-empty list of ints >= 1"),
        "eval_every": (_int(0), "an int >= 0"),
        "eval_batch_size": (_int(1), "an int >= 1"),
    },
    "hub": {
        "tags": (_list_of(_str, 0), "a list of strings"),
        "license": (_str, "a license id such as mit"),
        "datasets": (_list_of(_str, 0), "a list of Hub dataset ids"),
        "paper": (_str, "the paper title"),
        "paper_url": (_str, "a URL"),
        "paper_table": (_str, "where the paper numbers come from"),
        "paper_results": (_results, "a mapping metric key -> number in [0, 100] (percent)"),
    },
}
_REQUIRED = {"model": ("backbone",), "data": ("dataset",), "loss": ("name",)}
_TOP_LEVEL = {"name": _str, "description": _str, "notes": _str_or_list}

#: loss name of a hub_config → (module attribute in pml_suprank.losses, keys it accepts)
LOSS_CLASSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "HAPPIER": ("HAPPIERLoss", ("decomposability_weight", "alpha", "tau", "rho", "delta", "start", "offset")),
    "ROADMAP": ("ROADMAPLoss", ("decomposability", "decomposability_weight", "tau", "rho", "delta", "start", "offset")),
    "ROD-NDCG": ("RODNDCGLoss", ("decomposability_weight", "tau", "rho", "delta", "start", "offset")),
}


def validate_hub_config(config: Any, source: str = "hub_config") -> dict[str, Any]:
    """Check ``config`` against :data:`HUB_CONFIG_SCHEMA`; return it unchanged (a plain dict) or raise ``ValueError``.

    Every error names the file, the key, what was expected and what was found; unknown sections and keys are
    errors (a typo must not be silently ignored).
    """
    if not isinstance(config, dict):
        raise ValueError(f"{source}: a hub_config must be a YAML mapping; got {type(config).__name__}")
    errors: list[str] = []
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
    if "name" not in config:
        errors.append("missing required key 'name'")
    for section, keys in _REQUIRED.items():
        for k in keys:
            if not isinstance(config.get(section), dict) or k not in config[section]:
                errors.append(f"missing required key '{section}.{k}'")
    if not errors:
        errors += _cross_checks(config)
    if errors:
        raise ValueError(f"{source}: invalid hub_config:\n  - " + "\n  - ".join(errors))
    return config


def _cross_checks(config: dict[str, Any]) -> list[str]:
    errors = []
    data, loss = config["data"], config["loss"]
    from .models import check_backbone_name

    try:
        check_backbone_name(config["model"]["backbone"])
    except (ValueError, TypeError) as e:
        errors.append(f"'model.backbone': {e}")
    if data["dataset"] != "synthetic" and "label_columns" not in data:
        errors.append("'data.label_columns' is required unless data.dataset is 'synthetic'")
    if data["dataset"] == "synthetic" and "label_columns" in data:
        errors.append("'data.label_columns' must not be set for the synthetic dataset (fine_label, coarse_label)")
    rules = [k for k in ("train_classes_per_coarse", "train_class_fraction") if k in data]
    if len(rules) > 1:
        errors.append(f"'data' sets both {rules}; give one open-set rule")
    if rules and not data.get("open_set", False):
        errors.append(f"'data.{rules[0]}' needs 'data.open_set: true'")
    if rules and data["dataset"] == "synthetic":
        errors.append("the synthetic dataset has its own open-set split; drop the open-set rule")
    if "train_classes_per_coarse" in data and len(data.get("label_columns", [])) < 2:
        errors.append("'data.train_classes_per_coarse' needs at least two label_columns (fine and coarse)")
    accepted = LOSS_CLASSES[loss["name"]][1]
    for k in loss:
        if k != "name" and k not in accepted:
            errors.append(f"'loss.{k}' does not apply to loss {loss['name']} (valid: {list(accepted)})")
    sampler = config.get("sampler_options", {})
    if "batch_size" in sampler and "samples_per_class" in sampler:
        if sampler["batch_size"] % sampler["samples_per_class"]:
            errors.append(
                f"'sampler_options.batch_size' ({sampler['batch_size']}) must be a multiple of "
                f"'samples_per_class' ({sampler['samples_per_class']})"
            )
    epochs = config.get("training", {}).get("epochs")
    warm = config.get("training", {}).get("warmup_epochs", 0)
    if epochs is not None and warm >= epochs:
        errors.append(f"'training.warmup_epochs' ({warm}) must be smaller than 'training.epochs' ({epochs})")
    return errors


def load_hub_config(path: str | Path) -> dict[str, Any]:
    """Read and validate a hub_config YAML file (see the module docstring for the schema).

    Args:
        path: The YAML file, or a bare name looked up as ``hub_configs/<name>.yaml`` from the working directory.

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
    validate_hub_config(config, source=str(p))
    if config["name"] != p.stem:
        raise ValueError(f"{p}: 'name' must equal the file name without .yaml ({p.stem!r}); got {config['name']!r}")
    return config


def flat_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The option sections flattened to ``{recipe option: value}`` (metadata — ``hub``, ``loss.name`` — dropped)."""
    out: dict[str, Any] = {}
    for section in HUB_CONFIG_SCHEMA:
        if section == "hub":
            continue
        for k, v in (config.get(section) or {}).items():
            if section == "loss" and k == "name":
                continue
            out[k] = v
    return out


def model_kwargs(config: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """Constructor kwargs of :class:`pml_suprank.models.RetrievalModel` for this setting."""
    model = dict(config.get("model") or {})
    kwargs = {k: model[k] for k in ("backbone", "pretrained", "pooling", "embedding_size", "layer_norm") if k in model}
    image_size = (config.get("data") or {}).get("image_size")
    if image_size is not None:
        kwargs["image_size"] = image_size
    kwargs.update(overrides)
    return kwargs


def loss_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of the setting's loss (without ``num_classes`` / ``embedding_size``)."""
    return {k: v for k, v in (config.get("loss") or {}).items() if k != "name"}


def build_loss(config: Mapping[str, Any], num_classes: int, embedding_size: int) -> Any:
    """Instantiate the setting's loss (``HAPPIERLoss``, ``ROADMAPLoss`` or ``RODNDCGLoss``)."""
    from . import losses

    name = (config.get("loss") or {}).get("name")
    if name not in LOSS_CLASSES:
        raise ValueError(f"loss.name must be one of {sorted(LOSS_CLASSES)}; got {name!r}")
    cls = getattr(losses, LOSS_CLASSES[name][0])
    kwargs = loss_kwargs(config)
    if name == "ROADMAP" and kwargs.get("decomposability", "calibration") == "calibration":
        return cls(**kwargs)
    return cls(num_classes=num_classes, embedding_size=embedding_size, **kwargs)


def dataset_kwargs(config: Mapping[str, Any], part: str) -> dict[str, Any]:
    """Arguments for the ``part`` (``"train"`` or ``"test"``) dataset of this setting.

    Returns ``{"synthetic": True, "split", "num_per_class", "image_size"}`` for SyntheticShapes, else the kwargs of
    :func:`pml_suprank.data.load_retrieval_dataset` (``source``, ``label_columns``, ``split``, ``open_set`` and the
    open-set rule).
    """
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test'; got {part!r}")
    data = dict(config.get("data") or {})
    if data.get("dataset") == "synthetic":
        out: dict[str, Any] = {"synthetic": True, "split": part}
        for k in ("num_per_class", "image_size"):
            if k in data:
                out[k] = data[k]
        return out
    out = {
        "source": data["dataset"],
        "label_columns": list(data["label_columns"]),
        "split": data.get(f"{part}_split", part),
    }
    if data.get("open_set"):
        out["open_set"] = part
        for k in ("train_classes_per_coarse", "train_class_fraction"):
            if k in data:
                out[k] = data[k]
    return out


def build_dataset(config: Mapping[str, Any], part: str, transform: Any = None, *, seed: int = 0, **kwargs: Any) -> Any:
    """The ``part`` (``"train"`` / ``"test"``) dataset of this setting: ``SyntheticShapes`` or
    :func:`pml_suprank.data.load_retrieval_dataset` with the open-set split applied.

    Args:
        config: A loaded hub_config.
        part: ``"train"`` or ``"test"``.
        transform: Callable on a PIL image (e.g. :func:`pml_suprank.data.build_transforms`).
        seed: SyntheticShapes seed.
        **kwargs: Extra or overriding arguments for the loader (e.g. ``cache_dir``, ``num_per_class``).
    """
    from . import data

    kw = {**dataset_kwargs(config, part), **kwargs}
    if kw.pop("synthetic", False):
        return data.SyntheticShapes(seed=seed, transform=transform, **kw)
    return data.load_retrieval_dataset(kw.pop("source"), transform=transform, **kw)
