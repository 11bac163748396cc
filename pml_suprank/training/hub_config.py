"""hub_configs: one YAML file per published setting (paper hyper-parameters, dataset, Hub metadata, paper numbers).

The option sections (``model``, ``data``, ``loss``, ``optimizer``, ``scheduler``, ``sampler_options``, ``memory``,
``training``, ``evaluation``: :data:`HUB_CONFIG_SCHEMA`) hold fields of the option dataclasses by their flag names
(``loss.name`` is ``--loss``); ``name`` (the file name without ``.yaml``), ``description``, ``notes`` and ``hub``
(:data:`HUB_SECTION`) are model-card metadata. A complete file needs ``name``, ``model.backbone``, ``data.dataset``
and ``loss.name``; a partial one (``--config base.yaml --config override.yaml``) only the keys it changes. Files are
data (:func:`_rules`); each value is checked by its option when the spec is built, named ``'section.key'``. A bundled
setting (``pml_suprank/hub_configs/<name>.yaml``) is read by name (``--config happier_sop``), anything else as a path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._validation import OptionCheck, is_number, is_str, list_of
from ..losses.registry import check_loss_name
from .config import OptionError
from .options import LOCATIONS, SECTIONS, config_layer
from .run_spec import RunSpec
from .spec import merge_layers, read_sections, section_problems

__all__ = ["CONFIG_KINDS", "HUB_CONFIG_SCHEMA", "HUB_SECTION", "bundled_hub_configs", "hub_config_path",
           "load_hub_config", "read_hub_config", "read_layer", "refuse_other_kind", "validate_hub_config"]  # fmt: skip

#: the ``hub`` section: model-card metadata, ``{key: check}``
HUB_SECTION: dict[str, OptionCheck] = {
    "tags": list_of(is_str(), "a list of strings", min_len=0),
    "license": is_str("a license id such as mit"),
    "datasets": list_of(is_str(), "a list of Hub dataset ids", min_len=0),
    "paper": is_str("the paper title"),
    "paper_url": is_str("a URL"),
    "paper_table": is_str("where the paper numbers come from"),
    "paper_results": OptionCheck(
        lambda v: isinstance(v, Mapping) and all(is_str()(k) and is_number(0.0, high=100.0)(x) for k, x in v.items()),
        "a mapping metric key -> number in [0, 100] (percent)",
    ),
}
#: ``{section: {key: option name}}`` of the option sections, derived from the option dataclasses
HUB_CONFIG_SCHEMA: dict[str, dict[str, str]] = {
    section: {k: name for (s, k), (_, name) in LOCATIONS.items() if s == section} for section in SECTIONS
}
_TOP_LEVEL = {
    "name": is_str(),
    "description": is_str(),
    "notes": OptionCheck(lambda v: is_str()(v) or list_of(is_str(), "")(v), "a string or a list of strings"),
}
_KEYS = {**HUB_CONFIG_SCHEMA, "hub": HUB_SECTION}
_REQUIRED = {"model": "backbone", "data": "dataset", "loss": "name"}
#: the bundled hub_configs (package data)
BUNDLED_HUB_CONFIGS = Path(__file__).resolve().parents[1] / "hub_configs"
#: the kinds of ``--config`` file: ``{kind: (its option sections, the commands that read it)}``; the ``fit_heat`` kind
#: is :meth:`pml_suprank.recipes.ood_spec.FitHeatSpec.read_config`'s (``recipe:`` options, ``heat:`` settings)
CONFIG_KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "training": (tuple(HUB_CONFIG_SCHEMA), "a training recipe: pml_suprank.recipes.train, train_happier or "
                 "train_roadmap --config"),
    "fit_heat": (("recipe", "heat"), "pml_suprank.recipes.fit_heat --config (or ood_benchmark --config)"),
}  # fmt: skip


def refuse_other_kind(config: Mapping[str, Any], path: str | Path, kind: str) -> list[str]:
    """``[]`` (a ``checks`` of :func:`~pml_suprank.training.spec.read_sections`), or ``OptionError`` in one line
    naming the file, its kind and its command when ``config`` has sections of another kind of :data:`CONFIG_KINDS`
    and none of ``kind``'s: the given file is for another recipe, not a file with many unknown keys."""
    if any(section in config for section in CONFIG_KINDS[kind][0]):
        return []
    for other, (sections, command) in CONFIG_KINDS.items():
        if other != kind and (found := [s for s in sections if s in config]):
            raise OptionError(f"{path}: a {other} config (sections {', '.join(found)}), not a {kind} one; give it to "
                              f"{command}")  # fmt: skip
    return []


def _rules(config: dict[str, Any], partial: bool) -> list[str]:
    """Files are data: a ``loss.name`` that would be imported (``package.module:ClassName``) refused without importing
    it, the ``model`` section held to the rule of a loaded ``config.json``
    (:func:`~pml_suprank.hub.loaded_config.untrusted_model_problems`); the required keys of a complete file."""
    from ..hub.loaded_config import untrusted_model_problems  # not at import: pml_suprank.hub loads huggingface_hub

    loss, model, errors = config.get("loss"), config.get("model"), []
    if isinstance(loss, dict) and "name" in loss and (problem := check_loss_name(loss["name"], from_file=True)):
        errors.append(f"'loss.name' must be {problem}")
    if isinstance(model, Mapping):
        hint = " — a hub_config is held to the rule of a loaded config.json; set it from Python or the command line"
        errors += [f"{p}{hint} instead" for p in untrusted_model_problems(model, "model.")]
    if not partial:
        errors += ["missing required key 'name'"] if "name" not in config else []
        errors += [f"missing required key '{s}.{k}'" for s, k in _REQUIRED.items()
                   if not isinstance(config.get(s), dict) or k not in config[s]]  # fmt: skip
    return errors


def validate_hub_config(config: Any, source: str = "hub_config", *, partial: bool = False,
                        defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Check ``config`` (sections, keys, file rules, then its :class:`~pml_suprank.training.RunSpec`; nothing built);
    return it unchanged or raise ``ValueError`` naming ``source``, every key, what was expected and what was found.
    ``partial``: an override file; ``defaults`` (option name → value) fill the options the file leaves out."""
    if not isinstance(config, dict):
        raise ValueError(f"{source}: a hub_config must be a YAML mapping; got {type(config).__name__}")
    if not (errors := section_problems(config, _KEYS, _TOP_LEVEL)[0] + _rules(config, partial)):
        layers = [{k: (k, v) for k, v in (defaults or {}).items()}, config_layer(config)]
        try:
            values, where = merge_layers(layers)
            RunSpec.from_options(values, given=frozenset(layers[1]), where=where, files=[config],
                                 require_data_root=False)  # fmt: skip
        except OptionError as e:
            errors = [text if name is None else f"'{where.get(name, name)}' {text}" for name, text in e.problems]
    if errors:
        raise ValueError(f"{source}: invalid hub_config:\n  - " + "\n  - ".join(errors))
    return config


def bundled_hub_configs() -> list[str]:
    """The names of the hub_configs shipped with the package, sorted."""
    return sorted(p.stem for p in BUNDLED_HUB_CONFIGS.glob("*.yaml"))


def hub_config_path(path: str | Path) -> Path:
    """The YAML file a ``--config`` argument names: an existing file, else a bare name of
    :func:`bundled_hub_configs` (``FileNotFoundError`` listing them otherwise)."""
    p, names = Path(path), bundled_hub_configs()
    if p.is_file() or str(path) in names:
        return p if p.is_file() else BUNDLED_HUB_CONFIGS / f"{path}.yaml"
    hint = f"; did you mean the bundled config {p.stem!r} (--config {p.stem})?" if p.stem in names else ""
    raise FileNotFoundError(
        f"hub_config {str(path)!r} is neither a file nor the name of a bundled config ({', '.join(names)}){hint}"
    )


def read_hub_config(path: str | Path, *, partial: bool = False) -> dict[str, Any]:
    """A hub_config (YAML file or bundled name), its structure checked (sections, keys, metadata, required keys,
    ``name`` = the file name); the recipes check the merged files once, as their RunSpec. ``partial``: an override."""
    p = hub_config_path(path)
    config, _ = read_sections(p, _KEYS, metadata=_TOP_LEVEL, kind="hub_config",
                              checks=lambda c: refuse_other_kind(c, p, "training") + _rules(c, partial))  # fmt: skip
    if (not partial or "name" in config) and config["name"] != p.stem:
        raise ValueError(f"{p}: 'name' must equal the file name without .yaml ({p.stem!r}); got {config['name']!r}")
    return config


def read_layer(path: str) -> tuple[dict[str, Any], dict[str, tuple[str, Any]]]:
    """The training command's ``--config`` reader: a partial hub_config and its :func:`config_layer`."""
    config = read_hub_config(path, partial=True)
    return config, config_layer(config, str(path))


def load_hub_config(path: str | Path, *, partial: bool = False,
                    defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """:func:`read_hub_config` (the structure), then :func:`validate_hub_config` (its RunSpec)."""
    return validate_hub_config(read_hub_config(path, partial=partial), str(path), partial=partial, defaults=defaults)
