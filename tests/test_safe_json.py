"""One bounded JSON reader (``pml_suprank._safe_json``) for every JSON file the package reads: size, nesting depth,
integer length and top-level type are checked, and every refusal is a ``ValueError`` naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import pml_suprank
from pml_suprank._safe_json import MAX_JSON_DEPTH, json_depth, load_json, loads_json


def test_valid_file_round_trips(tmp_path):
    value = {"a": '[[[{{{\\"[[[', "b": [[1, {"c": []}]], "n": -12345678901234567890, "x": 1.5, "t": None}
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(value))
    assert load_json(path, expected=dict) == value
    text = json.dumps(value)
    assert json_depth(text) == 5  # {, [[, {, [ (brackets inside the string do not count)
    assert loads_json(text, "x", max_depth=5) == value
    with pytest.raises(ValueError, match="x nests JSON 5 levels deep; at most 4"):
        loads_json(text, "x", max_depth=4)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000, r"nests JSON 100000 levels deep; at most 100 are allowed"),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), r"nests JSON 101 levels deep"),
        ('{"step": ' + "7" * 5000 + "}", r"is not valid JSON .*an integer of 5000 digits; at most 100"),
        ('{"step": 1', r"is not valid JSON \(corrupt state.json\): Expecting"),
        ("[1, 2]", r"must hold a JSON object \(corrupt state.json\?\); got a JSON array"),
        ("null", r"must hold a JSON object .*; got null"),
    ],
    ids=["deep", "one-too-deep", "long-int", "truncated", "array", "null"],
)
def test_bad_files_are_value_errors_naming_the_file(tmp_path, text, message):
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} .*{message}"):
        load_json(path, expected=dict)


def test_size_is_checked_before_reading_and_bytes_must_be_utf8(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(list(range(1000))))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is \d+ bytes long; a JSON big.json read here may "
                                         r"have 100"):  # fmt: skip
        load_json(path, max_bytes=100)
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match="not UTF-8 text"):
        load_json(path)
    with pytest.raises(ValueError, match="^--flag is not valid JSON"):
        loads_json("{", "--flag")


def test_every_json_read_of_the_package_goes_through_the_bounded_reader():
    # json.load / json.loads recurse without bound ("[" * 100000 -> RecursionError) and accept any size: only
    # _safe_json calls them (and hub.serialization.jsonable, which parses what json.dumps just wrote)
    root = Path(pml_suprank.__file__).parent
    found = []
    for file in sorted(root.rglob("*.py")):
        for n, line in enumerate(file.read_text().splitlines(), start=1):
            if re.search(r"\bjson\.loads?\(", line) and "json.loads(json.dumps(" not in line:
                found.append(f"{file.relative_to(root)}:{n}: {line.strip()}")
    assert [f for f in found if not f.startswith("_safe_json.py:")] == []
    assert found  # the reader itself


def test_the_depth_of_a_string_that_never_closes_is_found_in_linear_time(tmp_path):
    """``"\\"\\"\\"…`` (a quote, then escaped quotes, never closed): the string regular expression backtracked from
    every quote to the end of the text, 31 s for an 80 kB file (a 1 MB config.json: over an hour)."""
    import time

    path = tmp_path / "config.json"
    path.write_text('"' + '\\"' * 30_000)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"config.json is not valid JSON .*Unterminated string"):
        load_json(path)
    assert time.perf_counter() - start < 1.0
    escapes = ['"\\\\"', '"\\\\\\""', '"\\u005b["', '"\\\\\\\\"']  # strings ending in escaped backslashes or quotes
    for text in escapes:
        value = [json.loads(text), {"k": [text]}]
        assert json_depth(json.dumps(value)) == 3 and json_depth(text) == 0
