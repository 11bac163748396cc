"""The sections of a model card (:mod:`pml_suprank.hub.card` assembles them): the retrieval layout — overview, training
data, results with the paper's numbers, metric definitions, hyper-parameters, compute, the OOD guard, uses and
limits, citations — and the detector layout. Each section is a list of markdown lines built from a
:class:`~pml_suprank.hub.card.CardInputs`.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..losses.registry import SUPRANK_PAPER, loss_entry
from ..metrics.report import headline_keys, metric_label, metric_legend, same_as

if TYPE_CHECKING:  # pragma: no cover
    from .card import CardInputs

#: class names listed per split before the rest is only counted
MAX_CLASSES_LISTED = 50
REPO_URL = "https://github.com/pml-suprank/pml-suprank"

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
    text = _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=True))
    return _MD_EDGE_UNDERSCORE.sub(r"\\_", text)


def _pct(value: Any) -> str:
    """A fraction in [0, 1] as a percentage with two decimals; ``–`` when absent or not finite."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
        return f"{100.0 * float(value):.2f}"
    return "–"


def _num(value: Any) -> str:
    """A published number (already in percent) with two decimals; ``–`` when absent."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
        return f"{float(value):.2f}"
    return "–"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table, or nothing without rows."""
    if not rows:
        return []
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def _paper(loss: Any) -> tuple[str, str]:
    """``(title, url)`` of the paper of the registered loss ``loss`` (name or class name; else the SupRank paper)."""
    try:
        paper = loss_entry(str(loss)).paper
    except ValueError:
        paper = None
    return paper or SUPRANK_PAPER


def _data_phrase(kind: str, name: str) -> str:
    """How the card's text names the training data."""
    return {
        "synthetic": f"SyntheticShapes ({name}, built into pml-suprank)",
        "benchmark": f"the {name} benchmark",
        "local": f"{name} (a local dataset)",
        "hub": name,
    }.get(kind, name)


# ---------------------------------------------------------------------------------------------------- sections
def _retrieval_overview(config: Mapping[str, Any], training: Mapping[str, Any]) -> list[str]:
    args = dict(config.get("model_args") or {})
    pcfg = dict(config.get("pretrained_cfg") or {})
    rows = [
        ("backbone", f"`{args.get('backbone')}` (timm)"),
        ("pooling", f"{args.get('pooling')}{' + LayerNorm (no affine)' if args.get('layer_norm') else ''}"),
        ("embedding size", f"{config.get('embedding_size')} (L2-normalised)"),
        ("input size", str(pcfg.get("input_size"))),
        ("mean / std", f"{pcfg.get('mean')} / {pcfg.get('std')}"),
    ]
    if training.get("label_names"):
        rows.append(("label hierarchy (fine → coarse)", ", ".join(_md(n) for n in training["label_names"])))
    if training.get("hub_config"):
        rows.append(("hub_config", _md(training["hub_config"])))
    return ["## Model", "", *_table(("property", "value"), rows)]


def _class_list(counts: Mapping[str, Any], total: int) -> str:
    shown = list(counts.items())[:MAX_CLASSES_LISTED]
    text = ", ".join(f"{_md(name)} ({int(n)})" for name, n in shown)
    rest = total - len(shown)
    return text + (f", … and {rest} more classes" if rest > 0 else "")


def _training_data(inputs: CardInputs) -> list[str]:
    kind, short, hub_id = inputs.dataset
    name = _data_phrase(kind, short)
    data = dict(inputs.training.get("data_summary") or {})
    label_names = inputs.training.get("label_names")
    lines = ["## Training data", ""]
    if kind == "hub":
        lines.append(f"[{_md(name)}](https://huggingface.co/datasets/{hub_id}) from the Hugging Face Hub.")
    elif kind == "synthetic":
        lines.append(
            f"{_md(name)}: procedurally rendered shapes (coarse class = shape family, fine class = variant × colour);"
            " training and test classes are disjoint (open-set retrieval)."
        )
    elif kind == "benchmark":
        lines.append(f"{_md(name)}, read from its archive with `pml_suprank.data.load_benchmark`.")
    elif kind == "local":
        lines.append(f"{_md(name)}: images of the trainer's own, not published with this model.")
    else:
        lines.append("Not recorded.")
    if label_names:
        lines[-1] += f" Label columns (finest first): {', '.join(_md(n) for n in label_names)}."
    lines.append("")
    rows = []
    for part in ("train", "test"):
        s = data.get(part)
        if isinstance(s, Mapping):
            classes = _class_list(dict(s.get("class_counts") or {}), int(s.get("classes", 0)))
            rows.append((part, str(s.get("images", "–")), str(s.get("classes", "–")), classes or "–"))
    lines += _table(("split", "images", "fine classes", "classes (images)"), rows)
    return lines


def _split_metrics(metrics: Mapping[str, float], paper_results: Mapping[str, Any]) -> tuple[dict, dict, list, list]:
    """``(counts, rates, headline keys, other keys)``: ``num_*`` counts apart, headline metrics first."""
    counts = {k: v for k, v in metrics.items() if k.startswith("num_")}
    rates = {k: v for k, v in metrics.items() if k not in counts}
    main_keys = headline_keys(rates, paper_results)
    other_keys = [k for k in rates if k not in main_keys and not _shown_as_another(rates, k)]
    other_keys.sort(key=lambda k: (int(k.rpartition("_level")[2]) if k.rpartition("_level")[2].isdigit() else -1, k))
    return counts, rates, main_keys, other_keys


def _shown_as_another(rates: Mapping[str, float], key: str) -> bool:
    """``key`` holds, by definition, the number of a key that is also in ``rates`` (``ap_level0`` = ``ap``,
    ``precision_at_1`` = ``recall_at_1``, ...): each number is listed once."""
    kept = same_as(key)
    return kept is not None and kept in rates and math.isclose(float(rates[key]), float(rates[kept]), rel_tol=1e-9)


def _definitions(keys: Sequence[str], label_names: Any) -> list[str]:
    """One bullet per displayed metric label: its definition from the metric registry, with its ``k`` and its label
    column filled in."""
    seen: dict[str, str] = {}
    for k in keys:
        label = metric_label(k, label_names)
        legend = metric_legend([k])
        if not legend or label in seen:
            continue
        text = legend.split(" = ", 1)[1]
        top = re.search(r"_at_(\d+)", k)
        if top:
            text = re.sub(r"\bk\b", top.group(1), text)
        level = re.search(r"_level(\d+)$", k)
        if level:
            h = int(level.group(1))
            column = label_names[h] if label_names and h < len(label_names) else f"{h}"
            text = text.replace("label column h (0 = finest)", f"label column {column}")
            text = text.replace("label column h", f"label column {column}")
        seen[label] = text
    if not seen:
        return []
    lines = ["Definitions (positives: items of the query's fine class unless a label column is named; ties ranked "
             "pessimistically; the query is removed from the gallery):", ""]  # fmt: skip
    lines += [f"- **{_md(label)}**: {_md(text)}" for label, text in seen.items()]
    return [*lines, ""]


def _retrieval_results(inputs: CardInputs, title: str) -> list[str]:
    paper_results, label_names = inputs.paper_results, inputs.training.get("label_names")
    counts, rates, main_keys, other_keys = _split_metrics(inputs.metrics, paper_results)
    if not main_keys and not other_keys:
        return []
    with_paper = any(math.isfinite(float(v)) for v in paper_results.values() if isinstance(v, (int, float)))
    lines = ["## Results", "", "Exact metrics over the whole test gallery, in percent."]
    if with_paper:
        lines[-1] += f" The paper column reports the published numbers of the corresponding setting ({_md(title)})."
    lines.append("")
    rows = []
    for k in main_keys:
        row = [_md(metric_label(k, label_names)), _pct(rates.get(k))]
        rows.append([*row, _num(paper_results.get(k))] if with_paper else row)
    lines += _table(("metric", "this model", "paper") if with_paper else ("metric", "this model"), rows)
    if "num_queries" in counts:
        lines += [f"Evaluated with {int(counts['num_queries'])} queries.", ""]
    if other_keys:
        lines += ["<details><summary>All metrics</summary>", ""]
        lines += _table(
            ("metric", "this model"), [(_md(metric_label(k, label_names)), _pct(rates[k])) for k in other_keys]
        )
        lines += ["</details>", ""]
    return lines + _definitions([*main_keys, *other_keys], label_names)


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


def _has_proxies(inputs: CardInputs) -> bool:
    if any("lr_proxies" in r for r in inputs.history):
        return True
    kwargs = dict(inputs.training.get("loss_kwargs") or {})
    return kwargs.get("decomposability") == "proxy" or str(inputs.training.get("loss")) in (
        "HAPPIER", "HAPPIER_F", "ROD-NDCG", "CSL", "HAPPIERLoss", "RODNDCGLoss", "CSLLoss",
    )  # fmt: skip


def _hyper_parameters(inputs: CardInputs) -> list[str]:
    """The loss, its options and the optimisation settings of the run (learning rates, steps)."""
    training = inputs.training
    tc = dict(training.get("training_config") or {})
    rows: list[tuple[str, str]] = []
    if training.get("loss"):
        rows.append(("loss", _md(training["loss"])))
    for k, v in sorted(dict(training.get("loss_kwargs") or {}).items()):
        if v is not None:
            rows.append((f"loss: {_md(k)}", f"`{json.dumps(v)}`"))
    keys = ["optimizer", "lr_backbone", "lr_head", "lr_proxies", "weight_decay", "scheduler", "min_lr_ratio",
            "warmup_epochs", "batch_size", "virtual_batch_size", "sampler", "samples_per_class", "epochs",
            "max_train_steps", "memory_size", "seed"]  # fmt: skip
    if not _has_proxies(inputs):
        keys.remove("lr_proxies")
    for k in keys:
        if tc.get(k) is not None:
            rows.append((k, f"`{json.dumps(tc[k])}`"))
    steps = inputs.summary.get("steps")
    if isinstance(steps, int):
        rows.append(("optimizer steps done", str(steps)))
    return ["## Training hyper-parameters", "", *_table(("setting", "value"), rows)] if rows else []


def _compute(inputs: CardInputs) -> list[str]:
    compute = dict(inputs.training.get("compute") or {})
    summary = inputs.summary
    rows: list[tuple[str, str]] = []
    if compute.get("device"):
        device = str(compute["device"])
        if compute.get("device_name"):
            device += f" ({_md(compute['device_name'])})"
        rows.append(("device", device))
    processes = compute.get("num_processes", summary.get("num_processes"))
    if processes is not None:
        rows.append(("processes", str(processes)))
    precision = compute.get("mixed_precision", summary.get("mixed_precision"))
    if precision is not None:
        rows.append(("mixed precision", _md(precision)))
    seconds = summary.get("train_time_s")
    if isinstance(seconds, (int, float)) and math.isfinite(seconds):
        rows.append(("training time", f"{seconds:.0f} s" if seconds < 3600 else f"{seconds / 3600:.1f} h"))
    for k in ("torch", "pml_suprank"):
        if compute.get(k):
            rows.append((k, _md(compute[k])))
    return ["## Compute", "", *_table(("item", "value"), rows)] if rows else []


def _short_run(inputs: CardInputs) -> str | None:
    """The console's short-run warning of the run, when it warned (the same rule and text)."""
    from ..data.batch_fit import short_run_warning

    schedule = dict(inputs.training.get("schedule") or {})
    tc = dict(inputs.training.get("training_config") or {})
    total = schedule.get("total_steps")
    if not isinstance(total, int) or total <= 0:
        total = tc.get("max_train_steps")
        if not isinstance(total, int):
            return None
    per_epoch = schedule.get("steps_per_epoch") or total
    epochs = tc.get("epochs") if isinstance(tc.get("epochs"), int) else 1
    return short_run_warning(int(per_epoch), int(total), epochs=epochs, max_train_steps=tc.get("max_train_steps"))


def _use_and_limits(inputs: CardInputs, base_model: str | None) -> list[str]:
    kind, short, _ = inputs.dataset
    name = _data_phrase(kind, short)
    lines = [
        "## Intended use and limitations",
        "",
        f"- **Use:** embed images of the domain of {_md(name)} and rank a gallery by cosine similarity (nearest-"
        "neighbour search, e.g. `pml_suprank.search.RetrievalIndex`); with a label hierarchy, nearer items share "
        "finer labels.",
        "- Compare embeddings of this model only with embeddings of the same model and preprocessing.",
        "- The results above are measured on the held-out test split of the training data; quality on other image"
        " domains is not measured. Not for decisions about people (identification, surveillance).",
    ]
    if base_model:
        lines.append(f"- Fine-tuned from [`{base_model}`](https://huggingface.co/{base_model}): its license applies.")
    return [*lines, ""]


def _short_run_banner(inputs: CardInputs) -> list[str]:
    warning = _short_run(inputs)
    if not warning:
        return []
    text = warning.removeprefix("warning: ")
    return [f"> **Warning — short run:** {_md(text)}. A demonstration or smoke test, not a usable model.", ""]


def _guard(inputs: CardInputs) -> list[str]:
    """The OOD guard stored with the model (``ood/guard.json``): its detector, threshold and what was measured."""
    guard = inputs.guard
    if not guard:
        return []
    higher = guard.get("higher_is_ood", True)
    rule = "score > threshold" if higher else "score < threshold"
    lines = [
        "## Out-of-distribution guard",
        "",
        f"This model ships with an OOD guard (`ood/`): a {_md(guard.get('detector'))} detector on "
        f"{_md(guard.get('feature_kind'))} features of these weights (their SHA-256 is in `ood/guard.json`; "
        f"another model's guard is refused). An image is rejected as unknown when its {rule} "
        f"(higher = more out-of-distribution: {'yes' if higher else 'no'}). Rates in percent.",
        "",
    ]
    rows = [("threshold", _md(guard.get("threshold")))]
    if isinstance(guard.get("tpr_target"), (int, float)):
        rows.append(("target ID true-positive rate (images kept)", _pct(guard["tpr_target"])))
    if isinstance(guard.get("id_tpr"), (int, float)):
        rows.append(("measured ID true-positive rate (held-out ID images)", _pct(guard["id_tpr"])))
    lines += _table(("setting", "value"), rows)
    sets = guard.get("ood_sets") or {}
    if isinstance(sets, Mapping) and sets:
        lines += _table(
            ("OOD set", "FPR at the threshold (OOD accepted)", "AUROC"),
            [(_md(n), _pct((m or {}).get("fpr")), _pct((m or {}).get("auroc"))) for n, m in sets.items()
             if isinstance(m, Mapping)],
        )  # fmt: skip
    lines += [
        "```python",
        "from pml_suprank.models import RetrievalModel",
        "",
        f'model = RetrievalModel.from_pretrained("{inputs.load_target}")',
        "guard = model.ood_guard  # the stored detector, its threshold and its feature kind",
        "```",
        "",
    ]
    return lines


def _citation(papers: Sequence[tuple[str, str]]) -> list[str]:
    lines = ["## Citation", ""]
    seen: list[str] = []
    for title, url in papers:
        if url in seen:
            continue
        seen.append(url)
        lines += [f"{_md(title)}: {url}", ""]
        if url in _BIBTEX:
            lines += ["```bibtex", _BIBTEX[url], "```", ""]
    return lines


def retrieval_card(inputs: CardInputs) -> str:
    hub, training = inputs.hub, inputs.training
    loss = training.get("loss")
    _, _, main_keys, _ = _split_metrics(inputs.metrics, inputs.paper_results)
    tags = ["pml-suprank", "image-retrieval", "metric-learning", "pytorch-metric-learning", "timm"]
    title, url = _paper(loss)
    if hub.get("paper"):
        title, url = str(hub["paper"]), str(hub.get("paper_url") or url)
    backbone = (inputs.config.get("model_args") or {}).get("backbone")
    kind, short_data, _ = inputs.dataset
    data_name = _data_phrase(kind, short_data)
    short_data = short_data if kind != "unknown" else None
    name = inputs.title(
        " ".join(
            str(x) for x in (loss, "retrieval model", f"({backbone}" + (f", {short_data})" if short_data else ")")) if x
        )  # fmt: skip
    )
    papers = [(title, url)]
    if url != SUPRANK_PAPER[1] and str(loss) not in ("Smooth-AP", "SmoothAPLoss", "CSL", "CSLLoss"):
        papers.append(SUPRANK_PAPER)
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
        f"# {_md(name)}",
        "",
        f"An image-retrieval embedding model trained with [pml-suprank]({REPO_URL})"
        + (f" using {_md(loss)}" if loss else "")
        + (f" on {_md(data_name)}" if kind != "unknown" else "")
        + ". All metrics on this card are percentages (`metrics.json` holds the same numbers as fractions).",
        "",
        *_short_run_banner(inputs),
        *_retrieval_overview(inputs.config, training),
        *_training_data(inputs),
        *_retrieval_results(inputs, title),
        *_hyper_parameters(inputs),
        *_compute(inputs),
        *_guard(inputs),
        *_use_and_limits(inputs, _base_model(inputs.config)),
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
        *_citation(papers),
    ]
    return "\n".join(lines)


def _detector_results(inputs: CardInputs) -> list[str]:
    metrics, paper_results = inputs.metrics, inputs.paper_results
    keys = [*metrics, *(k for k in paper_results if k not in metrics)]
    if not keys:
        return []
    with_paper = bool(paper_results)
    rows = []
    for k in keys:
        ours = metrics.get(k)
        cell = str(int(ours)) if k.startswith("num_") and ours is not None else _pct(ours)
        rows.append([_md(k), cell, _num(paper_results.get(k))] if with_paper else [_md(k), cell])
    header = ("metric", "this detector", "paper") if with_paper else ("metric", "this detector")
    return ["## Results", "", "Detection metrics in percent (scores: higher = more out-of-distribution).", "",
            *_table(header, rows)]  # fmt: skip


def detector_card(inputs: CardInputs) -> str:
    config, hub = inputs.config, inputs.hub
    arch = str(config.get("architecture"))
    args = dict(config.get("model_args") or {})
    kind, short, _ = inputs.dataset
    data_name = _data_phrase(kind, short)
    rows = [
        ("detector", f"`{_md(arch)}`"),
        *((_md(k), f"`{json.dumps(v, sort_keys=True)}`") for k, v in sorted(args.items())),
    ]
    rows.append(("fitted", str(bool(config.get("fitted")))))
    lines = [
        "---",
        inputs.yaml(["pml-suprank", "out-of-distribution-detection", arch], list(inputs.metrics), None),
        "---",
        "",
        f"# {_md(inputs.title(f'pml-suprank {arch} detector'))}",
        "",
        f"A post-hoc out-of-distribution detector (`{_md(arch)}`) fitted with [pml-suprank]({REPO_URL})"
        + (f" on {_md(data_name)}" if kind != "unknown" else "")
        + ". It scores feature vectors (and / or logits) of a frozen network: higher = more out-of-distribution.",
        "",
        *([_md(inputs.description.strip()), ""] if inputs.description else []),
        *_table(("argument", "value"), rows),
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
        lines += _citation([(str(hub["paper"]), str(hub.get("paper_url") or ""))])
    return "\n".join(lines)
