"""Figures of a trained retrieval model (matplotlib, ``Agg`` backend; no display needed).

* :func:`precision_recall_curve` / :func:`plot_precision_recall` — the mean interpolated precision–recall curve of
  the test set searched against itself (the query removed from its gallery), optionally beside a second set of
  embeddings (e.g. before training);
* :func:`plot_hierarchical_precision_recall` — one curve per hierarchy level: at level ``l`` the positives of a
  query are the items sharing its label in column ``l`` (fine class, ..., coarse class), as in the hierarchical
  evaluation of HAPPIER (Ramzi et al., ECCV 2022, Sec. 4);
* :func:`plot_embedding_map` — a 2-D map of the class-mean embeddings coloured by coarse class (HAPPIER Fig. 6 uses
  t-SNE; scikit-learn's t-SNE is used when installed, else a PCA projection);
* :func:`plot_retrieval_grid` — queries and their top-k results, with borders marking same fine class (green), same
  coarse class only (orange) and negatives (red).

:func:`plot_all` writes the four PNG files and returns their names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._validation import check_embeddings, check_labels

__all__ = [
    "plot_all",
    "plot_embedding_map",
    "plot_hierarchical_precision_recall",
    "plot_precision_recall",
]

BORDER_COLOURS = {"fine": "#2ca02c", "coarse": "#ff7f0e", "negative": "#d62728"}


def _plt() -> Any:
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


def _finish_pr_axes(ax: Any, title: str, legend_fontsize: int) -> None:
    """Axes, grid and legend of a precision-recall figure."""
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=legend_fontsize)


def _save(plt: Any, fig: Any, path: str | Path) -> Path:
    """Lay out ``fig``, write it to ``path`` and close it."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def precision_recall_curve(
    embeddings: Tensor,
    labels: Tensor,
    level: int = 0,
    num_points: int = 101,
    max_queries: int | None = 1000,
    seed: int = 0,
    chunk_size: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean interpolated precision at ``num_points`` recall values in ``[0, 1]``.

    Every query ranks all other items by cosine similarity (ties: less relevant first, the evaluator's pessimistic
    convention); positives are the items with the same label in column ``level``. The interpolated precision at
    recall ``r`` is the best precision at any recall ``>= r``; queries without positives are skipped.

    Args:
        embeddings: ``(N, D)`` L2-normalised embeddings.
        labels: ``(N,)`` or ``(N, L)`` integer labels, column 0 finest.
        level: Label column defining the positives.
        num_points: Number of recall values.
        max_queries: Use a random subset of at most this many queries (all items stay in the gallery).
        seed: Seed of the query subset.
        chunk_size: Queries scored at once.

    Returns:
        ``(recall (num_points,), precision (num_points,))`` as numpy arrays.
    """
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
    total, count = np.zeros(num_points), 0
    for start in range(0, len(queries), chunk_size):
        q = queries[start : start + chunk_size]
        scores = emb[q] @ emb.T
        rel = (lab[q][:, None] == lab[None, :]).float()
        self_mask = torch.zeros_like(rel, dtype=torch.bool)
        self_mask[torch.arange(len(q)), q] = True
        # pessimistic ties: sort by score desc, then relevance asc; the query itself goes last and is dropped
        key_scores = torch.where(self_mask, torch.full_like(scores, -float("inf")), scores)
        order = np.lexsort((rel.numpy(), -key_scores.numpy()), axis=-1)[:, : n - 1]
        rel_sorted = np.take_along_axis(rel.numpy(), order, axis=1)
        npos = rel_sorted.sum(axis=1)
        tp = np.cumsum(rel_sorted, axis=1)
        ranks = np.arange(1, n)
        for i in range(len(q)):
            if npos[i] == 0:
                continue
            precision = tp[i] / ranks
            recall = tp[i] / npos[i]
            interp = np.maximum.accumulate(precision[::-1])[::-1]
            idx = np.searchsorted(recall, grid, side="left").clip(max=n - 2)
            total += interp[idx]
            count += 1
    if count == 0:
        raise ValueError("no query has a positive at this level; cannot draw a precision-recall curve")
    return grid, total / count


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
    """Draw the mean precision–recall curve of ``embeddings`` (label ``"trained"``) and of every entry of ``compare``
    (``{"before training": embeddings_before}``) and save it to ``path``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4), dpi=110)
    curves = {"trained": embeddings, **(compare or {})}
    for name, emb in curves.items():
        r, p = precision_recall_curve(emb, labels, level=level, max_queries=max_queries, seed=seed)
        area = float(np.sum((r[1:] - r[:-1]) * (p[1:] + p[:-1]) / 2))
        ax.plot(r, p, label=f"{name} (area {area:.3f})")
    _finish_pr_axes(ax, title, legend_fontsize=8)
    return _save(plt, fig, path)


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
    ``embeddings`` and dashed for each entry of ``compare``; saved to ``path``."""
    labels = _as_2d_labels(check_labels("labels", labels, embeddings.shape[0]))
    names = list(label_names) if label_names is not None else [f"level {l}" for l in range(labels.shape[1])]
    if len(names) != labels.shape[1]:
        raise ValueError(f"label_names must have {labels.shape[1]} entries (one per column); got {len(names)}")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4), dpi=110)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for j, (cname, emb) in enumerate({"trained": embeddings, **(compare or {})}.items()):
        for l in range(labels.shape[1]):
            r, p = precision_recall_curve(emb, labels, level=l, max_queries=max_queries, seed=seed)
            ax.plot(r, p, color=colours[l % len(colours)], ls=styles[j % len(styles)], label=f"{names[l]} ({cname})")
    _finish_pr_axes(ax, "Hierarchical precision-recall (per level)", legend_fontsize=7)
    return _save(plt, fig, path)


def _project_2d(x: np.ndarray, method: str, seed: int) -> tuple[np.ndarray, str]:
    if method in ("auto", "tsne") and x.shape[0] >= 5:
        try:
            from sklearn.manifold import TSNE

            perplexity = float(min(30.0, max(2.0, (x.shape[0] - 1) / 3.0)))
            method = "exact" if x.shape[0] <= 1000 else "barnes_hut"  # class means: few points, exact is cheap
            emb = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed, method=method)
            emb = emb.fit_transform(x)
            return emb, "t-SNE"
        except ImportError:
            if method == "tsne":
                raise
    xc = x - x.mean(axis=0, keepdims=True)
    if x.shape[0] < 2:
        return np.zeros((x.shape[0], 2)), "PCA"
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    proj = xc @ vt[:2].T
    if proj.shape[1] < 2:
        proj = np.pad(proj, ((0, 0), (0, 2 - proj.shape[1])))
    return proj, "PCA"


def plot_embedding_map(
    embeddings: Tensor,
    labels: Tensor,
    path: str | Path,
    label_names: Sequence[str] | None = None,
    method: str = "auto",
    seed: int = 0,
) -> Path:
    """2-D map of the fine-class mean embeddings (re-normalised), coloured by coarse class (last label column).

    Args:
        method: ``"auto"`` (t-SNE if scikit-learn is installed, else PCA), ``"tsne"`` or ``"pca"``.
    """
    check_embeddings("embeddings", embeddings)
    labels = _as_2d_labels(check_labels("labels", labels, embeddings.shape[0]))
    if method not in ("auto", "tsne", "pca"):
        raise ValueError(f"method must be one of ('auto', 'tsne', 'pca'); got {method!r}")
    emb = embeddings.detach().float().cpu()
    fine, coarse = labels[:, 0].cpu(), labels[:, -1].cpu()
    classes, inverse = torch.unique(fine, return_inverse=True)
    means = torch.zeros(len(classes), emb.shape[1]).index_add_(0, inverse, emb)
    means = torch.nn.functional.normalize(means, dim=1).numpy()
    class_coarse = torch.zeros(len(classes), dtype=torch.long).index_copy_(0, inverse, coarse).numpy()
    xy, used = _project_2d(means, method, seed)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=110)
    coarse_ids = np.unique(class_coarse)
    cmap = plt.get_cmap("tab10" if len(coarse_ids) <= 10 else "tab20")
    for j, c in enumerate(coarse_ids):
        sel = class_coarse == c
        ax.scatter(
            xy[sel, 0], xy[sel, 1], s=40, color=cmap(j % cmap.N), label=f"coarse {int(c)}", edgecolor="k", linewidth=0.4
        )
    coarse_name = label_names[-1] if label_names else "coarse class"
    ax.set(title=f"Class means ({used}), coloured by {coarse_name}", xticks=[], yticks=[])
    ax.legend(fontsize=7, loc="best", markerscale=0.8)
    return _save(plt, fig, path)


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
) -> Path:
    """Grid of ``num_queries`` random queries (first column) and their ``top_k`` nearest items, with a border per
    result: green = same fine class, orange = same coarse class only, red = negative.

    Args:
        dataset: Gives the pictures: ``dataset.get_image(i)`` (PIL) or ``dataset[i]["image"]`` (denormalised with
            ``mean`` / ``std`` when given).
        indices: Dataset index of every embedding row (default: row ``i`` is item ``i``).
    """
    check_embeddings("embeddings", embeddings)
    labels = _as_2d_labels(check_labels("labels", labels, embeddings.shape[0]))
    n = embeddings.shape[0]
    if n < 2:
        raise ValueError(f"embeddings must have at least 2 rows for a retrieval grid; got {n}")
    top_k = min(int(top_k), n - 1)
    idx = indices.cpu() if indices is not None else torch.arange(n)
    emb = embeddings.detach().float().cpu()
    queries = _query_subset(n, num_queries, seed)
    scores = emb[queries] @ emb.T
    scores[torch.arange(len(queries)), queries] = -float("inf")
    top = scores.topk(top_k, dim=1).indices
    plt = _plt()
    fig, axes = plt.subplots(
        len(queries), top_k + 1, figsize=(1.3 * (top_k + 1), 1.35 * len(queries)), dpi=100, squeeze=False
    )
    for row, q in enumerate(queries.tolist()):
        cells = [(q, None)] + [(j, _relation(labels[q], labels[j])) for j in top[row].tolist()]
        for col, (j, rel) in enumerate(cells):
            ax = axes[row, col]
            ax.imshow(_image_array(dataset, int(idx[j]), mean, std))
            ax.set_xticks([])
            ax.set_yticks([])
            colour = "#1f77b4" if rel is None else BORDER_COLOURS[rel]
            for spine in ax.spines.values():
                spine.set_edgecolor(colour)
                spine.set_linewidth(3 if rel is not None else 1.5)
            if row == 0:
                ax.set_title("query" if col == 0 else f"#{col}", fontsize=8)
    fig.suptitle("Retrieval: green = same fine, orange = same coarse, red = negative", fontsize=9)
    return _save(plt, fig, path)


def _relation(a: Tensor, b: Tensor) -> str:
    if bool(a[0] == b[0]):
        return "fine"
    if a.numel() > 1 and bool(a[-1] == b[-1]):
        return "coarse"
    return "negative"


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
) -> list[str]:
    """Write ``precision_recall.png``, ``hierarchical_precision_recall.png``, ``embedding_map.png`` and (when
    ``image_dataset`` is given) ``retrieval_grid.png`` into ``directory``; return the file names."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    labels = _as_2d_labels(labels)
    files = [
        plot_precision_recall(
            embeddings, labels, directory / "precision_recall.png", compare=compare, max_queries=max_queries, seed=seed
        ),
        plot_hierarchical_precision_recall(
            embeddings,
            labels,
            directory / "hierarchical_precision_recall.png",
            label_names=label_names,
            compare=compare,
            max_queries=max_queries,
            seed=seed,
        ),
        plot_embedding_map(embeddings, labels, directory / "embedding_map.png", label_names=label_names, seed=seed),
    ]
    if image_dataset is not None:
        files.append(
            plot_retrieval_grid(
                embeddings, labels, image_dataset, directory / "retrieval_grid.png", indices=indices, seed=seed
            )
        )
    return [f.name for f in files]
