"""Model cards (``README.md``) of saved retrieval models and OOD detectors.

A card is YAML metadata (``library_name``, tags, datasets, metrics — read by the Hub) followed by markdown: what
the model is, its configuration, a results table (our numbers beside the paper's, from the hub_config), the training
plots, a usage snippet and the citation. :func:`generate_model_card` picks the retrieval or the detector layout from
``config["task"]``.

Metric labels and the headline metrics come from the metric registry (:mod:`pml_suprank.metrics.report`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..losses.registry import SUPRANK_PAPER, loss_entry
from ..metrics.report import headline_keys, metric_label
from .serialization import DETECTOR_TASK, LIBRARY_NAME, check_metrics

__all__ = ["REPO_URL", "CardInputs", "generate_model_card"]

REPO_URL = "https://github.com/pml-suprank/pml-suprank"


def _paper(loss: Any) -> tuple[str, str]:
    """``(title, url)`` of the paper of the registered loss ``loss`` (name or class name; else the SupRank paper)."""
    try:
        paper = loss_entry(str(loss)).paper
    except ValueError:
        paper = None
    return paper or SUPRANK_PAPER


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return f"{float(value):.2f}"
    return str(value)


@dataclass(frozen=True)
class CardInputs:
    """What a card is built from: the saved config and the optional metrics, hub_config, plots and repo id.

    Attributes:
        config: The ``config.json`` dict.
        metrics: Our metrics, values in [0, 1] (shown in percent).
        hub_config: Loaded hub_config; uses ``hub.tags``, ``hub.datasets``, ``hub.license``, ``hub.paper``,
            ``hub.paper_url`` and ``hub.paper_results`` (percent, keyed like the metrics), and ``data.source``.
        plots: Image paths relative to the card's folder.
        repo_id: Hub repo id (``"org/name"``) shown in the title and the usage snippet, when the folder is (or
            will be) pushed there.
        description: One paragraph on what the saved object computes (e.g. its class docstring summary).
        folder: Name of the folder the card is written into; without ``repo_id`` the usage snippet loads it as
            ``"./<folder>"`` (a local path, relative to the folder's parent).
    """

    config: Mapping[str, Any]
    metrics: Mapping[str, float]
    hub_config: Mapping[str, Any]
    plots: Sequence[str]
    repo_id: str | None
    description: str | None
    folder: str | None = None

    @property
    def load_target(self) -> str:
        """What the usage snippet passes to ``from_pretrained``: the repo id, else ``./<folder>``."""
        if self.repo_id:
            return self.repo_id
        return f"./{self.folder}" if self.folder else "path/to/folder"

    @property
    def load_comment(self) -> str:
        return "" if self.repo_id else "  # path of this folder"

    @property
    def hub(self) -> dict[str, Any]:
        return dict(self.hub_config.get("hub") or {})

    @property
    def training(self) -> dict[str, Any]:
        return dict(self.config.get("training") or {})

    @property
    def paper_results(self) -> dict[str, Any]:
        return {str(k): v for k, v in (self.hub.get("paper_results") or {}).items()}

    @property
    def source(self) -> Any:
        return (self.hub_config.get("data") or {}).get("source") or self.training.get("dataset")

    @property
    def datasets(self) -> list[str]:
        datasets = list(self.hub.get("datasets") or [])
        source = self.source
        if not datasets and isinstance(source, str) and "/" in source and not os.path.isabs(source):
            datasets = [source]
        return datasets

    def title(self, default: str) -> str:
        return self.repo_id or str(self.hub.get("name") or self.hub_config.get("name") or self.folder or default)

    def yaml(
        self, tags: Sequence[Any], metrics: Sequence[str], pipeline_tag: str | None, last_tags: Sequence[Any] = ()
    ) -> str:
        """The card's YAML metadata; tags are ``tags``, then ``hub.tags``, then ``last_tags`` (duplicates dropped)."""
        from huggingface_hub import ModelCardData

        all_tags: list[str] = []
        for t in [*tags, *(self.hub.get("tags") or []), *last_tags]:
            if t and str(t) not in all_tags:
                all_tags.append(str(t))
        card_data = ModelCardData(
            library_name=LIBRARY_NAME,
            license=self.hub.get("license"),
            tags=all_tags,
            datasets=self.datasets or None,
            metrics=list(metrics) or None,
            pipeline_tag=pipeline_tag,
            model_name=self.repo_id,
        )
        return card_data.to_yaml()

    def plot_lines(self) -> list[str]:
        lines: list[str] = []
        if self.plots:
            lines += ["## Plots", ""]
            for p in self.plots:
                lines += [f"![{Path(p).stem}]({p})", ""]
        return lines


def generate_model_card(
    config: Mapping[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str] | None = None,
    repo_id: str | None = None,
    description: str | None = None,
    folder: str | None = None,
) -> str:
    """Model card text (``README.md``) with YAML metadata, a results table and embedded plots.

    Detector configs (``config["task"] == "ood-detection"``) get the detector layout, the others (also configs
    written before ``task`` existed) the retrieval-model layout. Arguments as the attributes of :class:`CardInputs`.
    """
    inputs = CardInputs(
        config=config,
        metrics=check_metrics(metrics),
        hub_config=dict(hub_config or {}),
        plots=list(plots or []),
        repo_id=repo_id,
        description=description,
        folder=folder,
    )
    return _detector_card(inputs) if config.get("task") == DETECTOR_TASK else _retrieval_card(inputs)


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
    """``(counts, rates, headline keys, other keys)``: ``num_*`` counts apart, headline metrics first."""
    counts = {k: v for k, v in metrics.items() if k.startswith("num_")}
    rates = {k: v for k, v in metrics.items() if k not in counts}
    main_keys = headline_keys(rates, paper_results)
    other_keys = [k for k in rates if k not in main_keys]
    return counts, rates, main_keys, other_keys


def _retrieval_results(inputs: CardInputs, title: str) -> list[str]:
    paper_results, label_names = inputs.paper_results, inputs.training.get("label_names")
    counts, rates, main_keys, other_keys = _split_metrics(inputs.metrics, paper_results)
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
        lines.append(f"| {metric_label(k, label_names)} | {_fmt(ours)} | {_fmt(paper_results.get(k))} |")
    lines.append("")
    if "num_queries" in counts:
        lines += [f"Evaluated with {int(counts['num_queries'])} queries.", ""]
    if other_keys:
        lines += ["<details><summary>All metrics</summary>", "", "| metric | this model |", "|---|---|"]
        lines += [f"| {metric_label(k, label_names)} | {_fmt(100.0 * rates[k])} |" for k in other_keys]
        lines += ["", "</details>", ""]
    return lines


def _retrieval_card(inputs: CardInputs) -> str:
    hub, training = inputs.hub, inputs.training
    loss, source = training.get("loss"), inputs.source
    _, _, main_keys, _ = _split_metrics(inputs.metrics, inputs.paper_results)
    tags = ["pml-suprank", "image-retrieval", "metric-learning", "pytorch-metric-learning", "timm"]
    title, url = _paper(loss)
    if hub.get("paper"):
        title, url = str(hub["paper"]), str(hub.get("paper_url") or url)
    lines = [
        "---",
        inputs.yaml(tags, main_keys, "image-feature-extraction", last_tags=[loss]),
        "---",
        "",
        f"# {inputs.title('pml-suprank retrieval model')}",
        "",
        f"An image-retrieval embedding model trained with [pml-suprank]({REPO_URL})"
        + (f" using `{loss}`" if loss else "")
        + (f" on `{source}`" if source else "")
        + ".",
        "",
        *_retrieval_overview(inputs.config, training),
        *_retrieval_results(inputs, title),
        *inputs.plot_lines(),
        "## Usage",
        "",
        "```python",
        "from pml_suprank.models import RetrievalModel",
        "from pml_suprank.data import build_transforms",
        "",
        f'model = RetrievalModel.from_pretrained("{inputs.load_target}")'
        + (inputs.load_comment + ";" if inputs.load_comment else "  #")
        + " never downloads backbone weights",
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


def _detector_results(inputs: CardInputs) -> list[str]:
    metrics, paper_results = inputs.metrics, inputs.paper_results
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


def _detector_card(inputs: CardInputs) -> str:
    config, hub, source = inputs.config, inputs.hub, inputs.source
    arch = str(config.get("architecture"))
    args = dict(config.get("model_args") or {})
    lines = [
        "---",
        inputs.yaml(["pml-suprank", "out-of-distribution-detection", arch], list(inputs.metrics), None),
        "---",
        "",
        f"# {inputs.title(f'pml-suprank {arch} detector')}",
        "",
        f"A post-hoc out-of-distribution detector (`{arch}`) fitted with [pml-suprank]({REPO_URL})"
        + (f" on `{source}`" if source else "")
        + ". It scores feature vectors (and / or logits) of a frozen network: higher = more out-of-distribution.",
        "",
        *([inputs.description.strip(), ""] if inputs.description else []),
        "| argument | value |",
        "|---|---|",
        f"| detector | `{arch}` |",
        *(f"| {k} | `{json.dumps(v, sort_keys=True)}` |" for k, v in sorted(args.items())),
        f"| fitted | {bool(config.get('fitted'))} |",
        "",
        *_detector_results(inputs),
        *inputs.plot_lines(),
        "## Usage",
        "",
        "```python",
        "from pml_suprank import ood",
        "",
        f'detector = ood.Detector.from_pretrained("{inputs.load_target}"){inputs.load_comment}',
        "scores = detector.score(features=z, logits=logits)  # (N,), higher = more OOD",
        "```",
        "",
    ]
    if hub.get("paper"):
        url = f": {hub['paper_url']}" if hub.get("paper_url") else ""
        lines += ["## Citation", "", f"{hub['paper']}{url}", ""]
    return "\n".join(lines)
