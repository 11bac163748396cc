"""hub_configs: the YAML files of the published settings — a thin alias of :mod:`pml_suprank.training.hub_config`
(the schema, the reader and the validator live there, next to the options they are generated from)."""

from __future__ import annotations

from .training.data_source import data_option_errors, dataset_source  # noqa: F401 - read from here before
from .training.hub_config import (
    BUNDLED_HUB_CONFIGS,  # noqa: F401 - importable from here too
    HUB_CONFIG_SCHEMA,
    build_loss,
    bundled_hub_configs,
    hub_config_path,
    load_hub_config,
    merge_hub_configs,
    read_hub_config,  # noqa: F401 - the recipes' --config reader
    validate_hub_config,
)
from .training.options import recipe_options  # noqa: F401 - read from here before

__all__ = [
    "HUB_CONFIG_SCHEMA",
    "build_loss",
    "bundled_hub_configs",
    "hub_config_path",
    "load_hub_config",
    "merge_hub_configs",
    "validate_hub_config",
]
