"""The ``Detector`` contract shared by HEAT and the baselines, with input checks and save / load / push.

A detector is fitted post hoc on in-distribution (ID) training features and returns an **outlier score** per sample:
higher = more OOD (an energy). The API follows pytorch-ood's ``fit_features`` / ``predict_features`` with keyword
tensors so that every detector takes the same call::

    det = ood.KNN(k=50).fit(features=z_train, labels=y_train)
    scores = det.score(features=z_test)          # (N,) higher = more OOD

Fitted state is a flat ``dict[str, Tensor]`` (saved as ``model.safetensors``) plus a JSON config of the constructor
keyword arguments (``config.json``), as timm / huggingface_hub do for models; ``save_pretrained`` /
``Detector.from_pretrained`` / ``push_to_hub`` work for every detector. ``safetensors`` and ``huggingface_hub`` are
imported lazily (the ``recipes`` extra), so the detectors themselves only need torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from .._validation import check_embeddings, check_labels
from ..hub.mixin import HubMixin, instantiate
from ..hub.schema import TensorSpec, check_schema
from ..hub.serialization import CONFIG_NAME as CONFIG_NAME  # kept importable from here
from ..hub.serialization import DETECTOR_TASK, WEIGHTS_NAME, check_state, make_config
from .model_api import ModelDetectorMixin
from .registry import DETECTOR_REGISTRY

__all__ = ["Detector", "NotFittedError", "check_features", "check_class_labels"]


class NotFittedError(RuntimeError):
    """Raised when ``score`` is called on a detector that needs ``fit`` first."""

    def __init__(self, name: str = "This detector") -> None:
        super().__init__(f"{name} is not fitted yet: call .fit(features=..., labels=...) before .score(...)")


def check_features(name: str, x: Any, dim: int | None = None, n: int | None = None) -> Tensor:
    """Check ``x`` is a finite floating ``(N, D)`` tensor, with ``D == dim`` and ``N == n`` when given."""
    if x is None:
        raise ValueError(f"{name} is required by this detector; got None")
    x = check_embeddings(name, x)
    if dim is not None and x.shape[1] != dim:
        raise ValueError(
            f"{name} must have {dim} columns (the feature dimension seen at fit time); got shape {tuple(x.shape)}"
        )
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} must have {n} rows (one per sample, as the other inputs); got {x.shape[0]}")
    return x


def check_class_labels(labels: Any, n: int, min_classes: int = 2) -> Tensor:
    """Check 1-D (or 2-D, column 0 = finest) integer class labels with at least ``min_classes`` distinct values."""
    if labels is None:
        raise ValueError("labels are required by this detector (class-conditional fit); got None")
    labels = check_labels("labels", labels, n, n_name="features")
    if labels.dim() == 2:
        labels = labels[:, 0]
    if bool((labels < 0).any()):
        raise ValueError(f"labels must be >= 0 class indices; got min label {int(labels.min())}")
    n_classes = int(torch.unique(labels).numel())
    if n_classes < min_classes:
        raise ValueError(
            f"labels must contain at least {min_classes} distinct classes for a class-conditional fit; "
            f"got {n_classes} class(es)"
        )
    return labels


def _detector_class(name: Any, source: Any = None) -> type:
    """The registered detector class named in a saved ``config.json`` (``ValueError`` listing the valid names).

    Only registered, concrete detectors qualify: the base classes (``Detector``, ``HeadDetector``) and private or
    unregistered classes are refused by name.
    """
    try:
        return DETECTOR_REGISTRY.get_class(name)
    except ValueError:
        where = f"{Path(source) / CONFIG_NAME} (key 'architecture')" if source is not None else CONFIG_NAME
        raise ValueError(
            f"{where}: config.json names an unknown detector {name!r}; expected one of {list(DETECTOR_REGISTRY)} "
            "(base classes such as 'Detector' are not detectors; define a custom detector class before loading)"
        ) from None


class Detector(ModelDetectorMixin, HubMixin):
    """Base class of the OOD detectors: ``fit(...) -> self``, ``score(...) -> Tensor`` (higher = more OOD).

    Subclasses implement ``_fit`` and ``_score``, declare the fitted tensors in ``_state_names``, and return their
    JSON-serialisable constructor kwargs from ``config()``. Detectors that need no fitting (MSP, MaxLogit, Energy,
    ODIN) set ``requires_fit = False``; the others raise :class:`NotFittedError` from ``score`` before ``fit``.

    Defining a subclass registers it (:mod:`.registry`) under its class name, or under ``name=`` given as a class
    keyword (``class SSDPlus(Mahalanobis, name="SSD+")``), so that ``ood.get_detector(name)`` and
    ``Detector.from_pretrained`` find it. Private (``_``-prefixed) and abstract classes, and classes defined with
    ``register=False``, are not registered.

    ``fit_model(model, loader)`` / ``predict(model, x)`` (:mod:`.model_api`) extract the features of a timm
    classifier or a ``RetrievalModel`` and call ``fit`` / ``score``.
    """

    requires_fit: ClassVar[bool] = True
    _state_names: ClassVar[tuple[str, ...]] = ()
    #: The name this class is registered under (``None`` for unregistered classes).
    detector_name: ClassVar[str | None] = None

    def __init_subclass__(cls, *, name: str | None = None, register: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.detector_name = None
        if register and not cls.__name__.startswith("_") and not inspect.isabstract(cls):
            cls.detector_name = cls.__name__ if name is None else name
            DETECTOR_REGISTRY.register(cls.detector_name, cls)

    def __init__(self) -> None:
        self._fitted = False

    # --- contract -------------------------------------------------------------------------------------------------
    def fit(self, features: Tensor | None = None, logits: Tensor | None = None, labels: Tensor | None = None, **kwargs):
        """Fit on ID training data. Returns ``self``. Unused inputs are ignored (uniform call for all detectors)."""
        self._fitted = False  # a failed re-fit must not leave a half-updated detector usable
        self._fit(features=features, logits=logits, labels=labels, **kwargs)
        self._fitted = True
        return self

    @torch.no_grad()
    def score(self, features: Tensor | None = None, logits: Tensor | None = None, **kwargs) -> Tensor:
        """Outlier scores ``(N,)`` for the given samples; higher = more OOD."""
        if self.requires_fit and not self._fitted:
            raise NotFittedError(type(self).__name__)
        return self._score(features=features, logits=logits, **kwargs)

    __call__ = score

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        """Default: nothing to fit."""

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def is_fitted(self) -> bool:
        return self._fitted or not self.requires_fit

    def config(self) -> dict[str, Any]:
        """JSON-serialisable constructor kwargs (tensors such as fc weights live in the state dict)."""
        return {}

    # --- state ----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """Fitted tensors (and fc weights given to the constructor), detached and contiguous."""
        out = {}
        for name in self._state_names:
            value = getattr(self, name, None)
            if isinstance(value, Tensor):
                out[name] = value.detach().contiguous()
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> Detector:
        """Restore tensors saved by :meth:`state_dict` and mark the detector fitted. Returns ``self``."""
        unknown = sorted(set(state) - set(self._state_names))
        if unknown:
            raise ValueError(f"state has keys unknown to {type(self).__name__}: {unknown}")
        for name, value in state.items():
            setattr(self, name, value)
        self._fitted = True
        return self

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Detector:
        """Move the fitted tensors (floating ones are cast to ``dtype`` when given). Returns ``self``."""
        for name in self._state_names:
            value = getattr(self, name, None)
            if isinstance(value, Tensor):
                cast = dtype if (dtype is not None and value.is_floating_point()) else None
                setattr(self, name, value.to(device=device, dtype=cast))
        return self

    # --- persistence (pml_suprank.hub.HubMixin hooks) -------------------------------------------------------------
    # save_pretrained / from_pretrained / push_to_hub come from HubMixin: config.json in the common layout
    # (architecture = the detector's name, model_args = config(), fitted), model.safetensors = state_dict(), a model
    # card, atomic writes. Called on ``Detector``, from_pretrained instantiates the class named in config.json;
    # ``overrides`` replace constructor kwargs (e.g. ``model=`` for ODIN, which saves no network).
    _hub_optional_files: ClassVar[tuple[str, ...]] = (WEIGHTS_NAME,)  # folders of stateless detectors may omit it

    @classmethod
    def _hub_architecture(cls) -> str:
        return getattr(cls, "detector_name", None) or cls.__name__

    def _hub_check_savable(self) -> None:
        if self.requires_fit and not self._fitted:
            raise NotFittedError(type(self).__name__)

    def _hub_config(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        kind = getattr(self, "feature_kind", None)  # set by fit_model: the features predict extracts
        extra = {"feature_kind": kind} if kind is not None else {}
        return make_config(
            self._hub_architecture(), self.config(), task=DETECTOR_TASK, metadata=metadata, fitted=self._fitted,
            **extra,
        )  # fmt: skip

    def _hub_weights(self) -> dict[str, Tensor]:
        return self.state_dict()

    @classmethod
    def _hub_class(cls, config: Mapping[str, Any], source: Any) -> type:
        name = config.get("architecture")
        target = _detector_class(name, source)
        if cls is not Detector and not issubclass(target, cls):
            raise ValueError(f"{source} holds a {name} detector, not a {cls.__name__}")
        return target

    @classmethod
    def _hub_instantiate(cls, config: Mapping[str, Any], overrides: dict[str, Any], source: Any) -> Detector:
        return instantiate(cls, {**config["model_args"], **overrides}, source)

    def _hub_load_state(
        self, state: dict[str, Tensor], config: Mapping[str, Any], *, source: Any, strict: bool, map_location: str
    ) -> None:
        """Validate ``config["fitted"]``, the presence of the weights file and every loaded tensor, then restore them
        through :meth:`_restore`.

        The tensors are checked against :meth:`_state_spec` (names, shapes agreeing with the config and with each
        other, dtype kinds, finite values, no all-zero tensor where a fitted detector cannot hold one); detectors
        without a spec (user-defined ones) get the generic check: finite values, names among ``_state_names`` unless
        ``state_dict`` is overridden (``load_state_dict`` then checks them).

        Raises:
            FileNotFoundError: ``model.safetensors`` is missing although the detector needs fitted tensors.
            ValueError: A bad ``fitted`` flag, or tensors that do not match (naming the file and the key).
        """
        weights = Path(source)
        fitted = config.get("fitted", bool(state))
        if not isinstance(fitted, bool):
            raise ValueError(f"{weights.parent / CONFIG_NAME}: key 'fitted' must be true or false; got {fitted!r}")
        if self.requires_fit:
            if not fitted:
                raise ValueError(
                    f"{weights.parent / CONFIG_NAME}: key 'fitted' is false, but a {type(self).__name__} must be "
                    "fitted to be saved (save_pretrained refuses unfitted detectors); corrupt or foreign config?"
                )
            if not weights.is_file():
                raise FileNotFoundError(
                    f"{weights} is missing: a fitted {type(self).__name__} keeps its fitted tensors in it "
                    f"(the folder must hold {CONFIG_NAME} and {WEIGHTS_NAME} as written by save_pretrained)"
                )
        self._hub_check_state(state, weights, dict(config))
        kind = config.get("feature_kind")
        if kind is not None and kind not in ("pooled", "embedding"):
            raise ValueError(
                f"{weights.parent / CONFIG_NAME}: key 'feature_kind' must be 'pooled' or 'embedding'; got {kind!r}"
            )
        self._restore(state, dict(config))
        if kind is not None:
            self.feature_kind = kind

    def _state_spec(self) -> dict[str, TensorSpec] | None:
        """The tensors this detector (as configured) holds once fitted, or ``None`` for the generic check."""
        return None

    def _hub_check_state(self, state: dict[str, Tensor], source: Path, config: dict[str, Any]) -> None:
        """Check loaded tensors before use (see :meth:`_hub_load_state`); ``ValueError`` naming file and key."""
        spec = self._state_spec()
        if spec is None:
            default_state = type(self).state_dict is Detector.state_dict
            check_state(state, source, allowed=self._state_names if default_state else None)
        else:
            check_schema(state, source, spec)

    def _restore(self, state: dict[str, Tensor], meta: dict[str, Any]) -> None:
        """Load ``state`` (``meta`` is the loaded ``config.json``, with ``fitted``)."""
        if state or meta.get("fitted"):
            self.load_state_dict(state)

    def __repr__(self) -> str:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({kwargs})"
