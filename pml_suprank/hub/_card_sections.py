"""The text of a model card (:mod:`pml_suprank.hub.card` writes it): what it is built from (:class:`CardInputs`),
escaping, and the sections of the retrieval and the detector layouts.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..losses.registry import SUPRANK_PAPER, loss_entry
from ..metrics.report import headline_keys, metric_label, metric_legend, same_as
from .serialization import LIBRARY_NAME, METRICS_NAME, check_metrics

__all__ = ["MAX_CLASSES_LISTED", "CardInputs", "describe_dataset", "detector_card", "retrieval_card"]

#: class names listed per split before the rest is only counted
MAX_CLASSES_LISTED = 50
_HUB_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REPO_URL = "https://github.com/pml-suprank/pml-suprank"
_PROXY_LOSSES = ("HAPPIER", "HAPPIER_F", "ROD-NDCG", "CSL", "HAPPIERLoss", "RODNDCGLoss", "CSLLoss")
_HYPER_PARAMETERS = ("optimizer", "lr_backbone", "lr_head", "lr_proxies", "weight_decay", "scheduler", "min_lr_ratio",
                     "warmup_epochs", "batch_size", "virtual_batch_size", "sampler", "samples_per_class", "epochs",
                     "max_train_steps", "memory_size", "seed")  # fmt: skip

# BibTeX of the papers the registered losses and the detectors cite, keyed by their arXiv URL
_BIBTEX = {
    "https://arxiv.org/abs/2309.08250": """@misc{ramzi2023optimization,
  title = {Optimization of Rank Losses for Image Retrieval},
  author = {Ramzi, Elias and Audebert, Nicolas and Rambour, Cl{\\'e}ment and Araujo, Andr{\\'e} and Bitot, Xavier
            and Thome, Nicolas},
  year = {2023},
  eprint = {2309.08250},
  archivePrefix = {arXiv},
  note = {SupRank, ROADMAP, HAPPIER, ROD-NDCG}
}""",
    "https://arxiv.org/abs/2207.04873": """@inproceedings{ramzi2022hierarchical,
  title = {Hierarchical Average Precision Training for Pertinent Image Retrieval},
  author = {Ramzi, Elias and Audebert, Nicolas and Thome, Nicolas and Rambour, Cl{\\'e}ment and Bitot, Xavier},
  booktitle = {European Conference on Computer Vision (ECCV)},
  year = {2022}
}""",
    "https://arxiv.org/abs/2007.12163": """@inproceedings{brown2020smooth,
  title = {Smooth-{AP}: Smoothing the Path Towards Large-Scale Image Retrieval},
  author = {Brown, Andrew and Xie, Weidi and Kalogeiton, Vicky and Zisserman, Andrew},
  booktitle = {European Conference on Computer Vision (ECCV)},
  year = {2020}
}""",
}


# ---------------------------------------------------------------------------------------------------- text helpers
_MD_SPECIAL = re.compile(r"([\\`*\[\]|])")
_MD_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # intraword "_" never emphasises


def _md(value: Any) -> str:
    """``value`` as text safe in markdown and HTML: ``<``, ``>``, ``&`` and quotes as entities, markdown syntax
    characters backslash-escaped (``_`` where it could start or end an emphasis), control characters and line
    breaks replaced by spaces."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    return _MD_EDGE_UNDERSCORE.sub(r"\\_", _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=True)))


def _num(value: Any, scale: float = 1.0) -> str:
    """``scale * value`` with two decimals (a fraction in [0, 1] as a percentage with ``scale=100``); ``–`` when
    absent or not finite."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
        return f"{scale * float(value):.2f}"
    return "–"


def _pct(value: Any) -> str:  # a fraction in [0, 1] as a percentage
    return _num(value, 100.0)


def _join(*blocks: str) -> str:
    """The non-empty markdown ``blocks`` separated by blank lines."""
    return "\n\n".join(b for b in blocks if b)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str = "", intro: str = "") -> str:
    """A markdown table under the heading ``## title`` and the paragraph ``intro`` when given; nothing without rows."""
    if not rows:
        return ""
    lines = [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(r)} |" for r in rows)]
    return _join(f"## {title}" if title else "", intro, "\n".join(lines))


def _paper(loss: Any) -> tuple[str, str]:
    """``(title, url)`` of the paper of the registered loss ``loss`` (name or class name; else the SupRank paper)."""
    with suppress(ValueError):  # not a registered loss
        return loss_entry(str(loss)).paper or SUPRANK_PAPER
    return SUPRANK_PAPER


def describe_dataset(source: Any, hub_datasets: Sequence[str]) -> tuple[str, str, str | None]:
    """``(kind, short name, Hub dataset id or None)`` of a run's ``dataset`` option: ``"synthetic"`` (built in),
    ``"benchmark"`` (a paper benchmark read from a local archive), ``"hub"`` (a Hub dataset id) or ``"local"`` (a
    folder or file on the training machine: only its last path component is named)."""
    from ..data.benchmarks.registry import BENCHMARKS

    listed = hub_datasets[0] if hub_datasets else None
    if source is None:
        return "unknown", "its training data", listed
    text = str(source)
    if text.startswith("synthetic"):
        return "synthetic", text, None
    if text in BENCHMARKS:
        return "benchmark", text, listed
    if (os.path.isabs(text) or text.startswith((".", "~")) or "\\" in text or ".." in Path(text).parts
            or not _HUB_DATASET_ID.match(text) or os.path.exists(text)):  # fmt: skip
        return "local", Path(text.rstrip("/\\")).name or "local data", listed
    return "hub", text, text


#: per kind of training data: how the card names it, and the paragraph of its "Training data" section
_DATA_TEXT = {
    "synthetic": (
        "SyntheticShapes ({name}, built into pml-suprank)",
        "{phrase}: procedurally rendered shapes (coarse class = shape family, fine class = variant × colour); training "
        "and test classes are disjoint (open-set retrieval).",
    ),
    "benchmark": ("the {name} benchmark", "{phrase}, read from its archive with `pml_suprank.data.load_benchmark`."),
    "local": ("{name} (a local dataset)", "{phrase}: images of the trainer's own, not published with this model."),
    "hub": ("{name}", "[{phrase}](https://huggingface.co/datasets/{hub_id}) from the Hugging Face Hub."),
}


# ---------------------------------------------------------------------------------------------------- inputs
class CardInputs:
    """What a card is built from (the arguments of :func:`~.card.generate_model_card`) and what it derives once."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        metrics: Mapping[str, float] | None = None,
        hub_config: Mapping[str, Any] | None = None,
        plots: Sequence[str] | None = None,
        repo_id: str | None = None,
        description: str | None = None,
        folder: str | None = None,
        files: Mapping[str, Any] | None = None,
    ) -> None:
        files = dict(files or {})
        if not metrics and isinstance(files.get(METRICS_NAME), Mapping):
            metrics = {k: v for k, v in files[METRICS_NAME].items() if isinstance(v, (int, float))}
        self.config, self.metrics, self.hub_config = config, check_metrics(metrics), dict(hub_config or {})
        self.plots, self.repo_id, self.description = list(plots or []), repo_id, description
        self.load_target = repo_id or (f"./{folder}" if folder else "path/to/folder")
        self.load_comment = "" if repo_id else "  # path of this folder"
        self.training = dict(config.get("training") or {})
        self.label_names = self.training.get("label_names")
        self.hub = dict((self.hub_config.get("hub") if self.hub_config else self.training.get("card_hub")) or {})
        self.paper_results = {str(k): v for k, v in (self.hub.get("paper_results") or {}).items()}
        #: the title: the repo id, else the hub_config's name (never the folder's name: "final" says nothing)
        self.name = repo_id or self.hub.get("name") or self.hub_config.get("name")
        data = dict(self.hub_config.get("data") or {})
        source = data.get("dataset") or data.get("source") or self.training.get("dataset") or self.hub.get("source")
        ids = [str(d) for d in (self.hub.get("datasets") or []) if _HUB_DATASET_ID.match(str(d))]
        kind, name, hub_id = describe_dataset(source, ids)
        if (self.training.get("data_summary") or {}).get("kind") == "local" and kind == "hub":
            kind, name, hub_id = "local", Path(name).name, ids[0] if ids else None  # "data/photos", seen elsewhere
        self.dataset = (kind, name, hub_id)
        self.data_name = _DATA_TEXT.get(kind, ("{name}",))[0].format(name=name)  # how the text names the data
        #: the front matter's ``datasets``: real Hub dataset ids only (``hub.datasets``, or a Hub id as source)
        self.datasets = ids or ([hub_id] if kind == "hub" and hub_id else [])
        summary, history, guard = (files.get(n) for n in ("training_summary.json", "history.json", "ood/guard.json"))
        self.summary = dict(summary) if isinstance(summary, Mapping) else {}
        self.history = [r for r in history if isinstance(r, Mapping)] if isinstance(history, list) else []
        self.guard = dict(guard) if isinstance(guard, Mapping) else None

    def front_matter(self, tags: Sequence[Any], metrics: Sequence[str], pipeline_tag: str | None, *,
                     model_name: str | None = None, base_model: str | None = None) -> str:  # fmt: skip
        """The card's YAML metadata between ``---`` lines (``huggingface_hub.ModelCardData`` writes it): ``tags``
        (once each); with ``model_name`` the measured ``metrics`` (percent) also go into
        ``model-index`` on the test split of the card's dataset (its ``type``: the Hub dataset id, else the
        description of the data, which never names a Hub id)."""
        from huggingface_hub import EvalResult, ModelCardData

        hub_id, name = self.dataset[2], html.escape(self.data_name)
        results = [
            EvalResult(
                task_type=pipeline_tag,
                dataset_type=hub_id or name,
                dataset_name=name,
                dataset_split="test",
                metric_type=k,
                metric_value=round(100.0 * float(self.metrics[k]), 2),
                metric_name=html.escape(metric_label(k, self.label_names)),
            )  # fmt: skip
            for k in metrics
            if model_name and k in self.metrics and math.isfinite(float(self.metrics[k]))
        ]
        card_data = ModelCardData(
            library_name=LIBRARY_NAME,
            license=self.hub.get("license") or "mit",
            tags=list(dict.fromkeys(str(t) for t in tags if t)),
            datasets=self.datasets or None,
            metrics=list(metrics) or None,
            pipeline_tag=pipeline_tag,
            base_model=base_model,
            model_name=html.escape(model_name) if model_name else self.repo_id,
            eval_results=results or None,
        )
        return f"---\n{card_data.to_yaml()}\n---"

    def plots_section(self) -> str:
        return _join("## Plots" if self.plots else "", *(f"![{_md(Path(p).stem)}]({p})" for p in self.plots))


# ---------------------------------------------------------------------------------------------------- sections
_GUARD = """## Out-of-distribution guard

This model ships with an OOD guard (`ood/`): a {detector} detector on {features} features of these weights (their \
SHA-256 is in `ood/guard.json`; another model's guard is refused). An image is rejected as unknown when its {rule} \
(higher = more out-of-distribution: {higher}). Rates in percent.

{tables}

```python
from pml_suprank.models import RetrievalModel

model = RetrievalModel.from_pretrained("{target}")
guard = model.ood_guard  # the stored detector, its threshold and its feature kind
```"""
_USE_AND_LIMITS = """## Intended use and limitations

- **Use:** embed images of the domain of {data} and rank a gallery by cosine similarity (nearest-neighbour search, \
e.g. `pml_suprank.search.RetrievalIndex`); with a label hierarchy, nearer items share finer labels.
- Compare embeddings of this model only with embeddings of the same model and preprocessing.
- The results above are measured on the held-out test split of the training data; quality on other image domains \
is not measured. Not for decisions about people (identification, surveillance)."""
_RETRIEVAL_USAGE = """## Usage

```python
import torch
from PIL import Image
from pml_suprank.models import RetrievalModel
from pml_suprank.data import build_transforms

model = RetrievalModel.from_pretrained("{target}").eval(){comment} never downloads backbone weights
transform = build_transforms(model.data_config, train=False)
image = Image.open("query.jpg").convert("RGB")  # any image file
with torch.no_grad():
    embedding = model(transform(image)[None])  # (1, D), L2-normalised
```"""
_DETECTOR_USAGE = """## Usage

```python
from pml_suprank import ood

detector = ood.Detector.from_pretrained("{target}"){comment}
# the features of the network the detector was fitted on (a timm classifier), images (B, 3, H, W)
features = ood.extract_features(classifier, [images])
scores = detector.score(features=features.features, std_features=features.std_features,
                        logits=features.logits)  # (B,), higher = more OOD
```"""
_DEFINITIONS = (
    "Definitions (positives: items of the query's fine class unless a label column is named; ties ranked "
    "pessimistically; the query is removed from the gallery):"
)


def _overview(card: CardInputs) -> str:
    config, labels = card.config, card.label_names
    args, pcfg = dict(config.get("model_args") or {}), dict(config.get("pretrained_cfg") or {})
    rows = [
        ("backbone", f"`{args.get('backbone')}` (timm)"),
        ("pooling", f"{args.get('pooling')}{' + LayerNorm (no affine)' if args.get('layer_norm') else ''}"),
        ("embedding size", f"{config.get('embedding_size')} (L2-normalised)"),
        ("input size", str(pcfg.get("input_size"))),
        ("mean / std", f"{pcfg.get('mean')} / {pcfg.get('std')}"),
        ("label hierarchy (fine → coarse)", labels and ", ".join(_md(n) for n in labels)),
        ("hub_config", card.training.get("hub_config") and _md(card.training["hub_config"])),
    ]
    return _table(("property", "value"), [r for r in rows if r[1]], "Model")


def _training_data(card: CardInputs) -> str:
    kind, _, hub_id = card.dataset
    text = (
        _DATA_TEXT[kind][1].format(phrase=_md(card.data_name), hub_id=hub_id) if kind in _DATA_TEXT else "Not recorded."
    )
    if card.label_names:
        text += f" Label columns (finest first): {', '.join(_md(n) for n in card.label_names)}."
    rows = []
    for part in ("train", "test"):
        s = dict(card.training.get("data_summary") or {}).get(part)
        if isinstance(s, Mapping):
            shown = list(dict(s.get("class_counts") or {}).items())[:MAX_CLASSES_LISTED]
            classes = ", ".join(f"{_md(c)} ({int(n)})" for c, n in shown)
            rest = int(s.get("classes", 0)) - len(shown)
            classes += f", … and {rest} more classes" if rest > 0 else ""
            rows.append((part, str(s.get("images", "–")), str(s.get("classes", "–")), classes or "–"))
    return _join("## Training data", text, _table(("split", "images", "fine classes", "classes (images)"), rows))


def _split_metrics(metrics: Mapping[str, float], paper_results: Mapping[str, Any]) -> tuple[dict, dict, list, list]:
    """``(counts, rates, headline keys, other keys)``: ``num_*`` counts apart, headline metrics first, a key that
    holds by definition the number of another shown key (``ap_level0`` = ``ap``, ...) left out."""
    counts = {k: v for k, v in metrics.items() if k.startswith("num_")}
    rates = {k: v for k, v in metrics.items() if k not in counts}
    main_keys = headline_keys(rates, paper_results)

    def shown_as_another(key: str) -> bool:
        kept = same_as(key)
        return kept is not None and kept in rates and math.isclose(float(rates[key]), float(rates[kept]), rel_tol=1e-9)

    other_keys = [k for k in rates if k not in main_keys and not shown_as_another(k)]
    other_keys.sort(key=lambda k: (int(k.rpartition("_level")[2]) if k.rpartition("_level")[2].isdigit() else -1, k))
    return counts, rates, main_keys, other_keys


def _definitions(keys: Sequence[str], label_names: Any) -> str:
    """One bullet per displayed metric label: its definition from the metric registry, with its ``k`` and its label
    column filled in."""
    seen: dict[str, str] = {}
    for k in keys:
        label, legend = metric_label(k, label_names), metric_legend([k])
        if not legend or label in seen:
            continue
        text = legend.split(" = ", 1)[1]
        top, level = re.search(r"_at_(\d+)", k), re.search(r"_level(\d+)$", k)
        if top:
            text = re.sub(r"\bk\b", top.group(1), text)
        if level:
            h = int(level.group(1))
            column = label_names[h] if label_names and h < len(label_names) else f"{h}"
            text = text.replace("label column h (0 = finest)", f"label column {column}")
            text = text.replace("label column h", f"label column {column}")
        seen[label] = text
    bullets = "\n".join(f"- **{_md(label)}**: {_md(text)}" for label, text in seen.items())
    return bullets and _join(_DEFINITIONS, bullets)


def _results(card: CardInputs, title: str) -> str:
    paper, labels = card.paper_results, card.label_names
    counts, rates, main_keys, other_keys = _split_metrics(card.metrics, paper)
    if not main_keys and not other_keys:
        return ""
    with_paper = any(math.isfinite(float(v)) for v in paper.values() if isinstance(v, (int, float)))
    intro = "Exact metrics over the whole test gallery, in percent."
    if with_paper:
        intro += f" The paper column reports the published numbers of the corresponding setting ({_md(title)})."
    rows = [[_md(metric_label(k, labels)), _pct(rates.get(k)), *([_num(paper.get(k))] if with_paper else [])]
            for k in main_keys]  # fmt: skip
    others = _table(("metric", "this model"), [(_md(metric_label(k, labels)), _pct(rates[k])) for k in other_keys])
    return _join(
        "## Results",
        intro,
        _table(("metric", "this model", *(["paper"] if with_paper else [])), rows),
        f"Evaluated with {int(counts['num_queries'])} queries." if "num_queries" in counts else "",
        others and f"<details><summary>All metrics</summary>\n\n{others}\n\n</details>",
        _definitions([*main_keys, *other_keys], labels),
    )


def _base_model(config: Mapping[str, Any]) -> str | None:
    """The Hub repo of the pretrained backbone weights the model started from (``timm/<name>.<tag>``), or None for
    a backbone trained from scratch or one timm does not know."""
    args = dict(config.get("model_args") or {})
    backbone = str(args.get("backbone") or "")
    if backbone.startswith("hf-hub:"):
        return backbone.removeprefix("hf-hub:") or None
    if not args.get("pretrained") or not backbone:
        return None
    try:
        import timm

        hub_id = getattr(timm.models.get_pretrained_cfg(backbone), "hf_hub_id", None)
    except Exception:  # an unknown name or an old timm: no base model to name
        return None
    return str(hub_id) if hub_id else None


def _hyper_parameters(card: CardInputs) -> str:
    """The loss, its options and the optimisation settings of the run (learning rates, steps)."""
    training, tc = card.training, dict(card.training.get("training_config") or {})
    rows = [("loss", _md(training["loss"]))] if training.get("loss") else []
    loss_kwargs = dict(training.get("loss_kwargs") or {})
    rows += [(f"loss: {_md(k)}", f"`{json.dumps(v)}`") for k, v in sorted(loss_kwargs.items()) if v is not None]
    has_proxies = any("lr_proxies" in r for r in card.history) or str(training.get("loss")) in _PROXY_LOSSES
    has_proxies = has_proxies or loss_kwargs.get("decomposability") == "proxy"
    rows += [(k, f"`{json.dumps(tc[k])}`") for k in _HYPER_PARAMETERS
             if tc.get(k) is not None and (k != "lr_proxies" or has_proxies)]  # fmt: skip
    if isinstance(card.summary.get("steps"), int):
        rows.append(("optimizer steps done", str(card.summary["steps"])))
    return _table(("setting", "value"), rows, "Training hyper-parameters")


def _compute(card: CardInputs) -> str:
    compute, summary = dict(card.training.get("compute") or {}), card.summary
    device, name, seconds = compute.get("device"), compute.get("device_name"), summary.get("train_time_s")
    processes, precision = (compute.get(k, summary.get(k)) for k in ("num_processes", "mixed_precision"))
    finite = isinstance(seconds, (int, float)) and math.isfinite(seconds)
    rows = [
        ("device", str(device) + (f" ({_md(name)})" if name else "") if device else None),
        ("processes", None if processes is None else str(processes)),
        ("mixed precision", None if precision is None else _md(precision)),
        ("training time", (f"{seconds:.0f} s" if seconds < 3600 else f"{seconds / 3600:.1f} h") if finite else None),
        *((k, _md(compute[k]) if compute.get(k) else None) for k in ("torch", "pml_suprank")),
    ]
    return _table(("item", "value"), [r for r in rows if r[1] is not None], "Compute")


def _short_run_banner(card: CardInputs) -> str:
    """The console's short-run warning of the run, when it warned (the same rule and text)."""
    from ..data.batch_fit import short_run_warning

    schedule, tc = dict(card.training.get("schedule") or {}), dict(card.training.get("training_config") or {})
    total = schedule.get("total_steps")
    total = total if isinstance(total, int) and total > 0 else tc.get("max_train_steps")
    if not isinstance(total, int):
        return ""
    epochs = tc["epochs"] if isinstance(tc.get("epochs"), int) else 1
    warning = short_run_warning(int(schedule.get("steps_per_epoch") or total), total, epochs=epochs,
                                max_train_steps=tc.get("max_train_steps"))  # fmt: skip
    if not warning:
        return ""
    text = _md(warning.removeprefix("warning: "))
    return f"> **Warning — short run:** {text}. A demonstration or smoke test, not a usable model."


def _guard(card: CardInputs) -> str:
    """The OOD guard stored with the model (``ood/guard.json``): its detector, threshold and what was measured."""
    guard = card.guard
    if not guard:
        return ""
    higher = guard.get("higher_is_ood", True)
    rows = [
        ("threshold", _md(guard.get("threshold"))),
        ("target ID true-positive rate (images kept)", _pct(guard.get("tpr_target"))),
        ("measured ID true-positive rate (held-out ID images)", _pct(guard.get("id_tpr"))),
    ]
    sets = guard.get("ood_sets") if isinstance(guard.get("ood_sets"), Mapping) else {}
    set_rows = [(_md(n), _pct(m.get("fpr")), _pct(m.get("auroc"))) for n, m in sets.items() if isinstance(m, Mapping)]
    tables = _join(
        _table(("setting", "value"), [r for r in rows if r[1] != "–"]),
        _table(("OOD set", "FPR at the threshold (OOD accepted)", "AUROC"), set_rows),
    )
    return _GUARD.format(
        detector=_md(guard.get("detector")),
        features=_md(guard.get("feature_kind")),
        rule="score > threshold" if higher else "score < threshold",
        higher="yes" if higher else "no",
        tables=tables,
        target=card.load_target,
    )


def _citation(papers: Sequence[tuple[str, str]]) -> str:
    """``## Citation``: per ``(title, url)`` paper its line and, for a known paper, its BibTeX; nothing without."""
    bibtex = {url: f"```bibtex\n{_BIBTEX[url]}\n```" for _, url in papers if url in _BIBTEX}
    return papers and _join("## Citation", *(_join(f"{_md(t)}: {url}", bibtex.get(url, "")) for t, url in papers))


# ---------------------------------------------------------------------------------------------------- layouts
def retrieval_card(card: CardInputs) -> str:
    loss, kind = card.training.get("loss"), card.dataset[0]
    title, url = _paper(loss)
    if card.hub.get("paper"):
        title, url = str(card.hub["paper"]), str(card.hub.get("paper_url") or url)
    papers = [(title, url)]
    if url != SUPRANK_PAPER[1] and str(loss) not in ("Smooth-AP", "SmoothAPLoss", "CSL", "CSLLoss"):
        papers.append(SUPRANK_PAPER)
    backbone = (card.config.get("model_args") or {}).get("backbone")
    data = f", {card.dataset[1]}" if kind != "unknown" else ""
    name = str(card.name or " ".join(str(x) for x in (loss, "retrieval model", f"({backbone}{data})") if x))
    base_model = _base_model(card.config)
    tags = ["pml-suprank", "image-retrieval", "metric-learning", "pytorch-metric-learning", "timm"]
    intro = f"An image-retrieval embedding model trained with [pml-suprank]({REPO_URL})"
    intro += (f" using {_md(loss)}" if loss else "") + (f" on {_md(card.data_name)}" if data else "")
    uses = _USE_AND_LIMITS.format(data=_md(card.data_name))
    if base_model:
        uses += f"\n- Fine-tuned from [`{base_model}`](https://huggingface.co/{base_model}): its license applies."
    return _join(
        card.front_matter(
            [*tags, *(card.hub.get("tags") or []), loss],
            _split_metrics(card.metrics, card.paper_results)[2],
            "image-feature-extraction",
            model_name=name,
            base_model=base_model,
        ),
        f"# {_md(name)}",
        intro + ". All metrics on this card are percentages (`metrics.json` holds the same numbers as fractions).",
        _short_run_banner(card),
        _overview(card),
        _training_data(card),
        _results(card, title),
        _hyper_parameters(card),
        _compute(card),
        _guard(card),
        uses,
        card.plots_section(),
        _RETRIEVAL_USAGE.format(
            target=card.load_target, comment=card.load_comment + ";" if card.load_comment else "  #"
        ),
        _citation(papers),
    )


def detector_card(card: CardInputs) -> str:
    config, metrics, paper = card.config, card.metrics, card.paper_results
    arch = str(config.get("architecture"))
    args = sorted(dict(config.get("model_args") or {}).items())
    rows = [("detector", f"`{_md(arch)}`"), *((_md(k), f"`{json.dumps(v, sort_keys=True)}`") for k, v in args),
            ("fitted", str(bool(config.get("fitted"))))]  # fmt: skip
    results = []
    for k in [*metrics, *(k for k in paper if k not in metrics)]:
        ours = metrics.get(k)
        cell = str(int(ours)) if k.startswith("num_") and ours is not None else _pct(ours)
        results.append([_md(k), cell, *([_num(paper.get(k))] if paper else [])])
    intro = "Detection metrics in percent (scores: higher = more out-of-distribution)."
    on = f" on {_md(card.data_name)}" if card.dataset[0] != "unknown" else ""
    paper_cite = [(str(card.hub["paper"]), str(card.hub.get("paper_url") or ""))] if card.hub.get("paper") else []
    return _join(
        card.front_matter(
            ["pml-suprank", "out-of-distribution-detection", arch, *(card.hub.get("tags") or [])], list(metrics), None
        ),  # fmt: skip
        f"# {_md(card.name or f'pml-suprank {arch} detector')}",
        f"A post-hoc out-of-distribution detector (`{_md(arch)}`) fitted with [pml-suprank]({REPO_URL}){on}. It "
        "scores feature vectors (and / or logits) of a frozen network: higher = more out-of-distribution.",
        _md(card.description.strip()) if card.description else "",
        _table(("argument", "value"), rows),
        _table(("metric", "this detector", *(["paper"] if paper else [])), results, "Results", intro),
        card.plots_section(),
        _DETECTOR_USAGE.format(target=card.load_target, comment=card.load_comment),
        _citation(paper_cite),
    )
