"""``HubMixin``: ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` of every saved object of pml-suprank, on
``huggingface_hub.ModelHubMixin`` (which writes ``config.json`` and the card around our ``_save_pretrained`` and
calls our ``_from_pretrained``), adding atomic saves (a failed save leaves the old folder as it was), a bounded
``config.json`` checked before any constructor runs, and tensors from safetensors only, checked before use.
"""

from __future__ import annotations

import inspect
import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn

from .._validation import check_bool

try:
    from huggingface_hub import ModelHubMixin
except ImportError:  # the `recipes` extra: the detectors and the model work without it, their Hub methods do not

    class ModelHubMixin:  # type: ignore[no-redef]
        """Stand-in for ``huggingface_hub.ModelHubMixin`` when it is not installed: its methods say what to install."""

        def save_pretrained(*args: Any, **kwargs: Any) -> Any:
            raise ImportError("saving, loading and pushing need huggingface_hub: pip install 'pml-suprank[recipes]' "
                              "(or pip install huggingface_hub)")  # fmt: skip

        from_pretrained = classmethod(save_pretrained)


from .card import carried_files, folder_plots, generate_model_card, read_card_files
from .serialization import (
    CONFIG_NAME,
    LIBRARY_NAME,
    METRICS_NAME,
    MODEL_CARD_NAME,
    RETRIEVAL_TASK,
    WEIGHTS_NAME,
    check_metrics,
    check_state,
    jsonable,
    make_config,
    read_config,
    read_weights,
    staged_folder,
    write_weights,
)
from .transport import check_repo_id, is_repo_id, resolve_folder, upload_folder

logger = logging.getLogger(__name__)

__all__ = ["HubMixin", "instantiate", "load_module_state"]


def _plan_plots(save_directory: Path, plots: Sequence[str | Path] | None) -> list[tuple[str, Path | None]]:
    """``(path relative to the folder, file to copy there or None)`` of every plot the card embeds: ``plots``
    (files outside the folder go to ``plots/``) and the ``*.png`` already in the folder or its ``plots/``."""
    planned: list[tuple[str, Path | None]] = []
    for p in plots or []:
        p = Path(p)
        if not p.is_file():
            raise FileNotFoundError(f"plot file {p} does not exist")
        try:
            planned.append((p.resolve().relative_to(save_directory.resolve()).as_posix(), None))
        except ValueError:
            planned.append((f"plots/{p.name}", p))
    given = {rel for rel, _ in planned}
    return planned + [(rel, None) for rel in folder_plots(save_directory) if rel not in given]


def instantiate(cls: type, kwargs: dict[str, Any], source: Any) -> Any:
    """``cls(**kwargs)``, with a ``ValueError`` naming the saved arguments ``cls`` does not accept; the
    constructor's own ``ValueError`` / ``TypeError`` (naming the argument) is re-raised naming ``source`` too."""
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ValueError(
                f"config.json of {source} has model_args {unknown} that {cls.__name__} does not accept "
                "(saved by a newer pml-suprank?)"
            )
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # name the file: the constructor names the argument
        raise type(e)(f"config.json of {source}: model_args rejected by {cls.__name__}: {e}") from e


def load_module_state(
    model: nn.Module,
    state: dict[str, Tensor],
    config: Mapping[str, Any],
    *,
    source: Any,
    strict: bool = True,
    map_location: str = "cpu",
) -> None:
    """Validate ``state`` against ``model.state_dict()`` and load it; the model ends on ``map_location`` in eval
    mode, with ``hub_metadata`` set to the saved training metadata when it has that attribute."""
    expected = model.state_dict()
    problems = check_state(state, source, expected=expected)
    if problems:
        backbone = config["model_args"].get("backbone")
        msg = f"weights in {source} do not match {type(model).__name__}"
        msg += (f"({backbone!r}): " if backbone is not None else ": ") + problems
        if strict:
            raise ValueError(msg)
        logger.warning(msg)
        state = {k: v for k, v in state.items() if k in expected and v.shape == expected[k].shape}
    # every key is accounted for above; tied weights saved once by safetensors load through their saved alias
    model.load_state_dict(state, strict=False)
    model.to(map_location)
    if hasattr(model, "hub_metadata"):
        model.hub_metadata = dict(config.get("training") or {})
    model.eval()


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


class HubMixin(ModelHubMixin):
    """``huggingface_hub.ModelHubMixin`` with pml-suprank's files, atomic saves and strict loading.

    The defaults fit an ``nn.Module`` with ``get_config()`` (its JSON-able constructor kwargs) and optionally
    ``data_config``, ``embedding_size``, ``num_features`` and ``hub_metadata``; subclasses override the hooks
    ``_hub_architecture`` (the saved ``architecture``), ``_hub_config`` (the ``config.json`` dict), ``_hub_weights``
    (a module or ``{name: Tensor}``), ``_hub_check_savable``, ``_hub_class`` (the class a loaded config designates;
    on ``HubMixin`` itself the loaded subclass of that name), ``_hub_check_config`` (refuse an unsafe loaded config
    before anything is built), ``_hub_load_state`` (validate and load the tensors) and the class attributes
    ``_hub_optional_files`` (saved files that may be absent) and ``_hub_companion_files`` (files saved beside the
    object by others, e.g. a model's OOD guard, fetched from the same snapshot when present).
    """

    _hub_optional_files: ClassVar[tuple[str, ...]] = ()
    _hub_companion_files: ClassVar[tuple[str, ...]] = ()

    # --- hooks ----------------------------------------------------------------------------------------------------
    @classmethod
    def _hub_architecture(cls) -> str:
        return cls.__name__

    def _hub_config(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        """``{"architecture", "library_name", "library_version", "task", "model_args", "training", "backbone",
        "embedding_size", "num_features", "num_classes", "pretrained_cfg"}``; ``metadata`` (conventional keys:
        ``loss``, ``label_names`` fine → coarse, ``dataset``, ``hub_config``, ``loss_kwargs``) is merged over
        ``hub_metadata`` into ``training``."""
        if not hasattr(self, "get_config"):
            raise TypeError(f"{type(self).__name__} must provide get_config() (its constructor kwargs) to be saved")
        model_args = jsonable(self.get_config(), "model.get_config()")
        config = make_config(
            type(self).__name__,
            model_args,
            task=RETRIEVAL_TASK,
            metadata={**(getattr(self, "hub_metadata", None) or {}), **(metadata or {})},
            backbone=model_args.get("backbone"),
            embedding_size=getattr(self, "embedding_size", None),
            num_features=getattr(self, "num_features", None),
            num_classes=model_args.get("num_classes", 0),
        )
        if data_config := getattr(self, "data_config", None):
            keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
            config["pretrained_cfg"] = jsonable({k: data_config[k] for k in keys if k in data_config}, "data_config")
        return config

    def _hub_weights(self) -> nn.Module | Mapping[str, Tensor]:
        return self if isinstance(self, nn.Module) else self.state_dict()  # type: ignore[attr-defined]

    def _hub_check_savable(self) -> None:
        """Raise when the object cannot be saved in its current state."""

    @classmethod
    def _hub_class(cls, config: Mapping[str, Any], source: Any) -> type:
        arch = config.get("architecture")
        if cls is HubMixin:
            matches = [c for c in _subclasses(HubMixin) if c._hub_architecture() == arch]
            if len(matches) != 1:
                found = "several classes" if matches else "no loaded class"
                raise ValueError(
                    f"{source} holds a {repr(arch)[:80]} and {found} of that name use HubMixin; call from_pretrained "
                    "on the class itself (e.g. pml_suprank.models.RetrievalModel.from_pretrained)"
                )
            return matches[0]
        if arch is not None and arch != cls._hub_architecture():
            raise ValueError(f"{source} holds a {repr(arch)[:80]}; it cannot be loaded as {cls.__name__}")
        return cls

    @classmethod
    def _hub_check_config(
        cls, config: Mapping[str, Any], source: Path, *, overrides: Mapping[str, Any], trust_config: bool
    ) -> None:
        """Raise ``ValueError`` naming ``source`` (the ``config.json``) and the key when the loaded config asks for
        something unsafe; ``overrides`` (the caller's own arguments) are not checked; ``trust_config=True``: the
        caller trusts the file. Default: nothing to check."""

    def _hub_load_state(
        self, state: dict[str, Tensor], config: Mapping[str, Any], *, source: Any, strict: bool, map_location: str
    ) -> None:
        load_module_state(self, state, config, source=source, strict=strict, map_location=map_location)  # type: ignore[arg-type]

    # --- ModelHubMixin hooks --------------------------------------------------------------------------------------
    def _save_pretrained(self, save_directory: Path) -> None:
        write_weights(save_directory / WEIGHTS_NAME, self._hub_weights(), {"format": "pt", "library": LIBRARY_NAME})

    def generate_model_card(self, *args: Any, **kwargs: Any) -> Any:
        """The card ModelHubMixin's ``save_pretrained`` writes, of the ``model_card_kwargs`` of
        :meth:`save_pretrained`, with the class docstring's first paragraph as the description."""
        from huggingface_hub import ModelCard

        doc = type(self).__doc__
        summary = doc.strip().split("\n\n")[0].replace("\n", " ") if doc else None
        return ModelCard(generate_model_card(description=summary, **kwargs))

    @classmethod
    def _from_pretrained(cls, *, model_id: str, loaded_config: dict[str, Any], source: str | Path,
                         overrides: dict[str, Any], trust_config: bool, strict: bool, map_location: str,
                         **unused: Any) -> Any:  # fmt: skip
        """Build the object from the local folder ``model_id`` and the ``config.json`` :meth:`from_pretrained` read
        (``source``: what the caller named). ``unused`` (ModelHubMixin's download options and config keys) is ignored:
        only ``model_args`` and the overrides build the object, with ``pretrained=False``."""
        target = cls._hub_class(loaded_config, source)
        config_path, weights = Path(model_id) / CONFIG_NAME, Path(model_id) / WEIGHTS_NAME
        target._hub_check_config(loaded_config, config_path, overrides=overrides, trust_config=trust_config)
        kwargs = {**loaded_config["model_args"], **overrides}
        params = inspect.signature(target.__init__).parameters
        if "pretrained" in params or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs["pretrained"] = False
        obj = instantiate(target, kwargs, source)
        state = read_weights(weights, map_location) if weights.is_file() else {}
        obj._hub_load_state(state, loaded_config, source=weights, strict=strict, map_location=map_location)
        obj._hub_source = Path(model_id)  # a later save_pretrained / push_to_hub carries this folder's card files
        return obj

    # --- public API -----------------------------------------------------------------------------------------------
    def save_pretrained(
        self,
        save_directory: str | Path,
        *,
        metadata: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
        hub_config: Mapping[str, Any] | None = None,
        plots: Sequence[str | Path] | None = None,
        model_card: bool = True,
        repo_id: str | None = None,
    ) -> Path:
        """Write ``config.json``, ``model.safetensors``, ``metrics.json``, plots and (by default) a ``README.md``
        model card into a folder, all or nothing; return the folder.

        Args:
            save_directory: Output folder, created if needed; existing files other than those written are kept.
            metadata: Free-form metadata stored under ``config["training"]`` (loss, label names, dataset, ...).
            metrics: Final metrics (values in [0, 1]) for ``metrics.json`` and the card.
            hub_config: The loaded hub_config; its ``hub`` section gives the card's tags, datasets and paper numbers,
                its ``name`` goes to ``config["training"]["hub_config"]``.
            plots: Image files to embed in the card (files outside ``save_directory`` are copied to ``plots/``), besides
                the ``*.png`` already in ``save_directory`` or its ``plots/``.
            model_card: Write the generated ``README.md``.
            repo_id: Hub repo id (``"org/name"``) of the card's title and usage snippet (otherwise the snippet loads
                ``./<folder name>``).
        """
        self._hub_check_savable()
        target = Path(save_directory)
        saved = self._hub_config(metadata)
        source = getattr(self, "_hub_source", None)
        carried = carried_files(source, target, self._hub_weights()) if source is not None else []
        files = {**(read_card_files(source) if carried else {}), **read_card_files(target)}
        if not metrics and any(rel == METRICS_NAME for rel, _ in carried):
            metrics = files.get(METRICS_NAME)
        metrics = check_metrics(metrics)
        if hub_config is not None:
            name = hub_config.get("name") if isinstance(hub_config, Mapping) else None
            saved.setdefault("training", {}).setdefault("hub_config", str(name) if name is not None else None)
        planned = _plan_plots(target, plots)
        card_plots = [rel for rel, _ in planned] + [rel for rel, _ in carried if rel.endswith(".png")]
        card_kwargs = dict(config=saved, metrics=metrics, hub_config=hub_config, plots=list(dict.fromkeys(card_plots)),
                           repo_id=repo_id if is_repo_id(repo_id) else None, folder=target.resolve().name,
                           files=files)  # fmt: skip
        with staged_folder(target) as stage:
            for rel, path in [*planned, *carried]:
                if path is not None and rel != METRICS_NAME:
                    (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                    (stage / rel).write_bytes(path.read_bytes())
            if metrics:
                (stage / METRICS_NAME).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
            super().save_pretrained(stage, config=saved, model_card_kwargs=card_kwargs)
            if not model_card:
                (stage / MODEL_CARD_NAME).unlink()
        return target

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | Path,
        *,
        force_download: bool = False,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        revision: str | None = None,
        map_location: str = "cpu",
        strict: bool = True,
        trust_config: bool = False,
        **overrides: Any,
    ) -> Any:
        """Restore an object saved by :meth:`save_pretrained` from a folder or a Hub repo id (``"org/name"``: one
        ``snapshot_download`` through the local cache; with ``HF_HUB_OFFLINE=1`` or ``local_files_only=True``
        nothing is downloaded).

        Args:
            pretrained_model_name_or_path: Folder path or ``"org/name"``.
            force_download, token, cache_dir, local_files_only, revision: As in ``huggingface_hub``.
            map_location: Device of the loaded tensors.
            strict: Raise on missing, unexpected or mis-shaped tensors (default); otherwise log and skip them.
                Non-finite tensors are refused either way.
            trust_config: Use the saved config as it is. By default a loaded config may only name a plain timm
                backbone, pass an allow-list of harmless ``backbone_kwargs`` and ask for bounded sizes (see
                :mod:`~pml_suprank.hub.loaded_config`); set it only for files you trust.
            **overrides: Constructor kwargs replacing the saved ones (yours, so never checked).

        Raises:
            FileNotFoundError: The folder, repo or a file is missing (naming it), or not cached when offline.
            ValueError: Invalid repo id, corrupt files, pickle weights, a config of another class, a refused config
                value, or tensors that do not match (naming the file and the key).
        """
        check_bool("trust_config", trust_config)
        folder = resolve_folder(
            pretrained_model_name_or_path,
            (CONFIG_NAME, WEIGHTS_NAME, *cls._hub_companion_files),
            optional=(*cls._hub_optional_files, *cls._hub_companion_files),
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            token=token,
            force_download=force_download,
        )
        return super().from_pretrained(
            folder,
            loaded_config=read_config(folder / CONFIG_NAME),  # bounded, before ModelHubMixin's own json.load
            source=pretrained_model_name_or_path,
            overrides=overrides,
            trust_config=trust_config,
            strict=strict,
            map_location=map_location,
        )

    def push_to_hub(
        self,
        repo_id: str,
        *,
        save_directory: str | Path | None = None,
        commit_message: str = "Upload pml-suprank model",
        private: bool | None = None,
        token: str | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        **save_kwargs: Any,
    ) -> Any:
        """Save (:meth:`save_pretrained`; ``save_kwargs``: ``metadata``, ``metrics``, ``hub_config``, ``plots``) and
        upload the folder to the Hub repo ``repo_id``: into ``save_directory`` (kept whatever happens), else a
        temporary folder (removed whatever happens). ``commit_message``, ``private``, ``token``, ``revision`` (the
        branch), ``create_pr``: as in ``HfApi``. Returns the ``CommitInfo`` (a ``str``: the commit URL); a failed
        upload raises ``RuntimeError`` naming the cause and where the files are, if anywhere."""
        check_repo_id(repo_id)
        upload = dict(commit_message=commit_message, private=private, token=token, revision=revision,
                      create_pr=create_pr)  # fmt: skip
        if save_directory is not None:
            folder = self.save_pretrained(save_directory, repo_id=repo_id, **save_kwargs)
            return upload_folder(folder, repo_id, **upload)
        with tempfile.TemporaryDirectory() as tmp:
            folder = self.save_pretrained(Path(tmp) / "model", repo_id=repo_id, **save_kwargs)
            try:
                return upload_folder(folder, repo_id, **upload)
            except RuntimeError as e:
                cause = f"{type(e.__cause__).__name__}: {e.__cause__}"
                raise RuntimeError(f"pushing to the Hub repo {repo_id!r} failed ({cause}); nothing was kept (pass "
                                   "save_directory= to keep the files)") from e.__cause__  # fmt: skip
