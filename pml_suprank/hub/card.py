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
from ..metrics.report import headline_keys, metric_label, same_as
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
        """The repo id, else the hub_config's name, else ``default`` (never the folder's name: "final" says
        nothing)."""
        return self.repo_id or str(self.hub.get("name") or self.hub_config.get("name") or default)

    def yaml(
        self,
        tags: Sequence[Any],
        metrics: Sequence[str],
        pipeline_tag: str | None,
        last_tags: Sequence[Any] = (),
        *,
        model_name: str | None = None,
        base_model: str | None = None,
        task_type: str | None = None,
    ) -> str:
        """The card's YAML metadata; tags are ``tags``, then ``hub.tags``, then ``last_tags`` (duplicates dropped).

        With ``model_name`` and ``task_type``, the measured ``metrics`` (percent) also go into ``model-index`` (the
        Hub's evaluation results), on the test split of the card's dataset.
        """
        from huggingface_hub import ModelCardData

        all_tags: list[str] = []
        for t in [*tags, *(self.hub.get("tags") or []), *last_tags]:
            if t and str(t) not in all_tags:
                all_tags.append(str(t))
        card_data = ModelCardData(
            library_name=LIBRARY_NAME,
            license=self.hub.get("license") or "mit",
            tags=all_tags,
            datasets=self.datasets or None,
            metrics=list(metrics) or None,
            pipeline_tag=pipeline_tag,
            base_model=base_model,
            model_name=model_name or self.repo_id,
            eval_results=self.eval_results(metrics, task_type) if model_name and task_type else None,
        )
        return card_data.to_yaml()

    def eval_results(self, keys: Sequence[str], task_type: str) -> list[Any] | None:
        """``huggingface_hub.EvalResult`` of each measured metric in ``keys`` (percent), or None when none is."""
        from huggingface_hub import EvalResult

        source = str(self.source or "custom")
        dataset = self.datasets[0] if self.datasets else source
        results = [
            EvalResult(
                task_type=task_type,
                dataset_type=dataset,
                dataset_name=source,
                dataset_split="test",
                metric_type=k,
                metric_name=metric_label(k, self.training.get("label_names")),
                metric_value=round(100.0 * float(self.metrics[k]), 2),
            )
            for k in keys
            if k in self.metrics and math.isfinite(float(self.metrics[k]))
        ]
        return results or None

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
    other_keys = [k for k in rates if k not in main_keys and not _shown_as_another(rates, k)]
    return counts, rates, main_keys, other_keys


def _shown_as_another(rates: Mapping[str, float], key: str) -> bool:
    """``key`` holds, by definition, the number of a key that is also in ``rates`` (``ap_level0`` = ``ap``,
    ``precision_at_1`` = ``recall_at_1``, ...): each number is listed once."""
    kept = same_as(key)
    return kept is not None and kept in rates and math.isclose(float(rates[key]), float(rates[kept]), rel_tol=1e-9)


def _base_model(config: Mapping[str, Any]) -> str | None:
    """The Hub repo of the pretrained backbone weights the model started from (``timm/<name>.<tag>``), or None for
    a backbone trained from scratch or one timm does not know."""
    args = dict(config.get("model_args") or {})
    backbone = str(args.get("backbone") or "")
    if backbone.startswith("hf-hub:"):
        return backbone[len("hf-hub:") :] or None
    if not args.get("pretrained") or not backbone:
        return None
    try:
        import timm

        cfg = timm.models.get_pretrained_cfg(backbone)
    except Exception:  # an unknown name or an old timm: no base model to name
        return None
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    return str(hub_id) if hub_id else None


def _hyper_parameters(training: Mapping[str, Any]) -> list[str]:
    """The loss, its options and the optimisation settings of the run, as a two-column table."""
    tc = dict(training.get("training_config") or {})
    rows: list[tuple[str, Any]] = []
    if training.get("loss"):
        rows.append(("loss", f"`{training['loss']}`"))
    for k, v in sorted(dict(training.get("loss_kwargs") or {}).items()):
        if v is not None:
            rows.append((f"loss: {k}", f"`{json.dumps(v)}`"))
    for k in (
        "optimizer", "lr_backbone", "lr_head", "weight_decay", "scheduler", "warmup_epochs", "batch_size",
        "virtual_batch_size", "sampler", "samples_per_class", "epochs", "max_train_steps", "memory_size", "seed",
    ):  # fmt: skip
        if tc.get(k) is not None:
            rows.append((k, f"`{json.dumps(tc[k])}`"))
    if not rows:
        return []
    return [
        "## Training hyper-parameters",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
    ]


def _use_and_limits(training: Mapping[str, Any], source: Any, base_model: str | None) -> list[str]:
    tc = dict(training.get("training_config") or {})
    steps = tc.get("max_train_steps")
    where = f"`{source}`" if source else "its training data"
    lines = [
        "## Intended use and limitations",
        "",
        f"- **Use:** embed images of the domain of {where} and rank a gallery by cosine similarity (nearest-neighbour"
        " search, e.g. `pml_suprank.search.RetrievalIndex`); with a label hierarchy, nearer items share finer labels.",
        "- Compare embeddings of this model only with embeddings of the same model and preprocessing.",
        "- The results above are measured on the held-out test split of the training data; quality on other image"
        " domains is not measured. Not for decisions about people (identification, surveillance).",
    ]
    if base_model:
        lines.append(f"- Fine-tuned from [`{base_model}`](https://huggingface.co/{base_model}): its license applies.")
    if isinstance(steps, int) and steps < 200:
        lines.append(
            f"- **Trained for {steps} optimizer steps only**: a demonstration or smoke test, not a usable model."
        )
    return [*lines, ""]


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
    backbone = (inputs.config.get("model_args") or {}).get("backbone")
    name = inputs.title(
        " ".join(str(x) for x in (loss, "retrieval model", f"({backbone}" + (f", {source})" if source else ")")) if x)
    )
    lines = [
        "---",
        inputs.yaml(
            tags,
            main_keys,
            "image-feature-extraction",
            last_tags=[loss],
            model_name=name,
            base_model=_base_model(inputs.config),
            task_type="image-feature-extraction",
        ),  # fmt: skip
        "---",
        "",
        f"# {name}",
        "",
        f"An image-retrieval embedding model trained with [pml-suprank]({REPO_URL})"
        + (f" using `{loss}`" if loss else "")
        + (f" on `{source}`" if source else "")
        + ".",
        "",
        *_retrieval_overview(inputs.config, training),
        *_retrieval_results(inputs, title),
        *_hyper_parameters(training),
        *_use_and_limits(training, source, _base_model(inputs.config)),
        *inputs.plot_lines(),
        "## Usage",
        "",
        "```python",
        "import torch",
        "from PIL import Image",
        "from pml_suprank.models import RetrievalModel",
        "from pml_suprank.data import build_transforms",
        "",
        f'model = RetrievalModel.from_pretrained("{inputs.load_target}").eval()'
        + (inputs.load_comment + ";" if inputs.load_comment else "  #")
        + " never downloads backbone weights",
        "transform = build_transforms(model.data_config, train=False)",
        'image = Image.open("query.jpg").convert("RGB")  # any image file',
        "with torch.no_grad():",
        "    embedding = model(transform(image)[None])  # (1, D), L2-normalised",
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
        "# the features of the network the detector was fitted on (a timm classifier), images (B, 3, H, W)",
        "features = ood.extract_features(classifier, [images])",
        "scores = detector.score(features=features.features, std_features=features.std_features,",
        "                        logits=features.logits)  # (B,), higher = more OOD",
        "```",
        "",
    ]
    if hub.get("paper"):
        url = f": {hub['paper_url']}" if hub.get("paper_url") else ""
        lines += ["## Citation", "", f"{hub['paper']}{url}", ""]
    return "\n".join(lines)
