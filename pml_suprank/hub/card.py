"""Model cards (``README.md``) of saved retrieval models and OOD detectors.

A card is YAML metadata (``library_name``, tags, datasets, metrics — read by the Hub) followed by markdown: what
the model is, its configuration, a results table (our numbers beside the paper's, from the hub_config), the training
plots, a usage snippet and the citation. :func:`generate_model_card` picks the retrieval or the detector layout from
``config["task"]``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .serialization import DETECTOR_TASK, LIBRARY_NAME, check_metrics

__all__ = ["REPO_URL", "generate_detector_card", "generate_model_card", "generate_retrieval_card"]

REPO_URL = "https://github.com/pml-suprank/pml-suprank"

_TPAMI = ("Optimization of Rank Losses for Image Retrieval (Ramzi et al., TPAMI)", "https://arxiv.org/abs/2309.08250")
_ECCV = (
    "Hierarchical Average Precision Training for Pertinent Image Retrieval (Ramzi et al., ECCV 2022)",
    "https://arxiv.org/abs/2207.04873",
)
_PAPERS = {"HAPPIER": _ECCV, "HAPPIERLoss": _ECCV, "SupHAPLoss": _ECCV}
_DEFAULT_PAPER = _TPAMI

# display names of the metric keys of pml_suprank.metrics.RetrievalEvaluator
_METRIC_NAMES = {
    "h_ap": "H-AP",
    "ndcg": "NDCG",
    "asi": "ASI",
    "ap": "mAP",
    "map_at_r": "mAP@R",
    "r_precision": "R-precision",
    "sum_w_ap": "ΣwAP",
}
# shown first in the card and listed in its metadata; the other rates follow in a collapsed table
_HEADLINE = ("h_ap", "ndcg", "asi", "ap", "map_at_r", "recall_at_1")
_METRIC_PATTERNS = (
    ("true_recall_at_", "true recall@{}"),
    ("recall_at_", "R@{}"),
    ("precision_at_", "P@{}"),
    ("map_at_", "mAP@{}"),
)


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return f"{float(value):.2f}"
    return str(value)


def _metric_label(key: str, label_names: Sequence[str] | None = None) -> str:
    """Display name of an evaluator key, e.g. ``recall_at_1_level1`` → ``R@1 (coarse_label)``."""
    base, level = key, None
    if "_level" in key:
        head, _, tail = key.rpartition("_level")
        if tail.isdigit():
            base, level = head, int(tail)
    name = _METRIC_NAMES.get(base)
    if name is None and base == "ap":
        name = "AP"
    if name is None:
        for prefix, fmt in _METRIC_PATTERNS:
            if base.startswith(prefix):
                name = fmt.format(base[len(prefix) :])
                break
    name = name or base
    if level is not None:
        if base == "ap":
            name = "AP"
        where = label_names[level] if label_names and level < len(label_names) else f"level {level}"
        name = f"{name} ({where})"
    return name


def generate_model_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str] | None = None,
    repo_id: str | None = None,
    description: str | None = None,
) -> str:
    """Model card text (``README.md``) with YAML metadata, a results table and embedded plots.

    Dispatches on ``config["task"]``: :func:`generate_detector_card` for OOD detectors, else
    :func:`generate_retrieval_card` (also for configs written before ``task`` existed).

    Args:
        config: The ``config.json`` dict.
        metrics: Our metrics, values in [0, 1] (shown in percent).
        hub_config: Loaded hub_config; uses ``hub.tags``, ``hub.datasets``, ``hub.license``, ``hub.paper`` and
            ``hub.paper_results`` (percent, keyed like the evaluator's metrics), and ``data.source``.
        plots: Image paths relative to the card's folder.
        repo_id: Repo id shown in the usage snippet.
        description: One sentence on what the saved object computes (detector cards; e.g. its docstring summary).
    """
    kwargs = dict(metrics=metrics, hub_config=hub_config, plots=plots, repo_id=repo_id)
    if config.get("task") == DETECTOR_TASK:
        return generate_detector_card(config, description=description, **kwargs)
    return generate_retrieval_card(config, **kwargs)


def _card_data(
    *,
    hub: Mapping[str, Any],
    tags: list[str],
    datasets: list[str],
    metrics: list[str],
    pipeline_tag: str | None,
    repo_id: str | None,
) -> str:
    from huggingface_hub import ModelCardData

    for t in hub.get("tags") or []:
        if t and str(t) not in tags:
            tags.append(str(t))
    card_data = ModelCardData(
        library_name=LIBRARY_NAME,
        license=hub.get("license"),
        tags=tags,
        datasets=datasets or None,
        metrics=metrics or None,
        pipeline_tag=pipeline_tag,
        model_name=repo_id,
    )
    return card_data.to_yaml()


def _datasets(hub: Mapping[str, Any], hub_config: Mapping[str, Any] | None, training: Mapping[str, Any]) -> tuple:
    datasets = list(hub.get("datasets") or [])
    source = ((hub_config or {}).get("data") or {}).get("source") or training.get("dataset")
    if not datasets and isinstance(source, str) and "/" in source and not os.path.isabs(source):
        datasets = [source]
    return datasets, source


def _plot_lines(plots: Sequence[str] | None) -> list[str]:
    lines: list[str] = []
    if plots:
        lines += ["## Plots", ""]
        for p in plots:
            lines += [f"![{Path(p).stem}]({p})", ""]
    return lines


def _retrieval_overview(config: Mapping[str, Any], training: Mapping[str, Any]) -> list[str]:
    args = dict(config.get("model_args") or {})
    pcfg = dict(config.get("pretrained_cfg") or {})
    lines = [
        "| | |",
        "|---|---|",
        f"| backbone | `{args.get('backbone')}` (timm) |",
        f"| pooling | {args.get('pooling')}{' + LayerNorm (no affine)' if args.get('layer_norm') else ''} |",
        f"| embedding size | {config.get('embedding_size')} (L2-normalised) |",
        f"| input size | {pcfg.get('input_size')} |",
        f"| mean / std | {pcfg.get('mean')} / {pcfg.get('std')} |",
    ]
    if training.get("label_names"):
        lines.append(f"| label hierarchy (fine → coarse) | {', '.join(map(str, training['label_names']))} |")
    if training.get("hub_config"):
        lines.append(f"| hub_config | `{training['hub_config']}` |")
    return [*lines, ""]


def _split_metrics(metrics: Mapping[str, float], paper_results: Mapping[str, Any]) -> tuple[dict, dict, list, list]:
    counts = {k: v for k, v in metrics.items() if k.startswith("num_")}
    rates = {k: v for k, v in metrics.items() if k not in counts}
    main_keys = [k for k in _HEADLINE if k in rates or k in paper_results]
    main_keys += [k for k in paper_results if k not in main_keys]
    other_keys = [k for k in rates if k not in main_keys]
    return counts, rates, main_keys, other_keys


def _retrieval_results(
    metrics: Mapping[str, float], paper_results: Mapping[str, Any], label_names: Any, title: str
) -> list[str]:
    counts, rates, main_keys, other_keys = _split_metrics(metrics, paper_results)
    if not main_keys and not other_keys:
        return []
    lines = [
        "## Results",
        "",
        "Exact metrics over the whole test gallery, in percent (ties ranked pessimistically). The paper column "
        f"reports the published numbers of the corresponding setting ({title}).",
        "",
        "| metric | this model | paper |",
        "|---|---|---|",
    ]
    for k in main_keys:
        ours = 100.0 * rates[k] if k in rates else None
        lines.append(f"| {_metric_label(k, label_names)} | {_fmt(ours)} | {_fmt(paper_results.get(k))} |")
    lines.append("")
    if "num_queries" in counts:
        lines += [f"Evaluated with {int(counts['num_queries'])} queries.", ""]
    if other_keys:
        lines += ["<details><summary>All metrics</summary>", "", "| metric | this model |", "|---|---|"]
        lines += [f"| {_metric_label(k, label_names)} | {_fmt(100.0 * rates[k])} |" for k in other_keys]
        lines += ["", "</details>", ""]
    return lines


def generate_retrieval_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str] | None = None,
    repo_id: str | None = None,
) -> str:
    """Card of a retrieval embedding model (see :func:`generate_model_card` for the arguments)."""
    metrics = check_metrics(metrics)
    hub = dict((hub_config or {}).get("hub") or {})
    training = dict(config.get("training") or {})
    loss = training.get("loss")
    paper_results = {str(k): v for k, v in (hub.get("paper_results") or {}).items()}
    datasets, source = _datasets(hub, hub_config, training)
    tags = ["pml-suprank", "image-retrieval", "metric-learning", "pytorch-metric-learning", "timm"]
    _, _, main_keys, _ = _split_metrics(metrics, paper_results)
    yaml = _card_data(
        hub={**hub, "tags": [*(hub.get("tags") or []), loss]},
        tags=tags,
        datasets=datasets,
        metrics=main_keys,
        pipeline_tag="image-feature-extraction",
        repo_id=repo_id,
    )
    name = repo_id or str(hub.get("name") or (hub_config or {}).get("name") or "pml-suprank retrieval model")
    title, url = _PAPERS.get(str(loss), _DEFAULT_PAPER)
    if hub.get("paper"):
        title, url = str(hub["paper"]), str(hub.get("paper_url") or url)
    lines = [
        "---",
        yaml,
        "---",
        "",
        f"# {name}",
        "",
        f"An image-retrieval embedding model trained with [pml-suprank]({REPO_URL})"
        + (f" using `{loss}`" if loss else "")
        + (f" on `{source}`" if source else "")
        + ".",
        "",
        *_retrieval_overview(config, training),
        *_retrieval_results(metrics, paper_results, training.get("label_names"), title),
        *_plot_lines(plots),
        "## Usage",
        "",
        "```python",
        "from pml_suprank.models import RetrievalModel",
        "from pml_suprank.data import build_transforms",
        "",
        f'model = RetrievalModel.from_pretrained("{repo_id or "path/to/folder"}")  # never downloads backbone weights',
        "transform = build_transforms(model.data_config, train=False)",
        "embeddings = model(transform(pil_image)[None])  # (1, D), L2-normalised",
        "```",
        "",
        "## Citation",
        "",
        f"{title}: {url}",
        "",
    ]
    return "\n".join(lines)


def _detector_results(metrics: Mapping[str, float], paper_results: Mapping[str, Any]) -> list[str]:
    keys = [*metrics, *(k for k in paper_results if k not in metrics)]
    if not keys:
        return []
    lines = [
        "## Results",
        "",
        "Detection metrics in percent (scores: higher = more out-of-distribution).",
        "",
        "| metric | this detector | paper |",
        "|---|---|---|",
    ]
    for k in keys:
        ours = 100.0 * metrics[k] if k in metrics and not k.startswith("num_") else metrics.get(k)
        lines.append(f"| {k} | {_fmt(ours)} | {_fmt(paper_results.get(k))} |")
    return [*lines, ""]


def generate_detector_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str] | None = None,
    repo_id: str | None = None,
    description: str | None = None,
) -> str:
    """Card of a post-hoc OOD detector (see :func:`generate_model_card` for the arguments)."""
    metrics = check_metrics(metrics)
    hub = dict((hub_config or {}).get("hub") or {})
    training = dict(config.get("training") or {})
    arch = str(config.get("architecture"))
    paper_results = {str(k): v for k, v in (hub.get("paper_results") or {}).items()}
    datasets, source = _datasets(hub, hub_config, training)
    tags = ["pml-suprank", "out-of-distribution-detection", arch]
    yaml = _card_data(hub=hub, tags=tags, datasets=datasets, metrics=list(metrics), pipeline_tag=None, repo_id=repo_id)
    name = repo_id or str(hub.get("name") or (hub_config or {}).get("name") or f"pml-suprank {arch} detector")
    args = dict(config.get("model_args") or {})
    rows = [f"| {k} | `{json.dumps(v, sort_keys=True)}` |" for k, v in sorted(args.items())]
    lines = [
        "---",
        yaml,
        "---",
        "",
        f"# {name}",
        "",
        f"A post-hoc out-of-distribution detector (`{arch}`) fitted with [pml-suprank]({REPO_URL})"
        + (f" on `{source}`" if source else "")
        + ". It scores feature vectors (and / or logits) of a frozen network: higher = more out-of-distribution.",
        "",
        *([description.strip(), ""] if description else []),
        "| argument | value |",
        "|---|---|",
        f"| detector | `{arch}` |",
        *rows,
        f"| fitted | {bool(config.get('fitted'))} |",
        "",
        *_detector_results(metrics, paper_results),
        *_plot_lines(plots),
        "## Usage",
        "",
        "```python",
        "from pml_suprank import ood",
        "",
        f'detector = ood.Detector.from_pretrained("{repo_id or "path/to/folder"}")',
        "scores = detector.score(features=z, logits=logits)  # (N,), higher = more OOD",
        "```",
        "",
    ]
    if hub.get("paper"):
        lines += ["## Citation", "", f"{hub['paper']}: {hub.get('paper_url') or ''}".rstrip(": "), ""]
    return "\n".join(lines)
