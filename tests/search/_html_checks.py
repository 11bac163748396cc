"""Parse a results page of pml_suprank.search.report with the standard library's html.parser (tests only)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _ReportParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.queries: list[dict[str, Any]] = []
        self.images: list[str] = []
        self.external_refs: list[str] = []
        self._stack: list[str] = []
        self._in_query_caption = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag not in _VOID:  # void elements (img, wbr, meta, ...) have no end tag
            self._stack.append(tag)
        classes = (a.get("class") or "").split()
        for key in ("src", "href"):
            value = a.get(key)
            if value is not None:
                if tag == "img":
                    self.images.append(value)
                if not value.startswith(("data:", "#")):
                    self.external_refs.append(value)
        if tag == "section" and "query" in classes:
            self.queries.append({"id": a.get("id"), "caption": "", "summary": "", "results": []})
        elif tag == "figure" and "query-image" in classes:
            self._in_query_caption = True
        elif tag == "li" and "result" in classes:
            level = next(c for c in classes if c != "result")
            self.queries[-1]["results"].append(
                {"rank": int(a["data-rank"]), "score": float(a["data-score"]), "index": int(a["data-index"]),
                 "relevance": level, "caption": ""}
            )  # fmt: skip

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._in_query_caption = False
        if self._stack:
            self._stack.pop()

    def handle_data(self, data: str) -> None:
        if self._stack and self._stack[-1] == "title":
            self.title += data
        elif self._in_query_caption and "figcaption" in self._stack:
            self.queries[-1]["caption"] += data
        elif self._in_query_caption and self._stack and self._stack[-1] == "p":
            self.queries[-1]["summary"] += data
        elif "figcaption" in self._stack and self.queries and self.queries[-1]["results"]:
            self.queries[-1]["results"][-1]["caption"] += data


def parse_report(text: str) -> dict[str, Any]:
    """``{"title", "queries": [{"id", "caption", "summary", "results": [{"rank", "score", "index", "relevance",
    "caption"}]}], "images":
    [img src...], "external_refs": [src/href not inlined]}``."""
    parser = _ReportParser()
    parser.feed(text)
    parser.close()
    return {"title": parser.title, "queries": parser.queries, "images": parser.images,
            "external_refs": parser.external_refs}  # fmt: skip
