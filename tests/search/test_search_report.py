"""The HTML page and the PNG grid of pml_suprank.search.report: structure, inlined images, relevance colours."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from _html_checks import parse_report
from PIL import Image

from pml_suprank.plots import RELEVANCE_COLOURS, relevance_level
from pml_suprank.search.report import write_html_report, write_result_grid


def _img(colour, size=12):
    return Image.new("RGB", (size, size), colour)


def _queries():
    levels = ["fine", "coarse", "other", "unknown"]
    return [
        {
            "name": f"q<{q}>",  # escaped in the page
            "image": _img((0, 0, 255)),
            "labels": [q, 0],
            "results": [
                {
                    "rank": r + 1,
                    "index": 10 * q + r,
                    "name": f"item {r}",
                    "score": 1.0 - 0.1 * r,
                    "image": _img((40 * r, 80, 0)),
                    "labels": None,
                    "relevance": levels[(q + r) % 4],
                }
                for r in range(3)
            ],
        }  # fmt: skip
        for q in range(2)
    ]


def test_relevance_level():
    assert relevance_level([1, 0], [1, 0]) == "fine"
    assert relevance_level([1, 0], [2, 0]) == "coarse"
    assert relevance_level([1, 0], [2, 1]) == "other"
    assert relevance_level([1], [2]) == "other"  # one level: no coarse class
    assert relevance_level(None, [1, 0]) == "unknown"
    with pytest.raises(ValueError, match="same length"):
        relevance_level([1, 0], [1])


def test_html_page_structure(tmp_path):
    queries = _queries()
    path = write_html_report(tmp_path / "r.html", queries, title="T & <t>")
    page = parse_report(path.read_text())
    assert page["title"] == "T & <t>" and len(page["queries"]) == 2
    for q, parsed in zip(queries, page["queries"], strict=True):
        assert q["name"] in parsed["caption"]
        assert [r["rank"] for r in parsed["results"]] == [1, 2, 3]
        assert [r["relevance"] for r in parsed["results"]] == [r["relevance"] for r in q["results"]]
        assert [r["index"] for r in parsed["results"]] == [r["index"] for r in q["results"]]
        assert [r["score"] for r in parsed["results"]] == pytest.approx([r["score"] for r in q["results"]])
    # every image is inlined (offline page) and decodes as a PNG
    assert page["external_refs"] == [] and len(page["images"]) == 2 * 4
    for src in page["images"]:
        assert src.startswith("data:image/png;base64,")
        Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).verify()
    with pytest.raises(ValueError, match="relevance must be one of"):
        bad = _queries()
        bad[0]["results"][0]["relevance"] = "close"
        write_html_report(tmp_path / "bad.html", bad)


def test_png_grid(tmp_path):
    path = write_result_grid(tmp_path / "g.png", _queries())
    with Image.open(path) as img:
        rgb = img.convert("RGB")
        assert rgb.width > 200 and rgb.height > 100
        colours = {tuple(c) for c in np.unique(np.asarray(rgb).reshape(-1, 3), axis=0).tolist()}
    for level in ("fine", "coarse", "other", "unknown"):  # each border colour is drawn
        target = tuple(int(RELEVANCE_COLOURS[level][i : i + 2], 16) for i in (1, 3, 5))
        assert any(sum(abs(a - b) for a, b in zip(c, target)) < 12 for c in colours), level


def test_page_names_files_and_classes_and_summarises_each_query(tmp_path):
    queries = _queries()
    queries[0]["class_name"], queries[0]["ap"] = "Greek/character03", 0.625
    queries[0]["results"][0]["class_name"] = "Greek/character03"
    for r in queries[1]["results"]:
        r["relevance"] = "fine" if r["rank"] == 1 else "other"
    queries[1]["results"][0]["name"] = "gallery/Greek/character03/0042_07.png"
    page = parse_report(write_html_report(tmp_path / "r.html", queries).read_text())
    first, second = page["queries"]
    assert "Greek/character03" in first["caption"] and "AP 62.5" in first["summary"]
    assert "Greek/character03" in first["results"][0]["caption"] and "item 0" in first["results"][0]["caption"]
    assert "labels [1, 0]" in second["caption"]  # no class name: the label row
    assert "gallery/Greek/character03/0042_07.png" in second["results"][0]["caption"]
    assert "hits 1/3 same class, 1/3 same group" in second["summary"]
    assert first["summary"] == "hits 1/3 same class, 2/3 same group · AP 62.5"
    unknown = parse_report(write_html_report(tmp_path / "u.html", _queries()[1:]).read_text())["queries"][0]
    assert unknown["summary"] == ""  # a result of unknown relevance: no hit count, no AP given


def test_relevance_is_text_not_only_colour_and_names_wrap_between_words(tmp_path):
    """Issue 40: a ✓ / ~ / ✗ mark and alt text per result, a viewport meta, names that wrap at separators only;
    issue 38: the guard's verdict as a text badge, or one line saying there is no guard."""
    from pml_suprank.search.report import RELEVANCE_MARKS

    queries = _queries()
    queries[0]["name"] = "Greek/character03/very_long-file.name.png"
    queries[0]["ood"], queries[1]["ood"] = {"score": 3.0, "is_ood": True}, {"score": 0.5, "is_ood": False}
    text = write_html_report(tmp_path / "g.html", queries, ood_guard={"detector": "HEAT", "threshold": 1.0}).read_text()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text
    assert "anywhere" not in text and "break-all" not in text  # no mid-word breaks
    assert "Greek/<wbr>character03/<wbr>very_<wbr>long-<wbr>file.<wbr>name.<wbr>png" in text
    page = parse_report(text)
    for q, parsed in zip(queries, page["queries"], strict=True):
        for r, p in zip(q["results"], parsed["results"], strict=True):
            assert p["caption"].startswith(RELEVANCE_MARKS[r["relevance"]])  # the mark is text, read first
    for level, label in (("fine", "same fine class"), ("coarse", "same coarse class"), ("other", "other class")):
        assert 'alt="rank' in text and f': {label}"' in text, level
    assert text.count('class="verdict ood"') == 1 and text.count('class="verdict known"') == 1
    assert "OOD: unknown kind (score 3 &gt; 1)" in text and "known kind (score 0.5 &le; 1)" in text
    plain = write_html_report(tmp_path / "p.html", queries).read_text()
    assert plain.count("No OOD guard") == 1 and 'class="verdict' not in plain
