"""Results a person can look at: a self-contained HTML page and a PNG grid of queries and their top-k items.

Both take the same description of the results, a list of queries::

    {"name": str, "image": PIL image, "labels": list[int] | None,
     "class_name": str | None, "ap": float | None,          # optional: the query's class name, its AP in the gallery
     "results": [{"rank": int, "index": int, "name": str, "score": float, "image": PIL image,
                  "labels": list[int] | None, "class_name": str | None,
                  "relevance": "fine" | "coarse" | "other" | "unknown"}, ...]}

``name`` is what identifies an item to a person (a file path relative to its folder, or a dataset id), ``class_name``
its class as the data names it (e.g. ``"Greek/character03"``). Each query's row also shows its hits — results of the
same fine class, and of the same coarse class, among those shown — and, when given, its average precision over the
whole gallery.

The relevance of a result to its query (:func:`relevance_level`) is read from their label rows (column 0 finest, last
coarsest): ``"fine"`` = same fine class, ``"coarse"`` = same coarsest class only, ``"other"``; ``"unknown"`` when
either side has no labels. The HTML page inlines every thumbnail as a ``data:image/png;base64`` URI, so it is one file
that works offline and can be moved anywhere.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RELEVANCE_COLOURS",
    "query_hits",
    "relevance_level",
    "thumbnail_data_uri",
    "write_html_report",
    "write_result_grid",
]

#: border colour of each relevance level (the colours of :func:`pml_suprank.plots.plot_retrieval_grid`)
RELEVANCE_COLOURS = {"fine": "#2ca02c", "coarse": "#ff7f0e", "other": "#d62728", "unknown": "#7f7f7f"}
_LABELS = {"fine": "same fine class", "coarse": "same coarse class", "other": "other", "unknown": "no labels"}


def relevance_level(query_labels: Sequence[int] | None, item_labels: Sequence[int] | None) -> str:
    """``"fine"``, ``"coarse"``, ``"other"`` or ``"unknown"`` for two label rows (column 0 finest, last coarsest)."""
    if query_labels is None or item_labels is None:
        return "unknown"
    if len(query_labels) != len(item_labels):
        raise ValueError(f"label rows must have the same length; got {list(query_labels)} and {list(item_labels)}")
    if query_labels[0] == item_labels[0]:
        return "fine"
    if len(query_labels) > 1 and query_labels[-1] == item_labels[-1]:
        return "coarse"
    return "other"


def thumbnail_data_uri(image: Any, size: int = 96) -> str:
    """A PIL image as a ``data:image/png;base64,...`` URI of a thumbnail whose longer side is at most ``size`` (small
    images are kept as they are; the page scales them up)."""
    thumb = image.convert("RGB").copy()
    thumb.thumbnail((size, size))
    buffer = io.BytesIO()
    thumb.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; background: #fafafa; color: #222; }
.legend span { display: inline-block; padding: 0.1em 0.6em; margin-right: 0.6em; color: white; border-radius: 3px; }
section.query { display: flex; align-items: flex-start; gap: 1em; margin: 1em 0; padding: 0.6em;
  background: white; border: 1px solid #ddd; }
figure { margin: 0; text-align: center; font-size: 0.75em; }
figure img { display: block; border: 4px solid #1f77b4; }
ol.results { display: flex; flex-wrap: wrap; gap: 0.5em; list-style: none; padding: 0; margin: 0; }
ol.results img { display: block; border: 4px solid; }
figcaption .name { display: block; max-width: 9em; overflow-wrap: anywhere; color: #555; }
p.summary { margin: 0.3em 0 0 0; font-size: 0.8em; }
""" + "".join(f"li.{level} img {{ border-color: {colour}; }}\n" for level, colour in RELEVANCE_COLOURS.items())


def write_html_report(path: str | Path, queries: Sequence[dict[str, Any]], *, title: str = "Retrieval results",
                      thumbnail_size: int = 96) -> Path:  # fmt: skip
    """Write the HTML page of ``queries`` (see the module docstring) to ``path``; returns the path.

    Each query is a ``<section class="query">`` with its image and an ``<ol class="results">`` of ``<li>`` items
    (class = relevance level; ``data-rank``, ``data-score``, ``data-index`` attributes; rank and score as text).
    """
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{_STYLE}"
        f"figure img {{ width: {int(thumbnail_size)}px; height: auto; image-rendering: pixelated; }}</style>"
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
        '<p class="legend">'
        + "".join(f'<span style="background:{c}">{esc(_LABELS[k])}</span>' for k, c in RELEVANCE_COLOURS.items())
        + "</p>",
    ]
    for q, query in enumerate(queries):
        parts.append(f'<section class="query" id="query-{q}">')
        parts.append(
            f'<figure class="query-image"><img src="{thumbnail_data_uri(query["image"], thumbnail_size)}" '
            f'alt="query {q}"><figcaption>query {q}: <span class="name">{esc(str(query["name"]))}</span>'
            f"{_class_caption(query)}</figcaption>{_summary(query)}</figure>"
        )
        parts.append('<ol class="results">')
        for r in query["results"]:
            level = r.get("relevance", "unknown")
            if level not in RELEVANCE_COLOURS:
                raise ValueError(f"relevance must be one of {tuple(RELEVANCE_COLOURS)}; got {level!r}")
            parts.append(
                f'<li class="result {level}" data-rank="{int(r["rank"])}" data-score="{float(r["score"]):.6f}" '
                f'data-index="{int(r["index"])}"><figure><img src="{thumbnail_data_uri(r["image"], thumbnail_size)}" '
                f'alt="rank {int(r["rank"])}" title="{esc(str(r["name"]))}"><figcaption>'
                f'<span class="rank">#{int(r["rank"])}</span> <span class="score">{float(r["score"]):.3f}</span>'
                f'<span class="name">{esc(str(r["name"]))}</span>{_class_caption(r)}</figcaption></figure></li>'
            )
        parts.append("</ol></section>")
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _class_caption(item: dict[str, Any]) -> str:
    """The item's class name (else its label row) as a caption line, or nothing."""
    if item.get("class_name"):
        return f'<span class="name class">{html.escape(str(item["class_name"]))}</span>'
    if item.get("labels") is not None:
        return f'<span class="name class">labels {html.escape(str(list(item["labels"])))}</span>'
    return ""


def query_hits(query: dict[str, Any]) -> dict[str, int]:
    """``{"shown", "fine", "coarse"}``: results shown, and those of the query's fine class / of its coarse class
    (fine included) among them; ``fine`` and ``coarse`` are absent when the relevance is unknown."""
    results = query["results"]
    levels = [r.get("relevance", "unknown") for r in results]
    out = {"shown": len(results)}
    if results and "unknown" not in levels:
        out["fine"] = levels.count("fine")
        out["coarse"] = levels.count("fine") + levels.count("coarse")
    return out


def _summary(query: dict[str, Any]) -> str:
    hits = query_hits(query)
    parts = []
    if "fine" in hits:
        parts.append(f"hits {hits['fine']}/{hits['shown']} same class, {hits['coarse']}/{hits['shown']} same group")
    if query.get("ap") is not None:
        parts.append(f"AP {100 * float(query['ap']):.1f}")
    return f'<p class="summary">{html.escape(" · ".join(parts))}</p>' if parts else ""


def write_result_grid(path: str | Path, queries: Sequence[dict[str, Any]], *, dpi: int = 100) -> Path:
    """Write a PNG grid: one row per query (its image first, blue border), then its results with a border coloured by
    relevance level and ``#rank score`` above each; returns the path."""
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, no backend switch

    if not queries:
        raise ValueError("queries must not be empty")
    cols = 1 + max(len(q["results"]) for q in queries)
    fig = Figure(figsize=(1.3 * cols, 1.45 * len(queries)), dpi=dpi)
    axes = fig.subplots(len(queries), cols, squeeze=False)
    for row, query in enumerate(queries):
        cells = [(query["image"], "query", "#1f77b4")]
        for r in query["results"]:
            cells.append((r["image"], f"#{r['rank']} {r['score']:.3f}", RELEVANCE_COLOURS[r["relevance"]]))
        for col in range(cols):
            ax = axes[row, col]
            ax.set_xticks([])
            ax.set_yticks([])
            if col >= len(cells):
                ax.axis("off")
                continue
            image, caption, colour = cells[col]
            ax.imshow(image.convert("RGB"))
            ax.set_title(caption, fontsize=7)
            for spine in ax.spines.values():
                spine.set_edgecolor(colour)
                spine.set_linewidth(3)
    fig.suptitle("green = same fine class, orange = same coarse class, red = other, grey = no labels", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path
