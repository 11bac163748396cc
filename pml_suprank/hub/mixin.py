"""``HubMixin``: ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` for every saved object of pml-suprank.

The contract is the one of huggingface_hub's ``PyTorchModelHubMixin`` (a folder or a Hub repo with ``config.json``,
``model.safetensors`` and a model card; loading through the local Hub cache, so ``HF_HUB_OFFLINE=1`` works; pushing
is ``HfApi.create_repo`` + ``HfApi.upload_folder``) with three deliberate differences: loading is strict (missing,
unexpected, mis-shaped or non-finite tensors raise a ``ValueError`` naming them), pickles are never read, and
``pretrained=False`` is forced when rebuilding, so restoring never downloads backbone weights.

A class gets the three methods by inheriting :class:`HubMixin` and supplying, through the ``_hub_*`` hooks, its config
(the constructor kwargs), its tensors and how to rebuild itself. The defaults fit an ``nn.Module`` with a
``get_config()`` method returning its constructor kwargs (``RetrievalModel``); OOD detectors override the hooks.
"""

from __future__ import annotations

import inspect
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn

from .card import carried_files, generate_model_card, read_card_files
from .serialization import (
    CONFIG_NAME,
    LIBRARY_NAME,
    METRICS_NAME,
    MODEL_CARD_NAME,
    RETRIEVAL_TASK,
    WEIGHTS_NAME,
    AtomicFolderWriter,
    check_metrics,
    check_state,
    jsonable,
    make_config,
    read_config,
    read_weights,
)
from .transport import check_repo_id, resolve_folder, upload_folder

logger = logging.getLogger(__name__)

__all__ = ["HubMixin", "build_config", "instantiate", "load_module_state", "push_folder", "save_folder"]

CardBuilder = Callable[..., str]


# ---------------------------------------------------------------------------------------------------------- engine
def build_config(model: Any, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.json`` content of a module exposing ``get_config()`` (e.g. ``RetrievalModel``).

    Args:
        model: A module with ``get_config()`` returning its JSON-able constructor kwargs, and optionally
            ``data_config``, ``embedding_size``, ``num_features`` and a ``hub_metadata`` dict.
        metadata: Training metadata merged over ``model.hub_metadata``; conventional keys are ``loss`` (e.g.
            ``"HAPPIERLoss"``), ``label_names`` (fine → coarse), ``dataset``, ``hub_config`` and ``loss_kwargs``.

    Returns:
        ``{"architecture", "library_name", "library_version", "task", "model_args", "training", "backbone",
        "embedding_size", "num_features", "num_classes", "pretrained_cfg"}``.
    """
    if not hasattr(model, "get_config"):
        raise TypeError(f"model must provide get_config() (e.g. a RetrievalModel); got {type(model).__name__}")
    model_args = jsonable(model.get_config(), "model.get_config()")
    training = dict(getattr(model, "hub_metadata", None) or {})
    training.update(metadata or {})
    config = make_config(
        type(model).__name__,
        model_args,
        task=RETRIEVAL_TASK,
        metadata=training,
        backbone=model_args.get("backbone"),
        embedding_size=getattr(model, "embedding_size", None),
        num_features=getattr(model, "num_features", None),
        num_classes=model_args.get("num_classes", 0),
    )
    data_config = getattr(model, "data_config", None)
    if data_config:
        keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
        config["pretrained_cfg"] = jsonable({k: data_config[k] for k in keys if k in data_config}, "data_config")
    return config


def _plan_plots(save_directory: Path, plots: Sequence[str | Path] | None) -> list[tuple[str, Path | None]]:
    """``(path relative to the folder, file to copy there or None)`` of every plot the card embeds."""
    planned: list[tuple[str, Path | None]] = []
    for p in plots or []:
        p = Path(p)
        if not p.is_file():
            raise FileNotFoundError(f"plot file {p} does not exist")
        try:
            planned.append((p.resolve().relative_to(save_directory.resolve()).as_posix(), None))
        except ValueError:
            planned.append((f"plots/{p.name}", p))
    for folder in (save_directory, save_directory / "plots"):
        if folder.is_dir():
            for f in sorted(folder.glob("*.png")):
                rel = f.relative_to(save_directory).as_posix()
                if rel not in [r for r, _ in planned]:
                    planned.append((rel, None))
    return planned


def save_folder(
    save_directory: str | Path,
    config: dict[str, Any],
    weights: nn.Module | Mapping[str, Tensor],
    *,
    card: CardBuilder | None = generate_model_card,
    metrics: Mapping[str, float] | None = None,
    hub_config: Mapping[str, Any] | None = None,
    plots: Sequence[str | Path] | None = None,
    repo_id: str | None = None,
    source: str | Path | None = None,
) -> Path:
    """Write ``config.json``, ``model.safetensors``, ``metrics.json``, plots and the card, all or nothing.

    Args:
        save_directory: Output folder, created if needed; existing files other than ours are left alone.
        config: The ``config.json`` dict (its ``training.hub_config`` is set from ``hub_config["name"]``).
        weights: A module (tied tensors are stored once) or a ``{name: Tensor}`` dict.
        card: Builds the ``README.md`` text from ``config`` (keyword arguments as :func:`generate_model_card`);
            ``None`` writes no card.
        metrics: Final metrics, values in [0, 1]; written to ``metrics.json`` and shown in the card.
        hub_config: The loaded hub_config dict; its ``hub`` section gives the card's tags, datasets and paper numbers.
        plots: Image files to embed in the card; files outside ``save_directory`` are copied to ``plots/``.
            ``*.png`` files already in ``save_directory`` or ``save_directory/plots`` are embedded too.
        repo_id: Hub repo id (``"org/name"``) used in the card's title and usage snippet. Without one (or with a
            name that is not a repo id) the snippet loads the folder by its local path ``./<folder name>``.
        source: The folder the object was loaded from: its metrics, plots, training files and OOD guard are carried
            into ``save_directory`` when the weights are unchanged (:func:`~pml_suprank.hub.card.carried_files`).
    """
    save_directory = Path(save_directory)
    folder = save_directory.resolve().name
    carried = carried_files(source, save_directory, weights) if source is not None else []
    files = {**(read_card_files(source) if carried else {}), **read_card_files(save_directory)}
    if not metrics and any(rel == METRICS_NAME for rel, _ in carried):
        metrics = files.get(METRICS_NAME)
    metrics = check_metrics(metrics)
    if hub_config is not None:
        name = hub_config.get("name") if isinstance(hub_config, Mapping) else None
        config.setdefault("training", {}).setdefault("hub_config", str(name) if name is not None else None)
    planned = _plan_plots(save_directory, plots)
    with AtomicFolderWriter(save_directory) as writer:
        writer.write_weights(WEIGHTS_NAME, weights, {"format": "pt", "library": LIBRARY_NAME})
        writer.write_json(CONFIG_NAME, config)
        if metrics:
            writer.write_json(METRICS_NAME, metrics)
        for rel, path in planned:
            if path is not None:
                writer.copy_file(path, rel)
        for rel, path in carried:
            if rel != METRICS_NAME:
                writer.copy_file(path, rel)
        if card is not None:
            rels = [rel for rel, _ in planned] + [rel for rel, _ in carried if rel.endswith(".png")]
            card_repo = repo_id if _is_repo_id(repo_id) else None
            text = card(config, metrics=metrics, hub_config=hub_config, plots=list(dict.fromkeys(rels)),
                        repo_id=card_repo, folder=folder, files=files)  # fmt: skip
            writer.write_text(MODEL_CARD_NAME, text)
    return save_directory


def _is_repo_id(repo_id: Any) -> bool:
    try:
        check_repo_id(repo_id)
    except ValueError:
        return False
    return True


def push_folder(
    save: Callable[[Path], Any],
    repo_id: str,
    *,
    save_directory: str | Path | None = None,
    **upload_options: Any,
) -> Any:
    """Call ``save(folder)`` and upload the folder with :func:`~pml_suprank.hub.transport.upload_folder`
    (``upload_options``: ``commit_message``, ``private``, ``token``, ``revision``, ``create_pr``). Without
    ``save_directory`` a temporary folder is used and removed whatever happens (a failed upload raises a
    ``RuntimeError``; pass ``save_directory`` to keep the files)."""
    check_repo_id(repo_id)
    keep = save_directory is not None
    folder = Path(save_directory) if keep else Path(tempfile.mkdtemp(prefix="pml_suprank_push_"))
    try:
        save(folder)
    except BaseException:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        return upload_folder(folder, repo_id, **upload_options)
    except RuntimeError as e:
        if keep:
            raise
        cause = e.__cause__ or e
        raise RuntimeError(f"pushing to the Hub repo {repo_id!r} failed ({type(cause).__name__}: {cause}); nothing "
                           "was kept (pass save_directory= to keep the files)") from cause  # fmt: skip
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


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
    report = check_state(state, source, expected=expected)
    if report:
        msg = f"weights in {source} do not match {type(model).__name__}"
        backbone = config["model_args"].get("backbone")
        msg += f"({backbone!r}): " if backbone is not None else ": "
        msg += report.describe()
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


def _summary(doc: str | None) -> str | None:
    return doc.strip().split("\n\n")[0].replace("\n", " ") if doc else None


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


# ---------------------------------------------------------------------------------------------------------- mixin
class HubMixin:
    """Adds ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` to a class.

    Subclasses supply what is specific to them through the ``_hub_*`` hooks; the defaults fit an ``nn.Module`` with a
    ``get_config()`` method (its constructor kwargs):

    * :meth:`_hub_config` — the ``config.json`` dict (default :func:`build_config`);
    * :meth:`_hub_weights` — the module itself or a ``{name: Tensor}`` dict to store in ``model.safetensors``;
    * :meth:`_hub_check_config` — refuse a loaded config that is unsafe or implausible before anything is built
      (default: nothing; ``RetrievalModel`` restricts ``backbone_kwargs`` and bounds sizes unless
      ``trust_config=True``);
    * :meth:`_hub_instantiate` — rebuild the object from a loaded config (default: the class called with
      ``model_args``, ``pretrained=False`` forced);
    * :meth:`_hub_load_state` — validate and load the tensors (default :func:`load_module_state`);
    * :meth:`_hub_class` — the class a config designates (default: this class, checked against ``architecture``);
    * :meth:`_hub_check_savable` — raise when the object cannot be saved yet (default: never);
    * :meth:`_hub_card` — the ``README.md`` text (default :func:`~pml_suprank.hub.card.generate_model_card`, with the
      class docstring's first paragraph as the description);
    * :attr:`_hub_optional_files` — saved files that may be absent when loading (default: none).
    """

    #: Files that may be absent from a saved folder.
    _hub_optional_files: ClassVar[tuple[str, ...]] = ()
    #: files saved next to the object by others (e.g. a model's OOD guard, ``ood/guard.json``): fetched with it from
    #: the same snapshot when present; ``from_pretrained`` sets ``_hub_folder`` to the resolved local folder
    _hub_companion_files: ClassVar[tuple[str, ...]] = ()

    # --- hooks ----------------------------------------------------------------------------------------------------
    @classmethod
    def _hub_architecture(cls) -> str:
        """The name saved as ``config["architecture"]``."""
        return cls.__name__

    def _hub_config(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        return build_config(self, metadata)

    def _hub_weights(self) -> nn.Module | Mapping[str, Tensor]:
        return self if isinstance(self, nn.Module) else self.state_dict()  # type: ignore[attr-defined]

    def _hub_check_savable(self) -> None:
        """Raise when the object cannot be saved in its current state."""

    def _hub_card(self, config: Mapping[str, Any], **kwargs: Any) -> str:
        return generate_model_card(config, description=_summary(type(self).__doc__), **kwargs)

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
        """Raise ``ValueError`` (naming ``source``, the ``config.json`` path, and the key) when the loaded config
        asks for something unsafe or implausible; ``overrides`` are the caller's own arguments and are not checked;
        ``trust_config=True`` is the caller's statement that the file is trusted. Default: nothing to check."""

    @classmethod
    def _hub_instantiate(cls, config: Mapping[str, Any], overrides: dict[str, Any], source: Any) -> Any:
        kwargs = {**config["model_args"], **overrides}
        params = inspect.signature(cls.__init__).parameters
        if "pretrained" in params or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs["pretrained"] = False
        return instantiate(cls, kwargs, source)

    def _hub_load_state(
        self, state: dict[str, Tensor], config: Mapping[str, Any], *, source: Any, strict: bool, map_location: str
    ) -> None:
        load_module_state(self, state, config, source=source, strict=strict, map_location=map_location)  # type: ignore[arg-type]

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
        """Write ``config.json``, ``model.safetensors`` and (by default) a ``README.md`` model card into a folder.

        All files are staged under temporary names and renamed together, so a failed save leaves the folder as it
        was. See :func:`save_folder` for ``metrics``, ``hub_config``, ``plots`` and ``repo_id``.

        Args:
            save_directory: Output folder, created if needed.
            metadata: Free-form metadata stored under ``config["training"]`` (loss, label names, dataset, ...).
            metrics: Final metrics (values in [0, 1]) for ``metrics.json`` and the card.
            hub_config: The loaded hub_config dict (card tags, datasets, paper numbers).
            plots: Image files to embed in the card.
            model_card: Write the generated ``README.md``.
            repo_id: Repo id shown in the card's usage snippet.

        Returns:
            The folder path.
        """
        self._hub_check_savable()
        return save_folder(
            save_directory,
            self._hub_config(metadata),
            self._hub_weights(),
            card=self._hub_card if model_card else None,
            metrics=metrics,
            hub_config=hub_config,
            plots=plots,
            repo_id=repo_id,
            source=getattr(self, "_hub_source", None),
        )

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | Path,
        *,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        token: str | bool | None = None,
        force_download: bool = False,
        map_location: str = "cpu",
        strict: bool = True,
        trust_config: bool = False,
        **overrides: Any,
    ) -> Any:
        """Restore an object saved by :meth:`save_pretrained` from a folder or a Hub repo id (``"org/name"``).

        Repo ids go through ``huggingface_hub.snapshot_download`` (both files from one commit, through the local Hub
        cache: with ``HF_HUB_OFFLINE=1`` or ``local_files_only=True`` nothing is downloaded).

        Args:
            path_or_repo_id: Folder path or ``"org/name"``.
            revision, cache_dir, local_files_only, token, force_download: As in ``huggingface_hub``.
            map_location: Device of the loaded tensors.
            strict: Raise on missing, unexpected or mis-shaped tensors (default); otherwise log and skip them.
                Non-finite tensors are refused either way.
            trust_config: Use the saved config as it is. By default a loaded config may only name a plain timm
                backbone, pass an allow-list of harmless ``backbone_kwargs`` and ask for bounded sizes (see
                ``RetrievalModel``); set it only for files you trust (it lets the config make timm read local files
                or fetch other Hub repos).
            **overrides: Constructor kwargs replacing the saved ones (yours, so never checked against the
                allow-list).

        Raises:
            FileNotFoundError: The folder, repo or a file is missing (naming it), or not cached when offline.
            ValueError: Invalid repo id, corrupt files, a config of another class, a refused config value, or
                tensors that do not match (naming the file and the key).
        """
        if not isinstance(trust_config, bool):
            raise TypeError(f"trust_config must be a bool; got {type(trust_config).__name__} {trust_config!r}")
        folder = resolve_folder(
            path_or_repo_id,
            (CONFIG_NAME, WEIGHTS_NAME, *cls._hub_companion_files),
            optional=(*cls._hub_optional_files, *cls._hub_companion_files),
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            token=token,
            force_download=force_download,
        )
        config = read_config(folder / CONFIG_NAME)
        target = cls._hub_class(config, path_or_repo_id)
        target._hub_check_config(config, folder / CONFIG_NAME, overrides=overrides, trust_config=trust_config)
        obj = target._hub_instantiate(config, overrides, path_or_repo_id)
        weights = folder / WEIGHTS_NAME
        state = read_weights(weights, map_location) if weights.is_file() else {}
        obj._hub_load_state(state, config, source=weights, strict=strict, map_location=map_location)
        obj._hub_source = folder  # a later save_pretrained / push_to_hub carries this folder's card files
        if cls._hub_companion_files:
            obj._hub_folder = folder
        return obj

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
        """Save (see :meth:`save_pretrained`) and upload the folder to the Hub repo ``repo_id``.

        Args:
            repo_id: ``"org/name"``.
            save_directory: Where to write the files before uploading; they stay there whatever happens. Without it
                a temporary folder is used and removed whatever happens.
            commit_message, private, token, revision, create_pr: Passed to ``HfApi.create_repo`` / ``upload_folder``.
            **save_kwargs: ``metadata``, ``metrics``, ``hub_config``, ``plots`` for :meth:`save_pretrained`.

        Returns:
            The ``CommitInfo`` of ``HfApi.upload_folder`` (a ``str``: the commit URL).
        """
        return push_folder(
            lambda folder: self.save_pretrained(folder, repo_id=repo_id, **save_kwargs),
            repo_id,
            save_directory=save_directory,
            commit_message=commit_message,
            private=private,
            token=token,
            revision=revision,
            create_pr=create_pr,
        )
