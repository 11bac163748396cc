"""Small configuration files cannot ask for unbounded cost: YAML aliases and deep nesting are refused while the file
is composed, oversized files before they are read, long messages are shortened, and integers that size work are
bounded."""

import math
import time

import pytest

from pml_suprank._safe_yaml import load_yaml
from pml_suprank._validation import MAX_CONFIG_INT, is_int, is_number, shorten
from pml_suprank.training import hub_config
from pml_suprank.training.config import TrainingConfig


def _alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"]']
    for i in range(1, levels):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    lines.append(f"name: [*a{levels - 1}]")
    return "\n".join(lines) + "\n"


def test_alias_chain_is_refused_at_once_with_a_short_message(tmp_path):
    """The issue's reproduction: ~500 bytes of nested aliases expanded into a 0.95 GB validation message."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert path.stat().st_size < 600
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"aliases \(\*a0\) are not allowed") as info:
        hub_config.read_hub_config(path)
    assert time.perf_counter() - start < 5
    assert len(str(info.value)) < 1000 and "bomb.yaml" in str(info.value)


def test_deep_nesting_and_oversized_files_are_refused(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ValueError, match="nesting deeper than 32 levels"):
        load_yaml(deep)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * 2_000_000 + "\n")
    with pytest.raises(ValueError, match="at most 1048576 bytes"):
        load_yaml(big)
    plain = tmp_path / "plain.yaml"
    plain.write_text("a: &x 1\nb: [1, 2, {c: 3}]\n")  # an anchor without an alias is plain YAML
    assert load_yaml(plain) == {"a": 1, "b": [1, 2, {"c": 3}]}


def test_structure_errors_are_shortened(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("name: long\nmodel: {backbone: " + "y" * 100_000 + "}\ntraining: 3\n")
    with pytest.raises(ValueError) as info:
        hub_config.read_hub_config(path)
    assert len(str(info.value)) < 5000
    assert shorten("z" * 1000, 10) == "zzzzzzzzzz... (990 more characters)"


def test_integers_that_size_work_are_bounded():
    check = is_int(1)
    assert check(MAX_CONFIG_INT) and not check(MAX_CONFIG_INT + 1)
    assert not is_int(1, 65536)(65537)
    with pytest.raises(ValueError, match="epochs must be an int >= 1; got 1000000000000"):
        TrainingConfig(epochs=10**12)
    # an int too large for a float is refused by a number's bounds, not an OverflowError
    with pytest.raises(ValueError, match=r"lr_head must be a number in \[0, 100\]; got 1000000000"):
        TrainingConfig(lr_head=10**400)
    assert is_number(-math.inf)(10**400) and not is_number(0, high=1)(-(10**400))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a: 1\nb: 2\na: 3\n", r"key 'a' is given twice in one mapping \(line 1 and line 3\)"),
        (
            "model:\n  backbone: x\n  pooling: avg\n  backbone: y\n",
            r"key 'backbone' is given twice .*line 2 and line 4",
        ),
        ("a: {b: 1, b: 1}\n", "key 'b' is given twice"),
    ],
)
def test_duplicate_keys_are_refused_naming_the_key_and_file(tmp_path, text, match):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_yaml(path)
    assert str(path) in str(info.value)


def test_duplicate_key_in_a_hub_config_is_refused(tmp_path):
    path = tmp_path / "dup_config.yaml"
    path.write_text("name: dup_config\nmodel:\n  backbone: test_resnet\ntraining:\n  epochs: 1\n  epochs: 100\n")
    with pytest.raises(ValueError, match=r"dup_config\.yaml: key 'epochs' is given twice"):
        hub_config.read_hub_config(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("training:\n  epochs: " + "9" * 5000 + "\n", r"key 'epochs' \(line 2\): an integer of 5000 digits"),
        ("a: -" + "1" * 101 + "\n", r"key 'a' \(line 1\): an integer of 101 digits; .* at most 100"),
        ("a: [1, " + "9" * 5000 + "]\n", r"a value \(line 1\): an integer of 5000 digits"),
    ],
)
def test_huge_integers_are_refused_naming_file_and_key(tmp_path, text, match):
    path = tmp_path / "ints.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_yaml(path)
    assert str(path) in str(info.value) and len(str(info.value)) < 400


def test_plain_integers_and_inline_merges_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("a: 18446744073709551616\nb: {c: 1_000, d: 0x1F}\ne: {<<: {x: 1}, y: 2}\n")
    assert load_yaml(path) == {"a": 2**64, "b": {"c": 1000, "d": 31}, "e": {"x": 1, "y": 2}}


@pytest.mark.parametrize("text", ["epochs: 0x" + "f" * 5000, "epochs: 0b" + "1" * 1000, "epochs: " + "9" * 101])
def test_a_long_integer_in_any_base_is_refused_naming_the_file(tmp_path, text):
    """A hexadecimal int was counted by its decimal digits only (the leading 0): ``0xfff…`` of 5000 digits passed
    and later failed as ``Exceeds the limit (4300 digits) for integer string conversion``, naming no file."""
    path = tmp_path / "long_int.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=r"long_int\.yaml: key 'epochs' \(line 1\): an integer of \d+ digits"):
        load_yaml(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "a: 1\nkey: [unclosed\n",
            r"bad\.yaml:3:1: invalid YAML: expected ',' or ']', but got '<stream end>' "
            r"\(while parsing a flow sequence at 2:6\)$",
        ),  # fmt: skip
        ("a:\n\tb: 1\n", r"bad\.yaml:2:1: invalid YAML: found character '\\t' that cannot start any token"),
        ("a: 1\n b: 2\n", r"bad\.yaml:2:3: invalid YAML: mapping values are not allowed here$"),
        ("a: !!python/object x\n", r"bad\.yaml:1:4: invalid YAML: could not determine a constructor for the tag"),
        ("a: 1\nb: x\x01y\n", r"bad\.yaml:2:5: invalid YAML: character #x0001: special characters are not allowed$"),
    ],
    ids=["unclosed", "tab", "indent", "python_tag", "control_character"],
)
def test_invalid_yaml_is_one_line_naming_file_line_and_column(tmp_path, text, match):
    """PyYAML's message is several lines (its marks, ``in "<unicode string>"``); a --config refusal is one line:
    the file, line:column (1-based) and the problem. A control character was a ReaderError that escaped."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_yaml(path)
    assert str(info.value).startswith(str(path)) and len(str(info.value).splitlines()) == 1
    assert "unicode string" not in str(info.value)
