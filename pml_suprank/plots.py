"""Figures of a trained retrieval model (matplotlib, ``Agg`` backend), written by :func:`plot_all` at :data:`DPI`.

Precision–recall curves (the test set searched against itself; per hierarchy level as in HAPPIER, Ramzi et al., ECCV
2022, Sec. 4), a 2-D map of the class-mean embeddings (t-SNE when scikit-learn is installed, else PCA; HAPPIER
Fig. 6), the training curves of ``history.json`` and a grid of queries with their top-k results (✓ same fine class,
~ same coarse class only, ✗ other). Text from the data is drawn literally (a ``$`` never starts mathtext).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._validation import check_choice, check_embeddings, check_labels, check_positive_int
from .metrics.report import headline_keys, metric_label

__all__ = [
    "plot_all",
    "plot_training_curves",
    "plot_embedding_map",
    "plot_hierarchical_precision_recall",
    "plot_precision_recall",
    "plot_retrieval_grid",
    "precision_recall_curve",
]

#: border colour of each relevance level of a result to its query (:func:`relevance_level`)
RELEVANCE_COLOURS = {"fine": "#2ca02c", "coarse": "#ff7f0e", "other": "#d62728", "unknown": "#7f7f7f"}
#: the text mark of each relevance level (colour is never the only cue)
RELEVANCE_MARKS = {"fine": "✓", "coarse": "~", "other": "✗", "unknown": "?"}
QUERY_COLOUR = "#1f77b4"
#: resolution of every figure
DPI = 150


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


def framed_image(ax: Any, image: Any, colour: str, width: float = 3) -> None:
    """Show ``image`` on the axes ``ax`` without ticks, framed in ``colour``."""
    ax.imshow(image)
    ax.set(xticks=[], yticks=[])
    for spine in ax.spines.values():
        spine.set_edgecolor(colour)
        spine.set_linewidth(width)


def literal(text: Any) -> str:
    """``text`` drawn as it is by matplotlib: ``$`` escaped (no mathtext), control characters as spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in str(text)).replace("$", r"\$")


def _class_name(names: Mapping[int, Any] | None, label: int, max_chars: int = 28, drop_head: bool = False) -> str:
    """The display name of fine label ``label`` (else the id), without its first path component (the coarse class)
    with ``drop_head``, cut from the left to ``max_chars`` (the end of a name is its most specific part)."""
    name = str(names.get(int(label), int(label))) if names else str(int(label))
    if drop_head and "/" in name:
        name = name.split("/", 1)[1]
    return literal(name if len(name) <= max_chars else "…" + name[-(max_chars - 1) :])


def _group_names(
    fine: np.ndarray, coarse: np.ndarray, class_names: Mapping[int, Any] | None, column: str
) -> dict[int, str]:
    """A name per coarse label: the common first path component of its fine classes' names (``"circle"`` for
    ``"circle/small/red"``) when there is one, else ``"<column> <id>"``."""
    out: dict[int, str] = {}
    for c in np.unique(coarse):
        names = [str(class_names.get(int(f), "")) for f in np.unique(fine[coarse == c])] if class_names else []
        heads = {n.split("/")[0] for n in names}
        named = len(heads) == 1 and all(heads) and all("/" in n for n in names)
        out[int(c)] = literal(heads.pop()) if named else f"{literal(column)} {int(c)}"
    return out


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the ``Agg`` backend (unless one was chosen already)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _as_2d_labels(labels: Tensor) -> Tensor:
    return labels[:, None] if labels.dim() == 1 else labels


def _query_subset(n: int, max_queries: int | None, seed: int) -> Tensor:
    if max_queries is None or n <= max_queries:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:max_queries].sort().values


def save_figure(fig: Any, path: str | Path, *, dpi: int = DPI, top: float = 1.0) -> Path:
    """Lay out ``fig`` (its axes below the height fraction ``top``), write it to ``path`` and close it."""
    fig.tight_layout(rect=(0, 0, 1, top))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def precision_recall_curve(
    embeddings: Tensor,
    labels: Tensor,
    level: int = 0,
    num_points: int = 101,
    max_queries: int | None = 1000,
    seed: int = 0,
    chunk_size: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean interpolated precision (the best precision at any recall ``>= r``) at ``num_points`` recalls in ``[0, 1]``.

    Every query (a seeded subset of at most ``max_queries``) ranks all other items of ``embeddings`` ``(N, D)`` by
    cosine similarity (ties: less relevant first); positives share the label of column ``level`` of ``labels``
    ``(N,)`` / ``(N, L)``; queries without positives are skipped. Returns ``(recall, precision)``, ``(num_points,)``
    numpy arrays.
    """
    return _pr_curve_and_ap(embeddings, labels, level, num_points, max_queries, seed, chunk_size)[:2]


def _pr_curve_and_ap(
    embeddings: Tensor, labels: Tensor, level: int, num_points: int, max_queries: int | None, seed: int, chunk_size: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """:func:`precision_recall_curve` plus the mean exact (non-interpolated) AP of the same queries — the card's
    ``ap`` when every query is used (``max_queries >= N``)."""
    check_embeddings("embeddings", embeddings)
    labels = _as_2d_labels(check_labels("labels", labels, embeddings.shape[0]))
    if not 0 <= level < labels.shape[1]:
        raise ValueError(
            f"level must lie in [0, {labels.shape[1] - 1}] for labels with {labels.shape[1]} columns; got {level}"
        )
    emb = embeddings.detach().float().cpu()
    lab = labels[:, level].cpu()
    n = emb.shape[0]
    queries = _query_subset(n, max_queries, seed)
    grid = np.linspace(0.0, 1.0, num_points)
    total, count, ap_sum = np.zeros(num_points), 0, 0.0
    for start in range(0, len(queries), chunk_size):
        q = queries[start : start + chunk_size]
        scores = (emb[q] @ emb.T).numpy()
        scores[np.arange(len(q)), q.numpy()] = -np.inf  # the query itself goes last and is dropped
        rel = (lab[q][:, None] == lab[None, :]).float().numpy()
        # pessimistic ties: sort by score desc, then relevance asc
        rel_sorted = np.take_along_axis(rel, np.lexsort((rel, -scores), axis=-1)[:, : n - 1], axis=1)
        has_pos = rel_sorted.sum(axis=1) > 0  # queries without positives are skipped
        rel_sorted = rel_sorted[has_pos]
        npos, tp = rel_sorted.sum(axis=1, keepdims=True), np.cumsum(rel_sorted, axis=1)
        precision = tp / np.arange(1, n)
        interp = np.flip(np.maximum.accumulate(np.flip(precision, axis=1), axis=1), axis=1)
        for row, recall in zip(interp, tp / npos):
            total += row[np.searchsorted(recall, grid, side="left").clip(max=n - 2)]
        ap_sum += float(((precision * rel_sorted).sum(axis=1) / npos[:, 0]).sum())
        count += len(rel_sorted)
    if count == 0:
        raise ValueError("no query has a positive at this level; cannot draw a precision-recall curve")
    return grid, total / count, ap_sum / count


def plot_precision_recall(
    embeddings: Tensor,
    labels: Tensor,
    path: str | Path,
    compare: dict[str, Tensor] | None = None,
    level: int = 0,
    max_queries: int | None = 1000,
    seed: int = 0,
    title: str = "Precision-recall (fine classes)",
) -> Path:
    """Save the interpolated precision–recall curve of ``embeddings`` (``"trained"``) and of every entry of
    ``compare`` (e.g. ``{"before training": ...}``) to ``path``; the legend gives each curve's mAP (mean exact AP of
    the plotted queries, in percent: with every query plotted, the model card's mAP)."""
    n = int(embeddings.shape[0])
    queries = n if max_queries is None else min(n, max_queries)
    title = f"{literal(title)}\ninterpolated precision, {queries} of {n} queries"
    curves = {"trained": embeddings, **(compare or {})}
    return _pr_figure(curves, labels, path, {level: None}, max_queries, seed, title, (5, 4), 8)


def plot_hierarchical_precision_recall(
    embeddings: Tensor,
    labels: Tensor,
    path: str | Path,
    label_names: Sequence[str] | None = None,
    compare: dict[str, Tensor] | None = None,
    max_queries: int | None = 1000,
    seed: int = 0,
) -> Path:
    """One precision–recall curve per hierarchy level (positives share the label of column ``l``), solid for
    ``embeddings`` and dashed for each entry of ``compare``, each with its mAP (mean exact AP of the plotted queries,
    in percent) in the legend; saved to ``path``."""
    labels = _as_2d_labels(check_labels("labels", labels, embeddings.shape[0]))
    names = list(label_names) if label_names is not None else [f"level {l}" for l in range(labels.shape[1])]
    if len(names) != labels.shape[1]:
        raise ValueError(f"label_names must have {labels.shape[1]} entries (one per column); got {len(names)}")
    curves, title = {"trained": embeddings, **(compare or {})}, "Hierarchical precision-recall (per level)"
    return _pr_figure(curves, labels, path, dict(enumerate(names)), max_queries, seed, title, (5.5, 4.2), 7)


def _pr_figure(curves, labels, path, levels, max_queries, seed, title, figsize, fontsize) -> Path:
    """A curve per ``curves`` ``{name: (N, D)}`` and ``levels`` ``{column: name}`` (``{column: None}``: a colour per
    curve; else a colour per level, a line style per curve), each with its mAP in the legend; saved to ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    colours, styles = plt.rcParams["axes.prop_cycle"].by_key()["color"], ["-", "--", ":", "-."]
    for j, (cname, emb) in enumerate(curves.items()):
        for l, lname in levels.items():
            r, p, ap = _pr_curve_and_ap(emb, labels, l, 101, max_queries, seed, 256)
            style = {} if lname is None else {"color": colours[l % len(colours)], "ls": styles[j % len(styles)]}
            name = literal(cname) if lname is None else f"{literal(lname)} ({literal(cname)})"
            ax.plot(r, p, label=f"{name}: mAP {100 * ap:.2f}", **style)
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=fontsize)
    return save_figure(fig, path)


def _project_2d(x: np.ndarray, method: str, seed: int) -> tuple[np.ndarray, str]:
    if method in ("auto", "tsne") and x.shape[0] >= 5:
        try:
            from sklearn.manifold import TSNE

            perplexity = float(min(30.0, max(2.0, (x.shape[0] - 1) / 3.0)))
            method = "exact" if x.shape[0] <= 300 else "barnes_hut"  # few points: exact is cheap
            tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed, method=method)
            return tsne.fit_transform(x), "t-SNE"
        except ImportError:
            if method == "tsne":
                raise
    xc = x - x.mean(axis=0, keepdims=True)
    if x.shape[0] < 2:
        return np.zeros((x.shape[0], 2)), "PCA"
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    proj = xc @ vt[:2].T
    return np.pad(proj, ((0, 0), (0, 2 - proj.shape[1]))), "PCA"  # (N, 2) even from 1-D embeddings


def plot_embedding_map(
    embeddings: Tensor,
    labels: Tensor,
    path: str | Path,
    label_names: Sequence[str] | None = None,
    method: str = "auto",
    seed: int = 0,
    max_points: int = 1000,
    class_names: Mapping[int, Any] | None = None,
    max_named: int = 40,
) -> Path:
    """2-D map (``method``: ``"auto"`` = t-SNE when scikit-learn is installed, else PCA; ``"tsne"``; ``"pca"``) of at
    most ``max_points`` sample embeddings (dots) and every fine-class mean (circles), coloured by coarse class (last
    column, named by the common first path component of its classes' ``class_names``); with at most ``max_named`` fine
    classes every class mean is labelled with its name."""
    check_embeddings("embeddings", embeddings)
    labels = _as_2d_labels(check_labels("labels", labels, embeddings.shape[0]))
    check_choice("method", method, ("auto", "tsne", "pca"))
    check_positive_int("max_points", max_points, minimum=0)
    emb = embeddings.detach().float().cpu()
    fine, coarse = labels[:, 0].cpu(), labels[:, -1].cpu()
    classes, inverse = torch.unique(fine, return_inverse=True)
    means = torch.zeros(len(classes), emb.shape[1]).index_add_(0, inverse, emb)
    means = torch.nn.functional.normalize(means, dim=1).numpy()
    class_coarse = torch.zeros(len(classes), dtype=torch.long).index_copy_(0, inverse, coarse).numpy()
    sample = _query_subset(emb.shape[0], max_points, seed).numpy()
    xy, used = _project_2d(np.concatenate([emb[sample].numpy(), means]), method, seed)
    xy_samples, xy_means = xy[: len(sample)], xy[len(sample) :]
    sample_coarse = coarse[sample].numpy()
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5.5))
    coarse_ids = np.unique(class_coarse)
    cmap = plt.get_cmap("tab10" if len(coarse_ids) <= 10 else "tab20")
    column = label_names[-1] if label_names else "coarse class"
    group = _group_names(classes.numpy(), class_coarse, class_names, column)
    for j, c in enumerate(coarse_ids):
        colour = cmap(j % cmap.N)
        pts = sample_coarse == c
        ax.scatter(xy_samples[pts, 0], xy_samples[pts, 1], s=6, color=colour, alpha=0.45, linewidth=0)
        sel = class_coarse == c
        label = group[int(c)] if j < 12 else None  # a legend of at most 12 entries
        ax.scatter(xy_means[sel, 0], xy_means[sel, 1], s=42, color=colour, label=label, edgecolor="k", linewidth=0.6)
    if len(classes) <= max_named:
        for (x, y), f in zip(xy_means, classes.tolist()):
            name = _class_name(class_names, f, max_chars=20, drop_head=True)
            ax.annotate(name, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=6, alpha=0.85)
    more = f"; legend: first 12 of {len(coarse_ids)}" if len(coarse_ids) > 12 else ""
    ax.set(xticks=[], yticks=[])
    ax.set_title(
        f"Embeddings ({used}): {len(sample)} samples (dots), {len(classes)} class means (circles){more}", fontsize=9
    )
    ax.legend(fontsize=7, loc="best", markerscale=0.8, title=f"coloured by {literal(column)}", title_fontsize=7)
    return save_figure(fig, path)


def _image_array(dataset: Any, index: int, mean: Sequence[float] | None, std: Sequence[float] | None) -> np.ndarray:
    if hasattr(dataset, "get_image"):
        img = dataset.get_image(index)
        return np.asarray(img.convert("RGB") if hasattr(img, "convert") else img)
    t = dataset[index]["image"].detach().float().cpu()
    if mean is not None and std is not None:
        t = t * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
    return t.clamp(0, 1).permute(1, 2, 0).numpy()


def plot_retrieval_grid(
    embeddings: Tensor,
    labels: Tensor,
    dataset: Any,
    path: str | Path,
    num_queries: int = 6,
    top_k: int = 8,
    indices: Tensor | None = None,
    seed: int = 0,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    class_names: Mapping[int, Any] | None = None,
) -> Path:
    """Grid of ``num_queries`` random queries and their ``top_k`` nearest items, each with a border, a text mark (✓
    same fine class, ~ same coarse class only, ✗ other) and its fine class name (``class_names``, default
    ``dataset.class_names``). Pictures: ``dataset.get_image(i)`` or ``dataset[i]["image"]`` (denormalised by ``mean`` /
    ``std``); ``indices``: the dataset index of every embedding row."""
    check_embeddings("embeddings", embeddings)
    labels = _as_2d_labels(check_labels("labels", labels, embeddings.shape[0]))
    n = embeddings.shape[0]
    if n < 2:
        raise ValueError(f"embeddings must have at least 2 rows for a retrieval grid; got {n}")
    top_k = min(int(top_k), n - 1)
    names = class_names if class_names is not None else getattr(dataset, "class_names", None)
    idx = indices.cpu() if indices is not None else torch.arange(n)
    emb = embeddings.detach().float().cpu()
    queries = _query_subset(n, num_queries, seed)
    scores = emb[queries] @ emb.T
    scores[torch.arange(len(queries)), queries] = -float("inf")
    top = scores.topk(top_k, dim=1).indices
    fig, axes = pyplot().subplots(
        len(queries), top_k + 1, figsize=(1.45 * (top_k + 1), 1.7 * len(queries) + 0.4), squeeze=False
    )
    rows = labels.tolist()
    for row, q in enumerate(queries.tolist()):
        cells = [(q, None)] + [(j, relevance_level(rows[q], rows[j])) for j in top[row].tolist()]
        for col, (j, rel) in enumerate(cells):
            ax = axes[row, col]
            colour = QUERY_COLOUR if rel is None else RELEVANCE_COLOURS[rel]
            framed_image(ax, _image_array(dataset, int(idx[j]), mean, std), colour, 3 if rel is not None else 1.5)
            name = _class_name(names, int(labels[j, 0]), max_chars=18)
            mark = "query" if rel is None else RELEVANCE_MARKS[rel]
            ax.set_xlabel(f"{mark} {name}", fontsize=6, color=colour if rel is not None else "black")
            if row == 0:
                ax.set_title("query" if col == 0 else f"#{col}", fontsize=8)
    fig.suptitle("Retrieval: ✓ green = same fine class, ~ orange = same coarse class only, ✗ red = other", fontsize=9)
    return save_figure(fig, path)


def plot_all(
    embeddings: Tensor,
    labels: Tensor,
    directory: str | Path,
    label_names: Sequence[str] | None = None,
    image_dataset: Any = None,
    indices: Tensor | None = None,
    compare: dict[str, Tensor] | None = None,
    seed: int = 0,
    max_queries: int | None = 1000,
    class_names: Mapping[int, Any] | None = None,
) -> list[str]:
    """Write ``precision_recall.png``, ``hierarchical_precision_recall.png``, ``embedding_map.png`` and (when
    ``image_dataset`` is given) ``retrieval_grid.png`` into ``directory``; return the file names.

    ``class_names`` (``{fine label: name}``) default to ``image_dataset.class_names``."""
    if class_names is None:
        class_names = getattr(image_dataset, "class_names", None)
    out, emb, labels = Path(directory), embeddings, _as_2d_labels(labels)
    out.mkdir(parents=True, exist_ok=True)
    pr = {"compare": compare, "max_queries": max_queries, "seed": seed}
    files = [
        plot_precision_recall(emb, labels, out / "precision_recall.png", **pr),
        plot_hierarchical_precision_recall(emb, labels, out / "hierarchical_precision_recall.png", label_names, **pr),
        plot_embedding_map(emb, labels, out / "embedding_map.png", label_names, seed=seed, class_names=class_names),
    ]
    if image_dataset is not None:
        kw = {"indices": indices, "seed": seed, "class_names": class_names}
        files.append(plot_retrieval_grid(emb, labels, image_dataset, out / "retrieval_grid.png", **kw))
    return [f.name for f in files]


def _series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of the finite numeric ``key`` entries of ``history``."""
    pts = [
        (float(r["step"]), float(r[key]))
        for r in history
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and np.isfinite(float(r[key]))
    ]
    arr = np.asarray(pts, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def plot_training_curves(
    history: Sequence[Mapping[str, Any]],
    path: str | Path,
    label_names: Sequence[str] | None = None,
    max_metrics: int = 6,
) -> Path:
    """Save up to three panels over the optimizer steps of ``history`` (the run's records, each with a ``"step"``):
    the training loss, every parameter group's learning rate, and at most ``max_metrics`` headline test metrics
    (percent; ``label_names`` names the per-level ones).

    Raises:
        ValueError: ``history`` holds no logged loss, learning rate or metric.
    """
    if not isinstance(history, Sequence) or not all(isinstance(r, Mapping) and "step" in r for r in history):
        raise ValueError("history must be a list of records, each a mapping with a 'step' (history.json)")
    keys = list(dict.fromkeys(k for r in history for k in r))
    lrs = [k for k in keys if k.startswith("lr_")]
    metrics = {k[len("eval/") :]: 0.0 for k in keys if k.startswith("eval/") and not k.startswith("eval/num_")}
    shown = headline_keys(metrics)[:max_metrics] if metrics else []
    panels = [p for p, on in (("loss", "loss" in keys), ("lr", bool(lrs)), ("metrics", bool(shown))) if on]
    if not panels:
        raise ValueError("history holds no loss, learning rate or evaluation to draw")
    fig, axes = pyplot().subplots(len(panels), 1, figsize=(7, 2.5 * len(panels)), sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        if panel == "loss":
            ax.plot(*_series(history, "loss"), marker=".", lw=1.2, color="#1f77b4")
            ax.set(ylabel="training loss", title="Training loss (mean over each logging interval)")
        elif panel == "lr":
            # each group relative to its peak, on a linear axis: a rate that decays to 0 is drawn to the end
            for k in lrs:
                steps, values = _series(history, k)
                peak = float(values.max()) if values.size and values.max() > 0 else 1.0
                label = f"{literal(k[len('lr_') :])} (largest {peak:.3g})"
                ax.plot(steps, values / peak, lw=1.2, marker=".", label=label)
            title = "Learning rate per parameter group (relative to its peak)"
            ax.set(ylabel="lr / peak", ylim=(-0.03, 1.08), title=title)
        else:
            for k in shown:
                steps, values = _series(history, f"eval/{k}")
                ax.plot(steps, 100.0 * values, marker="o", lw=1.2, label=literal(metric_label(k, label_names)))
            evals = len(_series(history, f"eval/{shown[0]}")[0])
            title = f"Test metrics at each of the {evals} evaluations (step 0 = before training)"
            ax.set(ylabel="percent", title=title)
        if panel != "loss":
            ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
        ax.title.set_fontsize(9)
    axes[-1, 0].set_xlabel("optimizer step")
    return save_figure(fig, path)
