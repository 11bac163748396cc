"""The specs of the OOD recipes, :class:`FitHeatSpec` (``fit_heat``) and :class:`OODBenchmarkSpec`
(``ood_benchmark``), their detector options (generated from the detector registry) and their ``--config`` reader."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, make_dataclass
from typing import Any

from .._validation import OptionCheck, is_bool, is_choice, is_finite, is_int, is_number, is_str, list_of, optional
from ..ood import HEAT, get_detector, list_detectors, list_priors
from ..ood.priors import PRESETS
from ..training.config import OptionError, TrainingConfig, option, validate_options
from ..training.options import DataOptions, ModelOptions, ModelUseOptions, RunOptions, run_rules
from ..training.spec import read_sections, shared

__all__ = ["VARIANTS", "FitHeatSpec", "OODBenchmarkSpec", "available_detectors", "detector_arguments",
           "detector_options", "flag_prefix", "methods"]  # fmt: skip

#: built-in OOD sets of the recipes (no download)
BUILTIN_OOD = ("synthetic-heldout", "noise-uniform", "noise-gaussian", "noise-blobs")
#: Table rows that are a registered detector with other constructor arguments: name -> (detector, kwargs).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {"SSD+": ("Mahalanobis", {"normalize": True})}
#: Constructor arguments the recipe fills itself (the classifier head, the network).
CONTEXT_ARGUMENTS = ("weight", "bias", "head", "model")
#: Recipe defaults that differ from the class defaults: HEAT's evaluation code clips ReAct at the 95th percentile;
#: ViM's principal dimension None means min(256, D // 2, (N - 1) // 2), known only after extraction.
RECIPE_DEFAULTS: dict[str, Any] = {"react_percentile": 95.0, "vim_dim": None}
#: table rows that score images through the network, not features: no ``ood_benchmark`` row
NEEDS_IMAGES = ("ODIN",)
#: the largest count of images a synthetic or noise set may hold (a few GB of pixels at 224 px; as --num_per_class)
MAX_IMAGES = 100_000
_MARKUP = r":\w+:`~?(?:[\w.]+\.)?(\w+)`|``|\*\*"  # a reST role (its last name kept), ``code``, **bold**


def methods() -> tuple[str, ...]:
    """Table rows: every registered detector but HEAT (registration order), each followed by its variants; HEAT."""
    rows = [r for n in list_detectors() for r in (n, *(v for v, (base, _) in VARIANTS.items() if base == n))]
    return (*(r for r in rows if r != "HEAT"), "HEAT")


def available_detectors() -> tuple[str, ...]:
    """The rows ``ood_benchmark`` computes from saved features: :func:`methods` but those in :data:`NEEDS_IMAGES`."""
    return tuple(m for m in methods() if m not in NEEDS_IMAGES)


def flag_prefix(name: str) -> str:
    """The flag prefix of a detector: ``"NNGuide"`` → ``"nnguide"``."""
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def detector_options(name: str) -> dict[str, inspect.Parameter]:
    """Constructor arguments of a registered detector that get a flag: plain (bool / int / float / str) defaults."""
    params = inspect.signature(get_detector(name)).parameters.values()  # *args / **kwargs have no plain default
    return {p.name: p for p in params if isinstance(p.default, (bool, int, float, str)) and p.kind != p.POSITIONAL_ONLY
            and p.name not in CONTEXT_ARGUMENTS}  # fmt: skip


def detector_option_class() -> type:
    """A dataclass of the ``<detector>_<argument>`` options of every registered baseline (read when called; an
    instance checks its values). Help: the argument's line of the class docstring, without reST markup."""
    specs = []
    for name in (n for n in list_detectors() if n != "HEAT"):
        cls = get_detector(name)
        for argument, param in detector_options(name).items():
            dest, kind = f"{flag_prefix(name)}_{argument}", type(param.default)
            default = RECIPE_DEFAULTS.get(dest, param.default)
            check = {bool: is_bool(), int: is_int(0), float: is_finite()}.get(kind, is_str())
            kind, check = (kind, check) if default is not None else (kind | None, optional(check))
            line = re.search(rf"^\s+{re.escape(argument)}: (.+)$", inspect.getdoc(cls) or "", flags=re.MULTILINE)
            text = re.sub(_MARKUP, r"\1", line[1]) if line else f"constructor argument {argument}"
            specs.append((dest, kind, option(default, f"{cls.__name__}: {text}", check=check)))
    namespace = {"GROUP": "baseline options", "__post_init__": validate_options}
    return make_dataclass("DetectorOptions", specs, namespace=namespace)


def detector_arguments(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flagged constructor arguments of the registered baseline ``name`` from ``options`` (a spec's
    ``detector_options``, ``{"knn_k": 50, ...}``; a hand-built spec's may be partial or ``None``): an argument it
    lacks takes its recipe default. ``ValueError``: a key that is no baseline option, a value its option refuses."""
    option_cls, options = detector_option_class(), dict(options or {})
    if unknown := sorted(set(options) - (valid := {f.name for f in fields(option_cls)})):
        raise ValueError(f"detector_options: unknown key(s) {unknown}; valid keys: {sorted(valid)}")
    values = asdict(option_cls(**options))  # each value checked by its option
    return {argument: values[f"{flag_prefix(name)}_{argument}"] for argument in detector_options(name)}


_BETA = OptionCheck(lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and not math.isnan(v),
                    "a number or ±inf (0 = sum, -1, 1, inf, -inf)")  # fmt: skip
_MAPPING = OptionCheck(lambda v: isinstance(v, dict), "a mapping")
_NAMES = optional(list_of(is_str(), "a list of names"))


@dataclass
class FitHeatSpec:
    """Every option of the ``fit_heat`` recipe; ``None`` defaults are resolved from the data by ``fit_heat.resolved``.
    With ``--model``, the model folder's ``data_spec.json`` is a layer under the flags (``model_data``, its seed)."""

    DESCRIPTION = "Fit HEAT + OOD baselines on a timm classifier's features (see the module docstring)."
    #: the groups of --help, in order: (title, first field of the group)
    GROUPS = (("run", "output_dir"), ("model", "model"), ("data", "id_dataset"),
              ("HEAT (Lafon et al., ICML 2023)", "preset"), ("baselines (generated from ood.list_detectors())",
              "detectors"))  # fmt: skip
    CONFIG_HELP = "a bundled config name (e.g. heat_cifar10_resnet34) or a YAML file; flags win"
    MODEL_DATA = ("id_dataset",)

    # run
    output_dir: str = shared(TrainingConfig, "output_dir", "outputs/fit_heat",
                             "where to write results, plots and the detector")  # fmt: skip
    overwrite_output_dir: bool = shared(RunOptions, "overwrite_output_dir", False,
                                        "replace the results.json of a previous run in --output_dir")  # fmt: skip
    push_to_hub: bool = shared(RunOptions, "push_to_hub", False,
                               "upload the fitted HEAT detector to the Hub (needs --hub_model_id)")  # fmt: skip
    hub_model_id: str | None = shared(RunOptions, "hub_model_id", None, "Hub repo id for --push_to_hub, e.g. me/heat")
    hub_private: bool = shared(RunOptions, "hub_private")
    device: str = shared(ModelUseOptions, "device", "cpu", "'cpu', 'cuda', ...")
    threads: int | None = option(None, "torch CPU threads (unset: torch's choice)", check=optional(is_int(1, 4096)))
    seed: int = shared(TrainingConfig, "seed", 0, "seed for data, training and HEAT (the model's when it records one)")
    no_plots: bool = shared(RunOptions, "no_plots", False, "do not write histograms")
    progress: bool = option(True, "show progress bars (stderr)", check=is_bool())
    # model
    model: str | None = option(None, "a retrieval model folder written by the training recipes (RUN/final) or its Hub "
                               "id: its backbone and data spec, with a classifier head trained on the ID set (replaces "
                               "--backbone / --checkpoint)", check=optional(is_str()), file=False)  # fmt: skip
    guard: str = option("HEAT", "with --model: the detector stored in the model folder as its OOD guard (final/ood/, "
                        "a table row scoring features), or 'none'", check=is_str())  # fmt: skip
    ood_tpr: float = option(0.95, "with --model: share of held-out ID images the guard's threshold keeps",
                            check=is_number(0, strict=True, high=1))  # fmt: skip
    backbone: str = option("test_resnet", "timm model name (test_resnet: a tiny timm ResNet)", check=is_str())
    pretrained: bool = shared(ModelOptions, "pretrained")
    checkpoint: str | None = option(None, "state dict (.pt / .safetensors) of the timm classifier",
                                    check=optional(is_str()), file=False)  # fmt: skip
    cifar_stem: bool = option(False, "ResNet with a 3x3 stride-1 stem and no max-pool", check=is_bool())
    output_stride: int | None = option(None, "timm output_stride (unset: 8 on synthetic, else 32)",
                                       check=optional(is_choice(8, 16, 32)))  # fmt: skip
    train_epochs: int | None = option(None, "epochs of classifier-head training before fitting (unset: 0 with "
                                      "--checkpoint, else 10 on synthetic data and 5 on other data; 0 needs a trained "
                                      "head)", check=optional(is_int(0, 10_000)))  # fmt: skip
    lr: float = option(5e-3, "classifier learning rate (AdamW, one-cycle)", check=is_number(0, strict=True, high=10))
    batch_size: int = shared(ModelUseOptions, "batch_size", 64, "batch size for training and feature extraction")
    # data
    id_dataset: str | None = option(None, "'synthetic', a Hub dataset id or a local folder (unset: the training data "
                                    "of --model, else synthetic)", check=optional(is_str()))  # fmt: skip
    label_column: str | None = option(None, "class label column (unset: coarse_label on synthetic, else label)",
                                      check=optional(is_str()))  # fmt: skip
    id_train_split: str = option("train", "split of the ID dataset used to fit the detectors", check=is_str())
    id_test_split: str = option("test", "split of the ID dataset used as ID test set", check=is_str())
    ood_datasets: list[str] = option(["synthetic-heldout", "noise-uniform", "noise-blobs"], "OOD sets (space-"
                                     f"separated): built-in {', '.join(BUILTIN_OOD)} or SOURCE[:SPLIT[:LABEL_COLUMN]] "
                                     "(Hub id / local folder; no SPLIT: 'test', or the folder's only split)",
                                     check=list_of(is_str(), "a list of OOD sets"))  # fmt: skip
    ood_label_column: str = option("label", "default label column of Hub / folder OOD sets (unused)", check=is_str())
    cache_dir: str | None = option(None, "datasets cache folder for Hub / folder datasets", check=optional(is_str()))
    embedding_cache: str | None = shared(ModelUseOptions, "embedding_cache")
    image_size: int | None = shared(DataOptions, "image_size", None, "image side (unset: synthetic 32, else model's)")
    num_per_class: int = shared(DataOptions, "num_per_class", 40, "synthetic: training images per fine class")
    num_test_per_class: int = option(12, "synthetic: test images per fine class", check=is_int(1, MAX_IMAGES))
    num_noise: int = option(200, "images per built-in noise OOD set", check=is_int(1, MAX_IMAGES))
    max_samples: int | None = option(None, "cap every split at this many images", check=optional(is_int(1)))
    # HEAT
    preset: str = option("fast", "HEAT hyper-parameter preset", check=is_choice(*sorted(PRESETS)))
    heat_epochs: int | None = option(None, "override the preset's epochs (unset: 30 on synthetic)",
                                     check=optional(is_int(1, 100_000)))  # fmt: skip
    heat_batch_size: int | None = option(None, "override the preset's batch (unset: 128 on synthetic)",
                                         check=optional(is_int(1, 1 << 20)))  # fmt: skip
    beta: float = option(0.0, "HEAT composition β (0 = sum, -1, 1, inf, -inf)", check=_BETA)
    priors: list[str] = option(["gmm", "gmm_std", "el"], "HEAT priors (registered names, ood.list_priors())",
                               check=list_of(is_str(), "a non-empty list of prior names"))  # fmt: skip
    tie_hidden_weights: bool = option(False, "share HEAT's hidden layer (the authors' released MLP)", check=is_bool())
    convention: str = option("id_positive", "FPR95 convention: id_positive (thesis / HEAT) or ood_positive (OpenOOD "
                             "v1.5)", check=is_choice("id_positive", "ood_positive", "id_positive_roc"))  # fmt: skip
    heat_settings: dict | None = option(None, "per-prior HEAT settings (the config file's heat.settings)", cli=False,
                                        check=optional(_MAPPING))  # fmt: skip
    # baselines
    detectors: list[str] | None = option(None, "table rows to compute (unset: all; see --help)", check=_NAMES)
    no_odin: bool = option(False, "skip ODIN (needs a backward pass per batch)", check=is_bool())
    detector_options: dict | None = option(None, "constructor arguments of the baselines, {'knn_k': 50, ...}",
                                           cli=False, check=optional(_MAPPING))  # fmt: skip
    model_data: dict | None = shared(ModelUseOptions, "model_data")

    @classmethod
    def option_classes(cls) -> tuple[type, ...]:
        """The spec and the detector options (:func:`detector_option_class`): the recipe's flags."""
        return cls, detector_option_class()

    @classmethod
    def read_config(cls, path: str) -> tuple[dict[str, Any], dict[str, tuple[str, Any]]]:
        """A ``--config`` file (a bundled name or a YAML path): its ``recipe`` and ``heat`` sections; a backbone that is
        not a plain timm name is refused (files are data; ``parse`` refuses the ``file=False`` options), a training
        hub_config in one line naming its recipe."""
        from ..hub.loaded_config import untrusted_model_problems
        from ..training.hub_config import hub_config_path, refuse_other_kind

        names = [f.name for c in cls.option_classes() for f in fields(c) if f.metadata.get("cli", True)]
        p = hub_config_path(path)
        raw, values = read_sections(p, {"recipe": {n: n for n in names}, "heat": HEAT_KEYS},
                                    metadata=dict.fromkeys(METADATA_KEYS),
                                    checks=lambda c: refuse_other_kind(c, p, "fit_heat"))  # fmt: skip
        where, backbone = values.get("backbone", ("", None))
        if backbone is not None and (problems := untrusted_model_problems({"backbone": backbone}, "")):
            raise OptionError(f"{where}: {problems[0]} — a config file names a plain timm model only")
        return raw, values

    @classmethod
    def from_options(cls, values: dict[str, Any], *, given: frozenset[str] = frozenset(),
                     where: Mapping[str, str] | None = None, **_: Any) -> FitHeatSpec:  # fmt: skip
        """The spec of parsed values, built once: each option checked alone (the detector options gathered into
        ``detector_options``), then the rules between them, one ``OptionError`` naming every broken rule
        (``replace()`` does not check again). ``given``: the options a flag or a file set (``--guard`` / ``--ood_tpr``
        without ``--model`` are refused); ``where``: where each came from (``--flag``, ``file: section.key``)."""
        own = {f.name for f in fields(cls)}
        spec = cls(**{k: v for k, v in values.items() if k in own},
                   detector_options={k: v for k, v in values.items() if k not in own})  # fmt: skip
        validate_options(spec)
        spec.heat_settings = dict(spec.heat_settings or {})
        spec.detector_options = asdict(detector_option_class()(**spec.detector_options))  # each checked by its option
        unknown, bad = sorted(set(spec.detectors or ()) - set(methods())), sorted(set(spec.priors) - set(list_priors()))
        rows = [m for m in (spec.detectors or methods()) if m != "ODIN"]
        guard_options = [(where or {}).get(n, f"--{n}") for n in ("guard", "ood_tpr") if n in given]
        rules = [
            (unknown, f"--detectors: unknown {unknown}; choose among {list(methods())}"),
            (bad, f"--priors: unknown {bad}; choose among {list(list_priors())}"),
            (spec.model is not None and not unknown and spec.guard not in [*rows, "none"], f"--guard: {spec.guard!r} "
             f"is not a computed table row that scores features; choose among {rows} or 'none'"),
            (spec.model is None and guard_options, f"{' and '.join(guard_options)} given without --model: --guard / "
             "--ood_tpr choose the OOD guard stored in the model folder; give --model RUN/final, or leave them out"),
            (spec.model is not None and spec.checkpoint is not None, "--model and --checkpoint exclude each other: "
             "--model loads a retrieval model folder (RUN/final), --checkpoint a timm classifier's state dict"),
        ]  # fmt: skip
        if problems := run_rules(vars(spec)) + [text for broken, text in rules if broken]:
            raise OptionError(problems)
        try:  # the HEAT settings are checked by the detector's constructor (nothing is allocated before fit)
            spec.heat()
        except (TypeError, ValueError) as e:
            raise OptionError(f"HEAT settings (heat: section, --preset, --heat_epochs, --heat_batch_size): {e}") from e
        return spec

    def heat(self, head: Any = None) -> Any:
        """The run's :class:`~pml_suprank.ood.HEAT` on the classifier ``head``, its settings the file's
        ``heat.settings`` with the ``--heat_epochs`` / ``--heat_batch_size`` overrides."""
        given = {"epochs": self.heat_epochs, "batch_size": self.heat_batch_size}
        settings = {**(self.heat_settings or {}), **{k: v for k, v in given.items() if v is not None}}
        return HEAT(priors=tuple(self.priors), beta=self.beta, preset=self.preset, settings=settings, head=head,
                    tie_hidden_weights=self.tie_hidden_weights, seed=self.seed)  # fmt: skip

    @property
    def synthetic(self) -> bool:
        """The ID data is the built-in SyntheticShapes (the default without ``--model``)."""
        return self.id_dataset == "synthetic" or (self.id_dataset is None and self.model is None)

    def to_dict(self) -> dict[str, Any]:
        """The options as ``results.json`` records them (the recorded data spec is the model folder's)."""
        return {k: v for k, v in asdict(self).items() if k != "model_data"}


#: ``heat:`` keys of a config file → FitHeatSpec fields
HEAT_KEYS = {"priors": "priors", "beta": "beta", "preset": "preset", "tie_hidden_weights": "tie_hidden_weights",
             "epochs": "heat_epochs", "batch_size": "heat_batch_size", "settings": "heat_settings"}  # fmt: skip
#: top-level keys of a ``heat_*`` config file that hold no option (documentation, the Hub card)
METADATA_KEYS = ("name", "kind", "description", "notes", "hub")


@dataclass
class OODBenchmarkSpec:
    """Every ``ood_benchmark`` option that is not a ``fit_heat`` data / classifier one (checked by ``parse``)."""

    DESCRIPTION = ("Near/far OOD benchmark on saved features (see the module docstring); unknown flags go to "
                   "fit_heat.py's data / classifier steps when --features is not given.")  # fmt: skip
    RULES = staticmethod(lambda v: [f"--detectors: unknown {u}; choose among {list(available_detectors())}"]
                         if (u := sorted(set(v["detectors"] or ()) - set(available_detectors()))) else [])  # fmt: skip

    features: str | None = option(None, "features.safetensors written by fit_heat (unset: extract them first)",
                                  check=optional(is_str()))  # fmt: skip
    output_dir: str = shared(TrainingConfig, "output_dir", "outputs/ood_benchmark", "for tables, figure, features")
    near: list[str] | None = option(None, "near-OOD set names (unset: synthetic-heldout)", check=_NAMES)
    far: list[str] | None = option(None, "far-OOD set names (unset: the other OOD sets)", check=_NAMES)
    detectors: list[str] | None = shared(FitHeatSpec, "detectors", help="rows to compute (unset: all feature "
                                         "detectors)")  # fmt: skip
    heat_epochs: int | None = shared(FitHeatSpec, "heat_epochs", help="HEAT epochs (unset: 30 on synthetic, else the "
                                     "preset's)")  # fmt: skip
    heat_batch_size: int = shared(FitHeatSpec, "heat_batch_size", 128, "HEAT batch size (fast preset)")
    ap_method: str = option("step", "AUPR: HEAT step / OpenOOD trapezoid", check=is_choice("step", "trapezoid"))
    seed: int = shared(TrainingConfig, "seed", 0, "seed of the classifier training and of HEAT / NNGuide")
    threads: int | None = shared(FitHeatSpec, "threads", help="torch CPU threads")
    no_plots: bool = shared(RunOptions, "no_plots", False, "do not write the histogram figure")
    progress: bool = shared(FitHeatSpec, "progress", help="progress bars")
