"""hub_configs: one YAML file per published setting (paper hyper-parameters, dataset, Hub metadata, paper numbers).

Every key of the option sections (``model``, ``data``, ``loss``, ``optimizer``, ``scheduler``, ``sampler_options``,
``memory``, ``training``, ``evaluation``) is a field of the option dataclasses of :mod:`pml_suprank.training` and the
name of a recipe flag (``loss.name`` is ``--loss``): :data:`HUB_CONFIG_SCHEMA` is derived from their ``section`` /
``key`` metadata, and ``pml-suprank-train --help`` documents each with its default. ``name`` (the file name without
``.yaml``), ``description``, ``notes`` and the ``hub`` section (``tags``, ``license``, ``datasets``, ``paper``,
``paper_url``, ``paper_table``, ``paper_results``: metric key → percent) are metadata for the model card. A complete
file needs ``name``, ``model.backbone``, ``data.dataset`` and ``loss.name``; a partial one (``partial=True``, the
recipes' ``--config base.yaml --config override.yaml``) only the keys it changes
(:func:`~pml_suprank.training.run_spec.merge_hub_configs`).

Files are data: :func:`read_hub_config` reads through the bounded safe YAML loader, refuses unknown sections and keys,
a ``loss.name`` that would be imported (``package.module:ClassName``) and a ``model`` section a loaded ``config.json``
could not hold; each value is checked by its option when the spec is built (:func:`validate_hub_config`, the
recipes' :func:`~pml_suprank.training.spec.parse`), named ``'section.key'``.

The published settings ship with the package (``pml_suprank/hub_configs/<name>.yaml``, :func:`bundled_hub_configs`):
``--config happier_sop`` / ``load_hub_config("happier_sop")`` reads one by name; any other argument is a path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..losses.registry import check_loss_name
from .config import OptionCheck, OptionError, is_number, is_str, list_of
from .options import LOCATIONS, SECTIONS, recipe_options
from .run_spec import RunSpec
from .spec import merge_layers, read_sections, section_problems

__all__ = [
    "HUB_CONFIG_SCHEMA",
    "HUB_SECTION",
    "build_loss",
    "bundled_hub_configs",
    "config_layer",
    "hub_config_path",
    "load_hub_config",
    "read_layer",
    "validate_hub_config",
]


def _results(v: Any) -> bool:
    return isinstance(v, Mapping) and all(is_str()(k) and is_number(0.0, high=100.0)(x) for k, x in v.items())


#: the ``hub`` section: model-card metadata, ``{key: check}``
HUB_SECTION: dict[str, OptionCheck] = {
    "tags": list_of(is_str(), "a list of strings", min_len=0),
    "license": is_str("a license id such as mit"),
    "datasets": list_of(is_str(), "a list of Hub dataset ids", min_len=0),
    "paper": is_str("the paper title"),
    "paper_url": is_str("a URL"),
    "paper_table": is_str("where the paper numbers come from"),
    "paper_results": OptionCheck(_results, "a mapping metric key -> number in [0, 100] (percent)"),
}
#: ``{section: {key: option name}}`` of the option sections, derived from the option dataclasses (a value is checked
#: by its option's field check when the spec is built, named ``'section.key'``)
HUB_CONFIG_SCHEMA: dict[str, dict[str, str]] = {
    section: {k: name for (s, k), (_, name) in LOCATIONS.items() if s == section} for section in SECTIONS
}
_REQUIRED = {"model": ("backbone",), "data": ("dataset",), "loss": ("name",)}
_TOP_LEVEL = {
    "name": is_str(),
    "description": is_str(),
    "notes": OptionCheck(lambda v: is_str()(v) or list_of(is_str(), "")(v), "a string or a list of strings"),
}
_KEYS = {**HUB_CONFIG_SCHEMA, "hub": HUB_SECTION}


def validate_hub_config(
    config: Any, source: str = "hub_config", *, partial: bool = False, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Check ``config`` against :data:`HUB_CONFIG_SCHEMA` and build it as a :class:`~pml_suprank.training.RunSpec` (the
    registered loss and its options, the data section, the ``TrainingConfig``, the backbone name against timm;
    nothing is built); return it unchanged (a plain dict) or raise ``ValueError``.

    Every error names the file, the key, what was expected and what was found; unknown sections and keys are
    errors (a typo must not be silently ignored). ``partial=True`` accepts an override file without the required
    keys (``name``, ``model.backbone``, ``data.dataset``, ``loss.name``). ``defaults`` (option name → value, e.g. a
    recipe's defaults) fill the options the file leaves out; default: the dataclass defaults.
    """
    errors = _structure_errors(config, source, partial)
    if not errors:
        layers = [{k: (k, v) for k, v in (defaults or {}).items()}, config_layer(config)]
        try:
            values, where = merge_layers(layers)
            RunSpec.from_options(values, given=frozenset(layers[1]), where=where, files=[config],
                                 require_data_root=False)  # fmt: skip
        except OptionError as e:
            errors += [text if name is None else f"'{where.get(name, name)}' {text}" for name, text in e.problems]
    if errors:
        raise ValueError(f"{source}: invalid hub_config:\n  - " + "\n  - ".join(errors))
    return config


def config_layer(config: Mapping[str, Any], source: str | None = None) -> dict[str, tuple[str, Any]]:
    """The options of a (schema-checked) hub_config as a layer of :func:`~pml_suprank.training.spec.parse`:
    ``{option name: ("<source>: section.key", value)}`` (``loss.name`` is ``loss``; metadata is left out)."""
    prefix = f"{source}: " if source else ""
    return {LOCATIONS[(section, k)][1]: (f"{prefix}{section}.{k}", v) for section in SECTIONS
            for k, v in (config.get(section) or {}).items() if (section, k) in LOCATIONS}  # fmt: skip


def _structure_errors(config: Any, source: str, partial: bool) -> list[str]:
    """The schema problems of ``config``: its sections and keys (:func:`~pml_suprank.training.spec.section_problems`)
    and :func:`_rules`."""
    if not isinstance(config, dict):
        raise ValueError(f"{source}: a hub_config must be a YAML mapping; got {type(config).__name__}")
    return section_problems(config, _KEYS, _TOP_LEVEL)[0] + _rules(config, partial)


def _rules(config: dict[str, Any], partial: bool) -> list[str]:
    """A ``loss.name`` that a file may not give (a ``package.module:ClassName`` is refused, nothing imported), the
    ``model`` section held to the rule of a loaded ``config.json``, the required keys of a complete file."""
    from ..hub.loaded_config import hub_config_model_problems

    errors = []
    loss = config.get("loss")
    if isinstance(loss, dict) and "name" in loss and (problem := check_loss_name(loss["name"], from_file=True)):
        errors.append(f"'loss.name' must be {problem}")
    errors += hub_config_model_problems(config) if isinstance(config.get("model"), Mapping) else []
    if not partial:
        if "name" not in config:
            errors.append("missing required key 'name'")
        for section, keys in _REQUIRED.items():
            for k in keys:
                if not isinstance(config.get(section), dict) or k not in config[section]:
                    errors.append(f"missing required key '{section}.{k}'")
    return errors


#: the hub_configs shipped with the package (package data)
BUNDLED_HUB_CONFIGS = Path(__file__).resolve().parents[1] / "hub_configs"


def bundled_hub_configs() -> list[str]:
    """The names of the hub_configs shipped with the package (``pml_suprank/hub_configs/<name>.yaml``), sorted."""
    return sorted(p.stem for p in BUNDLED_HUB_CONFIGS.glob("*.yaml"))


def hub_config_path(path: str | Path) -> Path:
    """The YAML file a ``--config`` argument names: an existing file as given, else a bare name (no suffix, no
    directory) of :func:`bundled_hub_configs`.

    Raises:
        FileNotFoundError: neither; the message lists the bundled names (and the one meant, for an old
            ``hub_configs/<name>.yaml`` path).
    """
    p = Path(path)
    if p.is_file():
        return p
    bundled = BUNDLED_HUB_CONFIGS / f"{p.name}.yaml"
    if p.suffix == "" and p.name == str(path) and bundled.is_file():
        return bundled
    names = bundled_hub_configs()
    hint = f"; did you mean the bundled config {p.stem!r} (--config {p.stem})?" if p.stem in names else ""
    raise FileNotFoundError(
        f"hub_config {str(path)!r} is neither a file nor the name of a bundled config ({', '.join(names)}){hint}"
    )


def read_hub_config(path: str | Path, *, partial: bool = False) -> dict[str, Any]:
    """Read a hub_config YAML file and check its structure only (sections, keys, value types, required keys, the
    name): the recipes check the merged files once, as their :class:`~pml_suprank.training.RunSpec`.

    Args:
        path: The YAML file, or the name of a bundled config (:func:`hub_config_path`).
        partial: Accept an override file with only the keys it changes (no required key; ``name``, when given,
            must still equal the file name).
    """
    p = hub_config_path(path)
    config, _ = read_sections(p, _KEYS, metadata=_TOP_LEVEL, checks=lambda c: _rules(c, partial), kind="hub_config")
    if (not partial or "name" in config) and config["name"] != p.stem:
        raise ValueError(f"{p}: 'name' must equal the file name without .yaml ({p.stem!r}); got {config['name']!r}")
    return config


def read_layer(path: str) -> tuple[dict[str, Any], dict[str, tuple[str, Any]]]:
    """The training command's ``--config`` reader (:func:`~pml_suprank.training.spec.parse`): a partial hub_config
    as read and its options ``{name: ("<file>: section.key", value)}``."""
    config = read_hub_config(path, partial=True)
    return config, config_layer(config, str(path))


def load_hub_config(
    path: str | Path, *, partial: bool = False, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Read and validate a hub_config YAML file (see the module docstring for the schema):
    :func:`read_hub_config` and :func:`validate_hub_config`.

    Args:
        path: The YAML file, or the name of a bundled config (:func:`hub_config_path`).
        partial: Accept an override file with only the keys it changes (no required key; ``name``, when given,
            must still equal the file name).
        defaults: Values of the options the file leaves out (see :func:`validate_hub_config`).

    Returns:
        The configuration as a plain nested dict.
    """
    config = read_hub_config(path, partial=partial)
    return validate_hub_config(config, source=str(path), partial=partial, defaults=defaults)


def build_loss(config: Mapping[str, Any], num_classes: int, embedding_size: int) -> Any:
    """The setting's loss (``loss.name`` and the ``loss`` section's options) by the one loss builder
    :func:`pml_suprank.training.build_loss`."""
    from . import options as opts

    values = recipe_options(config)
    return opts.build_loss(values["loss"], values, num_classes, embedding_size)
