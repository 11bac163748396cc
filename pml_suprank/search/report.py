"""Results a person can look at: a self-contained HTML page and a PNG grid of queries and their top-k items, from a
list of queries ``{"name", "image" (PIL), "labels", "class_name", "ap", "ood": {"score", "is_ood"} | None,
"results": [{"rank", "index", "name", "score", "image", "labels", "class_name", "relevance"}, ...]}`` (relevance:
:func:`~pml_suprank.plots.relevance_level`). Relevance is a text mark (✓ / ~ / ✗ / ?), alt text and a coloured
border; the page inlines every thumbnail as a ``data:`` URI (one file, offline), HTML-escapes every name and wraps
long names at ``/ _ - .``.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..plots import QUERY_COLOUR, RELEVANCE_COLOURS, RELEVANCE_MARKS, framed_image

__all__ = ["query_hits", "thumbnail_data_uri", "write_html_report", "write_result_grid"]

_LABELS = {"fine": "same fine class", "coarse": "same coarse class", "other": "other class", "unknown": "no labels"}


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
figcaption .name { display: block; max-width: 10em; overflow-wrap: normal; word-break: normal; hyphens: none;
  color: #555; }
.mark { font-weight: bold; margin-right: 0.2em; }
.verdict { display: inline-block; margin: 0.3em 0 0 0; padding: 0.1em 0.5em; border-radius: 3px; font-size: 0.85em;
  font-weight: bold; border: 2px solid; }
.verdict.ood { color: #8b0000; border-color: #8b0000; background: #fde8e8; }
.verdict.known { color: #1b5e20; border-color: #1b5e20; background: #e8f5e9; }
p.guard { font-size: 0.9em; }
p.summary { margin: 0.3em 0 0 0; font-size: 0.8em; }
""" + "".join(f"li.{level} img {{ border-color: {colour}; }}\n" for level, colour in RELEVANCE_COLOURS.items())


def _name(text: Any) -> str:
    """HTML-escaped ``text`` with a line-break opportunity (``<wbr>``) after each ``/ _ - .``: a long name wraps at
    its separators, never inside a word."""
    return re.sub(r"([/_\-.])", r"\1<wbr>", html.escape(str(text)))


def query_hits(query: dict[str, Any]) -> dict[str, int]:
    """``{"shown", "fine", "coarse"}``: results shown, and those of the query's fine class / of its coarse class
    (fine included) among them; ``fine`` and ``coarse`` are absent when the relevance is unknown."""
    levels = [r.get("relevance", "unknown") for r in query["results"]]
    if not levels or "unknown" in levels:
        return {"shown": len(levels)}
    return {"shown": len(levels), "fine": levels.count("fine"), "coarse": len(levels) - levels.count("other")}


def _captions(item: dict[str, Any], thumbnail_size: int) -> tuple[str, str]:
    """``(thumbnail data URI, the class line: its class name, else its label row, else nothing)`` of an item."""
    if item.get("class_name"):
        caption = f'<span class="name class">{_name(item["class_name"])}</span>'
    elif item.get("labels") is not None:
        caption = f'<span class="name class">labels {html.escape(str(list(item["labels"])))}</span>'
    else:
        caption = ""
    return thumbnail_data_uri(item["image"], thumbnail_size), caption


def write_html_report(path: str | Path, queries: Sequence[dict[str, Any]], *, title: str = "Retrieval results",
                      thumbnail_size: int = 96, ood_guard: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """Write the HTML page of ``queries`` (see the module docstring) to ``path``; returns the path.

    Each query is a ``<section class="query">`` with an ``<ol class="results">`` of ``<li class="result LEVEL">``
    (``data-rank``, ``data-score``, ``data-index``). With ``ood_guard`` (``{"detector", "threshold"}``) each query's
    ``"ood"`` verdict is a badge (``<p class="verdict ood|known">``); without it the page says queries are unchecked.
    """
    esc = html.escape
    if ood_guard is None:
        guard_line = "No OOD guard in this model: queries are not checked for unknown kinds of images."
    else:
        threshold = float(ood_guard["threshold"])
        guard_line = (
            f"OOD guard {esc(str(ood_guard['detector']))}: a query is OOD (an unknown kind of image) when its score "
            f"&gt; {threshold:.4g}; higher score = more out-of-distribution."
        )
    legend = "".join(
        f'<span style="background:{c}">{RELEVANCE_MARKS[k]} {esc(_LABELS[k])}</span>'
        for k, c in RELEVANCE_COLOURS.items()
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_STYLE}"
        f"figure img {{ width: {int(thumbnail_size)}px; height: auto; image-rendering: pixelated; }}</style>"
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="legend">{legend}</p>',
        f'<p class="guard">{guard_line}</p>',
    ]
    for q, query in enumerate(queries):
        hits, summary, badge = query_hits(query), [], ""
        if "fine" in hits:
            summary.append(
                f"hits {hits['fine']}/{hits['shown']} same class, {hits['coarse']}/{hits['shown']} same group"
            )
        if query.get("ap") is not None:
            summary.append(f"AP {100 * float(query['ap']):.1f}")
        ood = query.get("ood") if ood_guard is not None else None
        if ood is not None:
            kind, text, sign = (
                ("ood", "OOD: unknown kind", "&gt;") if ood["is_ood"] else ("known", "known kind", "&le;")
            )
            badge = (
                f'<p class="verdict {kind}" data-ood="{str(kind == "ood").lower()}">{text} (score '
                f"{float(ood['score']):.4g} {sign} {threshold:.4g})</p>"
            )
        src, caption = _captions(query, thumbnail_size)
        parts.append(
            f'<section class="query" id="query-{q}"><figure class="query-image"><img src="{src}" '
            f'alt="query {q}: {esc(str(query["name"]))}"><figcaption>query {q}: <span class="name">'
            f"{_name(query['name'])}</span>{caption}</figcaption>"
            + (f'<p class="summary">{esc(" · ".join(summary))}</p>' if summary else "")
            + f'{badge}</figure><ol class="results">'
        )
        for r in query["results"]:
            level, rank, score = r.get("relevance", "unknown"), int(r["rank"]), float(r["score"])
            if level not in RELEVANCE_COLOURS:
                raise ValueError(f"relevance must be one of {tuple(RELEVANCE_COLOURS)}; got {level!r}")
            src, caption = _captions(r, thumbnail_size)
            parts.append(
                f'<li class="result {level}" data-rank="{rank}" data-score="{score:.6f}" data-index="{int(r["index"])}"'
                f'><figure><img src="{src}" alt="rank {rank}: {_LABELS[level]}" title="{esc(str(r["name"]))}">'
                f'<figcaption><span class="mark" title="{_LABELS[level]}">{RELEVANCE_MARKS[level]}</span>'
                f'<span class="rank">#{rank}</span> <span class="score">{score:.3f}</span>'
                f'<span class="name">{_name(r["name"])}</span>{caption}</figcaption></figure></li>'
            )
        parts.append("</ol></section>")
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


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
        cells = [(query["image"], "query", QUERY_COLOUR)] + [
            (
                r["image"],
                f"{RELEVANCE_MARKS[r['relevance']]} #{r['rank']} {r['score']:.3f}",
                RELEVANCE_COLOURS[r["relevance"]],
            )
            for r in query["results"]
        ]
        for ax, (image, caption, colour) in zip(axes[row], cells):
            framed_image(ax, image.convert("RGB"), colour)
            ax.set_title(caption, fontsize=7)
        for ax in axes[row][len(cells) :]:
            ax.axis("off")
    fig.suptitle(
        "✓ green = same fine class, ~ orange = same coarse class, ✗ red = other, ? grey = no labels", fontsize=8
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path
