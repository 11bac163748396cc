"""The rules between training options: the one place a value is checked against another option's value.

A single value is checked by its field's metadata (:func:`~pml_suprank.training.config.option`); every rule that
involves two options or more is written once, in :func:`cross_field_problems`, which every entry point reaches: the
option dataclasses' ``__post_init__`` (Python), :class:`~pml_suprank.training.RunSpec` (command line, ``--config``
files and hub_configs). A rule runs when the values it reads are present, so the same function checks a lone
:class:`~pml_suprank.training.TrainingConfig` and a whole run.

``virtual_batch_size`` is another name of ``batch_size`` (the batch the sampler draws and the loss ranks):
:func:`merge_option_layers` lays the option sources over each other (recipe defaults < ``--config`` files < flags)
and lets it set ``batch_size``; two values are a conflict only when given by the user at the same level (or the
batch size at a higher one).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

__all__ = ["cross_field_problems", "merge_option_layers"]


def _warmup(v: Mapping[str, Any]) -> list[str]:
    if v["warmup_epochs"] > 0 and 0 < v["epochs"] <= v["warmup_epochs"]:
        return [f"warmup_epochs must be < epochs = {v['epochs']}; got {v['warmup_epochs']}"]
    return []


def _batch_groups(v: Mapping[str, Any]) -> list[str]:
    """The batch is a whole number of the sampler's groups (``samples_per_class`` images per class, times
    ``super_classes_per_batch`` with the hierarchical sampler)."""
    b, m = v["batch_size"], v["samples_per_class"]
    vb = v["virtual_batch_size"]
    if vb is not None and vb != b:
        return [
            f"virtual_batch_size is another name of batch_size (the batch the sampler draws and the loss ranks): set "
            f"one, or both to the same value; got --virtual_batch_size {vb} and --batch_size {b}"
        ]
    k = v["super_classes_per_batch"] if v["sampler"] == "hierarchical" else 1
    if vb is not None and vb % (k * m):
        group = f"--super_classes_per_batch {k} x --samples_per_class {m}" if k > 1 else f"--samples_per_class {m}"
        lower, upper = vb // (k * m) * k * m, (vb // (k * m) + 1) * k * m
        return [
            f"--virtual_batch_size {vb} is not a whole number of the sampler's groups ({group} = {k * m} images "
            f"per group of classes); use a multiple of {k * m}, e.g. {upper}" + (f" or {lower}" if lower else "")
        ]
    if b % m:
        return [f"batch_size must be a multiple of samples_per_class = {m}; got batch_size={b}"]
    return []


def _loss_kwargs(v: Mapping[str, Any]) -> list[str]:
    from ..losses.registry import entry_options, loss_keywords, resolve_loss

    if not v["loss_kwargs"]:
        return []
    try:
        entry = v.get("@entry") or resolve_loss(v["loss"])
        valid = loss_keywords(entry.cls)
    except ValueError:  # an unknown loss: refused by the loss option's own check
        return []
    unknown = sorted(k for k in v["loss_kwargs"] if valid is not None and k not in valid)
    if unknown:
        return [f"--loss_kwargs {unknown} are not arguments of loss {v['loss']} (valid: {sorted(valid)})"]
    # an argument a flag sets (the loss's own options) or the data and model set: two values, one silently lost
    flagged = set(entry_options(entry, v["@loss_options"])) | {"num_classes", "embedding_size"}
    clash = sorted(k for k in v["loss_kwargs"] if k in flagged and k not in ("loss", "loss_kwargs"))
    if clash:
        return [
            f"--loss_kwargs {clash} set what "
            + ", ".join(f"the {k} of the data / model" if k in ("num_classes", "embedding_size") else f"--{k}"
                        for k in clash)
            + f" sets for loss {v['loss']}: give each value once (by its flag)"
        ]
    return []


def _data(v: Mapping[str, Any]) -> list[str]:
    from ..data.source import data_option_errors

    section = {k: v[k] for k in _DATA_KEYS if v[k] is not None}
    problems = data_option_errors(section, require_root=bool(v.get("@require_data_root")))
    return [f"--dataset {v['dataset']}: " + "; ".join(problems)] if problems else []


def _given_loss_options(v: Mapping[str, Any]) -> list[str]:
    """A loss option the user gave (flag or file key) that the loss does not take."""
    from ..losses.registry import entry_options, resolve_loss

    try:
        accepted = entry_options(v.get("@entry") or resolve_loss(v["loss"]), v["@loss_options"])
    except ValueError:  # an unknown loss: refused by the loss option's own check
        return []
    shared = ("loss", "loss_kwargs", "alpha")  # alpha is also the evaluator's H-AP exponent
    wrong = [n for n in v["@loss_options"] if n in v["@given"] and n not in shared and n not in accepted]
    return [
        f"'loss.{n}' does not apply to loss {v['loss']} (--{n}; its options: {list(accepted)}; others go through "
        "--loss_kwargs)"
        for n in wrong
    ]


def _multilabel(v: Mapping[str, Any]) -> list[str]:
    problems = multilabel_option_errors(v["dataset"], v["loss"], v["memory_size"], v["sampler"])
    return [f"--dataset {v['dataset']}: " + "; ".join(problems)] if problems else []


def multilabel_option_errors(dataset: Any, loss: Any, memory_size: Any, sampler: Any = None) -> list[str]:
    """The problems of training the multi-label ``synthetic_multilabel`` dataset with ``loss`` and the batch
    ``sampler`` option, as messages naming the options; ``[]`` for any other dataset or a supported setting.

    Only the losses registered with ``multilabel=True`` have a multi-label variant (HAPPIER, Sup-H-AP, Sup-NDCG:
    ``relevance="multilabel"``, the thesis' Algorithm 1 relevance), and the batches are drawn by
    :class:`pml_suprank.samplers.MultiLabelSampler` (``sampler`` must keep its default ``m_per_class``). A memory
    (``memory_size``, accepted for the signature) stores the label sets (:class:`pml_suprank.memory.RankingMemory`).
    """
    if dataset != "synthetic_multilabel":
        return []
    from ..losses.registry import registered_losses

    errors = []
    multilabel_losses = list(registered_losses(multilabel=True))
    if loss is not None and loss not in multilabel_losses:
        errors.append(
            f"'loss' {loss} has no multi-label variant: dataset synthetic_multilabel (several labels per image) "
            f"trains with {' or '.join(multilabel_losses)} only"
        )
    if sampler not in (None, "m_per_class"):
        errors.append(
            f"'sampler' {sampler}: dataset synthetic_multilabel is sampled by MultiLabelSampler (m items per label); "
            "keep sampler m_per_class"
        )
    return errors


def _run_flags(v: Mapping[str, Any]) -> list[str]:
    """Flag combinations that would only fail after training."""
    errors = []
    if v["push_to_hub"]:
        if not v["hub_model_id"]:
            errors.append("--push_to_hub true needs --hub_model_id (e.g. your-name/happier-synthetic)")
        else:
            from ..hub.transport import check_repo_id

            try:
                check_repo_id(v["hub_model_id"])
            except ValueError as e:
                errors.append(f"--hub_model_id: {e}")
    if v["resume_ignore_config"] and v["resume"] is None:
        errors.append("--resume_ignore_config true needs --resume (a checkpoint folder or 'latest')")
    if v["overwrite_output_dir"] and v["resume"] is not None:
        errors.append("--overwrite_output_dir true starts a new run: it cannot be combined with --resume")
    return errors


_DATA_KEYS = ("dataset", "data_root", "label_columns", "train_split", "test_split", "open_set",
              "train_classes_per_coarse", "train_class_fraction")  # fmt: skip

#: ``(options read, rule)``: each rule runs when all the options it reads are among the values checked
RULES: tuple[tuple[tuple[str, ...], Callable[[Mapping[str, Any]], list[str]]], ...] = (
    (("warmup_epochs", "epochs"), _warmup),
    (("batch_size", "virtual_batch_size", "samples_per_class", "sampler", "super_classes_per_batch"), _batch_groups),
    (("loss", "loss_kwargs"), _loss_kwargs),
    (("loss", "@given", "@loss_options"), _given_loss_options),
    (_DATA_KEYS, _data),
    (("dataset", "loss", "memory_size", "sampler"), _multilabel),
    (("push_to_hub", "hub_model_id", "resume", "resume_ignore_config", "overwrite_output_dir"), _run_flags),
)


def cross_field_problems(
    values: Mapping[str, Any],
    *,
    given: Collection[str] | None = None,
    loss_options: Sequence[str] = (),
    require_data_root: bool = False,
) -> list[str]:
    """Every broken rule between the options of ``values`` (``{option name: value}``, values already checked one
    by one), as messages naming the options; ``[]`` when consistent.

    Args:
        values: Option values; a rule runs when every option it reads is there.
        given: The options the user set (flags, file keys): a loss option (of ``loss_options``, the hub_config
            ``loss`` section) given for a loss that does not take it is refused (``None``: not checked).
        loss_options: The names of the loss options.
        require_data_root: A benchmark dataset needs ``data_root`` (a complete run; a shipped hub_config leaves it
            to the command line).
    """
    context = {**values, "@require_data_root": require_data_root, "@loss_options": tuple(loss_options)}
    if given is not None:
        context["@given"] = frozenset(given)
    problems: list[str] = []
    for names, rule in RULES:
        if all(n in context for n in names):
            problems += rule(context)
    return problems


def merge_option_layers(layers: Sequence[tuple[str, Mapping[str, Any]]], explicit_from: int = 1) -> dict[str, Any]:
    """Lay ``(source, {option: value})`` layers over each other in order (a later one wins), with
    ``virtual_batch_size`` as another name of ``batch_size``: a layer giving it sets ``batch_size`` too.

    Layers from index ``explicit_from`` on were set by the user (``--config`` files, flags; before it: the recipe's
    defaults). ``batch_size`` and ``virtual_batch_size`` given with different values in the same user layer, or the
    batch size in a later one than the virtual batch (which it would silently undo), are refused.

    Raises:
        ValueError: naming both options and their sources.
    """
    out: dict[str, Any] = {}
    level: dict[str, int] = {}
    for i, (_, layer) in enumerate(layers):
        for name, value in layer.items():
            out[name], level[name] = value, i
        vb, b = layer.get("virtual_batch_size"), layer.get("batch_size")
        if vb is not None and b is None:
            out["batch_size"], level["batch_size"] = vb, i
    vb, b = out.get("virtual_batch_size"), out.get("batch_size")
    if (
        vb is not None
        and b is not None
        and vb != b
        and level["virtual_batch_size"] >= explicit_from
        and level["batch_size"] >= max(level["virtual_batch_size"], explicit_from)
    ):
        where = layers[level["virtual_batch_size"]][0], layers[level["batch_size"]][0]
        source = where[0] if where[0] == where[1] else f"{where[0]} and {where[1]}"
        raise ValueError(
            f"--virtual_batch_size {vb} and --batch_size {b} differ ({source}): --virtual_batch_size is the batch "
            "the sampler draws and the loss ranks, it replaces --batch_size; give one of them (or the same value to "
            "both)"
        )
    if vb is not None and b is not None and vb != b:  # a default virtual batch follows the batch size the user gave
        out["virtual_batch_size"] = b
    return out
