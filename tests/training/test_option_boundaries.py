"""One verdict per option value, whatever the entry point: every numeric, boolean and closed-set training option gets
its boundary values (below its minimum, the minimum, the maximum, above it, a wrong type, a bad choice) through the
Python constructors, the command line, a ``--config`` YAML file and a hub_config, and each value is accepted by all
of them or refused by all of them, the refusal naming the option."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import yaml
from _hub_helpers import recipe_options

from pml_suprank.training import RunSpec, TrainingConfig
from pml_suprank.training import recipe as common
from pml_suprank.training.config import OptionError, field_problem
from pml_suprank.training.hub_config import read_layer, validate_hub_config
from pml_suprank.training.options import OPTION_CLASSES
from pml_suprank.training.run_spec import FIELD_PARTS, PARTS
from pml_suprank.training.spec import parse

DEFAULTS = common.PRESETS["train"]
#: options whose value a recipe run cannot take from the command line on its own (documented in their help)
SKIP_KINDS = (None, "str")


def _boundary_values(check) -> list[tuple[str, object, bool | None]]:
    """``(case, value, valid by the field check alone)``: the boundary values of a check."""
    if check.kind == "bool":
        return [("true", True, True), ("false", False, True), ("wrong type", "maybe", False)]
    if check.kind == "choice":
        return [*((f"choice {c}", c, True) for c in check.choices), ("bad choice", "nope", False)]
    low, high, strict, open_high = check.bounds
    if check.kind == "int":
        return [("below min", low - 1, False), ("min", low, True), ("max", high, True), ("above max", high + 1, False),
                ("wrong type float", 1.5, False), ("wrong type str", "abc", False)]  # fmt: skip
    cases = [("below min", low if strict else low - 1.0, False), ("min", low + 1e-3 if strict else low, True)]
    if math.isfinite(high):
        cases += [("max", high - 1e-3 if open_high else high, True), ("above max", high if open_high else high + 1.0,
                                                                      False)]  # fmt: skip
    return [*cases, ("wrong type", "abc", False)]


def _cases():
    for cls in OPTION_CLASSES:
        for f in fields(cls):
            check = f.metadata.get("check")
            if check is None or check.kind in SKIP_KINDS or not f.metadata.get("cli", True):
                continue
            for case, value, valid in _boundary_values(check):
                yield pytest.param(f, value, valid, id=f"{f.name}-{case}")


def _cli_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.fixture(scope="module")
def parser():
    parser = common.build_parser("test", DEFAULTS)
    parser.preset_defaults = DEFAULTS
    return parser


def parse_recipe(parser, argv):
    return parse(RunSpec, argv, defaults=parser.preset_defaults, read_config=read_layer)


@pytest.mark.slow  # ~300 cases x 4 entry points: ~20 s on 2 CPU cores
@pytest.mark.parametrize("f, value, valid", list(_cases()))
def test_one_verdict_through_every_entry_point(f, value, valid, parser, tmp_path, capsys):
    verdicts: dict[str, bool] = {}
    messages: dict[str, str] = {}
    # 1. Python: the option dataclass's __post_init__ (its checks), then the spec's rules between parts
    try:
        RunSpec.from_values({**DEFAULTS, f.name: value})
        verdicts["python"] = True
    except ValueError as e:
        verdicts["python"], messages["python"] = False, str(e)
    # 2. the command line
    try:
        parse_recipe(parser, [f"--{f.name}", _cli_text(value)])
        verdicts["cli"] = True
    except SystemExit as e:
        assert e.code == 2
        verdicts["cli"], messages["cli"] = False, capsys.readouterr().err
    section = f.metadata.get("section")
    if section is not None:
        doc = {section: {f.metadata["key"] or f.name: value}}
        # 3. a --config YAML file
        path = tmp_path / "override.yaml"
        path.write_text(yaml.safe_dump(doc))
        try:
            parse_recipe(parser, ["--config", str(path)])
            verdicts["yaml"] = True
        except SystemExit as e:
            assert e.code == 2
            verdicts["yaml"], messages["yaml"] = False, capsys.readouterr().err
        # 4. a hub_config (the schema of the published settings)
        try:
            validate_hub_config(doc, partial=True, defaults=DEFAULTS)
            verdicts["hub_config"] = True
        except ValueError as e:
            verdicts["hub_config"], messages["hub_config"] = False, str(e)
    assert len(set(verdicts.values())) == 1, (verdicts, messages)
    if not valid:  # refused by the field's own check: everywhere, naming the option
        assert not any(verdicts.values())
        for where, message in messages.items():
            assert f.name in message or (f.metadata["key"] or f.name) in message, (where, message)
        part = PARTS[FIELD_PARTS[f.name]]
        with pytest.raises(OptionError, match=f.name):
            part(**{f.name: value})
        assert field_problem(f, value) is not None


def test_every_checked_option_is_covered():
    names = {p.values[0].name for p in _cases()}
    expected = {
        "epochs",
        "batch_size",
        "virtual_batch_size",
        "chunk_size",
        "lr_backbone",
        "momentum",
        "min_lr_ratio",
        "optimizer",
        "sampler",
        "freeze_batch_norm",
        "image_size",
        "tau",
        "kernel",
        "cpu",
        "report_to",
        "max_nonfinite_steps",
    }
    assert expected <= names


# ------------------------------------------------------------------------------------------------------------------
# the reproductions
# ------------------------------------------------------------------------------------------------------------------
def test_a_batch_of_one_image_per_class_is_refused_by_python_as_by_the_run_spec():
    with pytest.raises(ValueError, match="batch_size must be an int >= 2; got 1") as info:
        TrainingConfig(batch_size=1, samples_per_class=1)
    assert "samples_per_class must be an int >= 2; got 1" in str(info.value)
    with pytest.raises(ValueError, match="batch_size must be an int >= 2; got 1"):
        RunSpec.from_values({"batch_size": 1, "samples_per_class": 1})


def test_virtual_batch_size_alone_is_the_batch_size(parser):
    spec = parse_recipe(parser, ["--virtual_batch_size", "256", "--chunk_size", "64"])
    assert (spec.train.batch_size, spec.train.virtual_batch_size, spec.train.chunk_size) == (256, 256, 64)
    assert spec.given == {"virtual_batch_size", "chunk_size"}
    config = TrainingConfig(virtual_batch_size=256, chunk_size=64)
    assert (config.batch_size, config.virtual_batch_size) == (256, 256)
    assert RunSpec.from_values({"virtual_batch_size": 256}).train.batch_size == 256
    hub = validate_hub_config({"sampler_options": {"virtual_batch_size": 256}, "training": {"chunk_size": 64}},
                              partial=True)  # fmt: skip
    assert RunSpec.from_values(recipe_options(hub), hub).train.batch_size == 256


def test_argv_is_parsed_once_and_each_config_read_once(tmp_path, monkeypatch):
    import argparse

    from pml_suprank.training import hub_config

    config = tmp_path / "c.yaml"
    config.write_text("training: {epochs: 3}\n")
    reads, parses = [], []
    read, parse_args = hub_config.read_hub_config, argparse.ArgumentParser.parse_args
    monkeypatch.setattr(hub_config, "read_hub_config", lambda *a, **k: reads.append(a) or read(*a, **k))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                        lambda self, *a, **k: parses.append(a) or parse_args(self, *a, **k))  # fmt: skip
    argv = ["--config", str(config), "--seed", "3"]
    spec = parse(RunSpec, argv, defaults=DEFAULTS, read_config=hub_config.read_layer)
    assert spec.train.epochs == 3 and spec.given == {"epochs", "seed"}
    assert len(reads) == 1 and len(parses) == 1
