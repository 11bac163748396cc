"""The rules between options: the one place a value is checked against another option's value.

A single value is checked by its field's metadata (:func:`~pml_suprank.training.config.option`). The rules among the
fields of one option dataclass run when it is built (:func:`training_problems` for
:class:`~pml_suprank.training.TrainingConfig`, :func:`run_problems` for
:class:`~pml_suprank.training.RunOptions`); the rules between parts of a run (loss and data, loss and its options)
run once per :class:`~pml_suprank.training.RunSpec` (:func:`spec_problems`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

__all__ = ["run_problems", "spec_problems", "training_problems"]


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
    from ..losses.registry import entry_options, loss_keywords

    if not v["loss_kwargs"]:
        return []
    entry = v["@entry"]
    valid = loss_keywords(entry.cls)
    unknown = sorted(k for k in v["loss_kwargs"] if valid is not None and k not in valid)
    if unknown:
        return [f"--loss_kwargs {unknown} are not arguments of loss {v['loss']} (valid: {sorted(valid)})"]
    # an argument a flag sets (the loss's own options) or the data and model set: two values, one silently lost
    flagged = set(entry_options(entry, v["@loss_options"])) | {"num_classes", "embedding_size"}
    clash = sorted(k for k in v["loss_kwargs"] if k in flagged and k not in ("loss", "loss_kwargs"))
    if clash:
        return [
            f"--loss_kwargs {clash} set what "
            + ", ".join(
                f"the {k} of the data / model" if k in ("num_classes", "embedding_size") else f"--{k}" for k in clash
            )
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
    from ..losses.registry import entry_options

    accepted = entry_options(v["@entry"], v["@loss_options"])
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


def training_problems(v: Mapping[str, Any]) -> list[str]:
    """The rules among the fields of a :class:`~pml_suprank.training.TrainingConfig`."""
    return _warmup(v) + _batch_groups(v)


def run_problems(v: Mapping[str, Any]) -> list[str]:
    """The rules among the fields of a :class:`~pml_suprank.training.RunOptions`."""
    return _run_flags(v)


def spec_problems(
    values: Mapping[str, Any], entry: Any, *, given: Collection[str], loss_options: Sequence[str],
    require_data_root: bool = True,
) -> list[str]:  # fmt: skip
    """The rules between the parts of a run (``values``: every option; ``entry``: the loss's registry entry;
    ``given``: the options the user set; ``require_data_root``: a benchmark needs ``data_root``)."""
    v = {**values, "@entry": entry, "@given": frozenset(given), "@loss_options": tuple(loss_options),
         "@require_data_root": require_data_root}  # fmt: skip
    return _loss_kwargs(v) + _given_loss_options(v) + _data(v) + _multilabel(v)
