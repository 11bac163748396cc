"""The ``Detector`` contract shared by HEAT and the baselines, its registry, input checks and save / load / push.

A detector is fitted post hoc on in-distribution features and returns an **outlier score** per sample, higher = more
OOD: ``ood.KNN(k=50).fit(features=z_train).score(features=z_test)`` ``(N,)``. Fitted state is a flat
``dict[str, Tensor]`` (``model.safetensors``) plus the constructor kwargs (``config.json``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._registry import Registry
from .._validation import check_embeddings, check_labels
from ..hub.mixin import HubMixin
from ..hub.schema import TensorSpec, check_schema
from ..hub.serialization import CONFIG_NAME, DETECTOR_TASK, WEIGHTS_NAME, check_state, make_config
from .features import FEATURE_KINDS
from .model_api import ModelDetectorMixin, model_head

__all__ = ["DETECTOR_REGISTRY", "Detector", "HeadDetector", "NotFittedError", "get_detector", "list_detectors"]

#: Name -> detector class, filled by subclassing :class:`Detector` (a taken name is replaced with a ``UserWarning``).
DETECTOR_REGISTRY = Registry("detector")
list_detectors = DETECTOR_REGISTRY.names
get_detector = DETECTOR_REGISTRY.get_class
#: Constructor arguments that are state or objects, not ``config.json`` entries.
_NOT_CONFIG = ("weight", "bias", "head", "model")


class NotFittedError(RuntimeError):
    """Raised when ``score`` is called on a detector that needs ``fit`` first."""

    def __init__(self, name: str = "This detector") -> None:
        super().__init__(f"{name} is not fitted yet: call .fit(features=..., labels=...) before .score(...)")


def check_features(name: str, x: Any, dim: int | None = None, n: int | None = None) -> Tensor:
    """Check ``x`` is a finite floating ``(N, D)`` tensor, with ``D == dim`` and ``N == n`` when given."""
    if x is None:
        raise ValueError(f"{name} are required by this detector (an (N, D) tensor); got None")
    x = check_embeddings(name, x)
    if dim is not None and x.shape[1] != dim:
        raise ValueError(
            f"{name} must have {dim} columns (the feature dimension seen at fit time); got shape {tuple(x.shape)}"
        )
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} must have {n} rows (one per sample, as the other inputs); got {x.shape[0]}")
    return x


def check_class_labels(labels: Any, n: int, min_classes: int = 2) -> Tensor:
    """Check 1-D (or 2-D, column 0 = finest) integer class labels ``>= 0`` with at least ``min_classes`` classes."""
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


def energy_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Energy score (Liu et al. 2020, Eq. 7; HEAT's EL prior): ``(N, C)`` logits → ``(N,)``
    ``−T·logsumexp(logits / T)``, higher = more OOD."""
    return -temperature * torch.logsumexp(logits / temperature, dim=-1)


def _detector_class(name: Any, source: Any = None) -> type:
    """The registered detector class named in a saved ``config.json`` (``ValueError`` listing the names)."""
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

    Subclasses implement ``_fit`` and ``_score`` and list their fitted tensors in ``_state_names``; ``config()``
    returns the constructor arguments read from the attributes of the same name. ``requires_fit = False`` marks
    detectors without a fit; the others raise :class:`NotFittedError` from ``score`` before ``fit``.

    A subclass is registered when defined, under its name or the class keyword ``name=`` (``class
    SSDPlus(Mahalanobis, name="SSD+")``); private (``_``-prefixed) and abstract classes, and ``register=False``,
    are not. ``fit_model`` / ``predict`` (:mod:`.model_api`) extract a model's features first.
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

    def fit(self, features: Tensor | None = None, logits: Tensor | None = None, labels: Tensor | None = None, **kwargs):
        """Fit on ID training data. Returns ``self``. Unused inputs are ignored (one call for all detectors)."""
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
        """JSON-serialisable constructor kwargs (the head and ODIN's network are not config)."""
        params = list(inspect.signature(type(self).__init__).parameters.values())[1:]
        named = (p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        return {name: getattr(self, name) for name in named if name not in _NOT_CONFIG}

    def state_dict(self) -> dict[str, Tensor]:
        """Fitted tensors (and fc weights given to the constructor), detached and contiguous."""
        values = {name: getattr(self, name, None) for name in self._state_names}
        return {name: v.detach().contiguous() for name, v in values.items() if isinstance(v, Tensor)}

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

    # --- persistence: the HubMixin hooks (architecture = the detector's name, model_args = config(), state_dict())
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

    @classmethod
    def _hub_class(cls, config: Mapping[str, Any], source: Any) -> type:
        name = config.get("architecture")
        target = _detector_class(name, source)
        if cls is not Detector and not issubclass(target, cls):
            raise ValueError(f"{source} holds a {name} detector, not a {cls.__name__}")
        return target

    def _hub_load_state(
        self, state: dict[str, Tensor], config: Mapping[str, Any], *, source: Any, strict: bool, map_location: str
    ) -> None:
        """Check ``config["fitted"]``, ``feature_kind``, the weights file and every loaded tensor
        (:meth:`_hub_check_state`), then :meth:`_restore` them.

        Raises:
            FileNotFoundError: ``model.safetensors`` is missing although the detector keeps tensors in it.
            ValueError: A bad ``fitted`` flag or ``feature_kind``, or tensors that do not match (naming file and key).
        """
        weights, name = Path(source), type(self).__name__
        config_path = weights.parent / CONFIG_NAME
        fitted = config.get("fitted", bool(state))
        if not isinstance(fitted, bool):
            raise ValueError(f"{config_path}: key 'fitted' must be true or false; got {fitted!r}")
        if self.requires_fit and not fitted:
            raise ValueError(
                f"{config_path}: key 'fitted' is false, but a {name} must be fitted to be saved (save_pretrained "
                "refuses unfitted detectors); corrupt or foreign config?"
            )
        if (self.requires_fit or self._state_names) and not weights.is_file():
            raise FileNotFoundError(
                f"{weights} is missing: a {name} keeps its fitted tensors (or classifier head) in it (the folder must "
                f"hold {CONFIG_NAME} and {WEIGHTS_NAME} as written by save_pretrained)"
            )
        self._hub_check_state(state, weights, dict(config))
        kind = config.get("feature_kind")
        if kind is not None and kind not in FEATURE_KINDS:
            raise ValueError(f"{config_path}: key 'feature_kind' must be 'pooled' or 'embedding'; got {kind!r}")
        self._restore(state, dict(config))
        if kind is not None:
            self.feature_kind = kind

    def _state_spec(self) -> dict[str, TensorSpec] | None:
        """The tensors this detector (as configured) holds once fitted, or ``None`` for the generic check."""
        return None

    def _hub_check_state(self, state: dict[str, Tensor], source: Path, config: dict[str, Any]) -> None:
        """Check loaded tensors against :meth:`_state_spec` (names, shapes, dtype kinds, finite values, no all-zero
        fitted tensor); without a spec: finite values, names among ``_state_names`` unless ``state_dict`` is
        overridden."""
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


def head_params(weight: Tensor | None, bias: Tensor | None, head: nn.Module | None) -> tuple[Tensor, Tensor | None]:
    """Detached copies ``(W (C, D), b (C,) or None)`` of the classifier head, from ``weight`` / ``bias`` or ``head``."""
    if head is not None:
        if weight is not None or bias is not None:
            raise ValueError("pass either head= or weight=/bias=, not both")
        if not isinstance(getattr(head, "weight", None), Tensor):
            raise TypeError(f"head must be a linear layer with a .weight of shape (C, D); got {type(head).__name__}")
        weight, bias = head.weight, getattr(head, "bias", None)
    if weight is None:
        raise ValueError("this detector needs the classifier head: pass weight= (C, D) and bias= (C,), or head=")
    weight = check_features("weight", weight.detach()).clone()
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias must have shape ({weight.shape[0]},) to match weight; got {shape}")
        bias = bias.detach().clone()
    return weight, bias


def linear_logits(z: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``z Wᵀ + b`` ``(N, C)`` in ``z``'s dtype and device."""
    b = None if bias is None else bias.to(device=z.device, dtype=z.dtype)
    return F.linear(z, weight.to(device=z.device, dtype=z.dtype), b)


class HeadDetector(Detector, register=False):
    """Base of the detectors keeping the classifier head ``weight`` ``(C, D)`` / ``bias`` ``(C,)`` as state (ViM,
    DICE, ReAct, ASH, SCALE); built without one, they take it from ``load_state_dict`` or from ``fit_model``'s model.

    Default score ``(N,)``: the energy ``−logsumexp(shape(z) W̃ᵀ + b)`` of the shaped features :meth:`shape` (identity)
    under the head weight :meth:`shaped_weight` (``W``)."""

    _state_names = ("weight", "bias")

    def __init__(self, weight=None, bias=None, head=None) -> None:
        super().__init__()
        self.weight, self.bias = (None, None) if weight is None and head is None else head_params(weight, bias, head)

    def _adopt(self, model: nn.Module) -> None:
        if self.weight is None:
            self.weight, self.bias = head_params(None, None, model_head(model, type(self).__name__))

    def _logits(self, z: Tensor, weight: Tensor | None = None) -> Tensor:
        return linear_logits(z, self.weight if weight is None else weight, self.bias)

    def _check_z(self, features: Any) -> Tensor:
        if self.weight is None:
            raise ValueError(f"{type(self).__name__} has no classifier weight: pass weight=/bias= or head=")
        return check_features("features", features, dim=self.weight.shape[1])

    def shape(self, z: Tensor) -> Tensor:
        """``(N, D) -> (N, D)`` features given to the head (ReAct, ASH, SCALE shape them)."""
        return z

    def shaped_weight(self) -> Tensor:
        """``(C, D)`` head weight of the score (DICE sparsifies it)."""
        return self.weight

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = self._check_z(features)
        return energy_logits(self._logits(self.shape(z), self.shaped_weight()))

    def _state_spec(self) -> dict[str, TensorSpec]:
        """The head: ``weight`` ``(C, D)`` (not all zero), optional ``bias`` ``(C,)``; subclasses add their own."""
        return {"weight": TensorSpec(("C", "D"), nonzero=True), "bias": TensorSpec(("C",), optional=True)}

    def _restore(self, state, meta) -> None:
        self.load_state_dict(state)
        self._fitted = bool(meta.get("fitted", True))
