"""Retrieval models: the SupRank / ROADMAP / HAPPIER architecture ("ResNet-50 + LN + 512-d projection", Ramzi et
al., TPAMI, Sec. VII-A) on any timm backbone, with an optional linear classification head (for HEAT):

    x (B, 3, H, W) --backbone.forward_features--> map (B, C, h, w) or tokens (B, T, C)
      --pool (avg | GeM | max)--> (B, C) --LayerNorm (no affine)--> --Linear(C, D)--> --L2-normalise--> (B, D)

Saved and loaded through :class:`pml_suprank.hub.HubMixin`: restoring never downloads (``pretrained=False``), a
loaded ``config.json`` is untrusted unless ``trust_config=True`` and every loaded tensor is checked.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validation import check_bool, check_choice, check_embeddings, check_positive, check_positive_int
from .hub.loaded_config import check_loaded_model_args
from .hub.mixin import HubMixin, load_module_state
from .hub.serialization import check_loaded_values

logger = logging.getLogger(__name__)

__all__ = [
    "CropMode",
    "GeneralizedMeanPooling",
    "RetrievalModel",
    "pca_projection",
]

PoolingType = Literal["avg", "gem", "max"]
ProjectionInit = Literal["random", "pca"]
CropMode = Literal["center", "squash", "border"]

_HUB_PREFIXES = ("hf-hub:", "local-dir:")


def _timm():
    try:
        import timm
    except ImportError as e:  # pragma: no cover - timm is in the recipes extra
        raise ImportError("pml_suprank.models needs timm; install it with `pip install pml-suprank[recipes]`") from e
    return timm


def check_backbone_name(backbone: Any) -> str:
    """Return ``backbone`` if timm knows it (``"resnet50"``, ``"resnet50.a1_in1k"``; the ``hf-hub:`` / ``local-dir:``
    prefixes are left to timm, and refused in a loaded config unless ``trust_config=True``), else ``ValueError``."""
    if not isinstance(backbone, str) or not backbone:
        raise TypeError(
            f"backbone must be a non-empty timm model name (str); got {type(backbone).__name__} {backbone!r}"
        )
    if backbone.startswith(_HUB_PREFIXES):
        return backbone
    timm = _timm()
    arch = timm.models.split_model_name_tag(backbone)[0]
    if not timm.is_model(arch):
        close = timm.list_models(f"*{arch[:4]}*")[:8] if len(arch) >= 4 else []
        hint = f" Close names: {close}." if close else ""
        raise ValueError(
            f"backbone={backbone!r} is not a timm model name (see timm.list_models()); "
            f"e.g. 'resnet50', 'resnet50.a1_in1k', 'vit_small_patch16_224', 'test_resnet'.{hint}"
        )
    return backbone


def pca_projection(features: Tensor, out_dim: int, *, whiten: bool = False) -> tuple[Tensor, Tensor]:
    """``(weight (D, C), bias (D,))`` of the map onto the ``D = out_dim`` leading principal components of finite
    ``features`` ``(N >= 2, C)``: the PCA-initialised projection of the SupRank landmark models (TPAMI Sec. VII-C3).

    With ``mu = mean_n x_n`` and ``S = 1/(N-1) sum_n (x_n - mu)(x_n - mu)^T = V diag(l) V^T`` (``l_1 >= l_2 >= ...``),
    ``y = W (x - mu) = W x + b`` with ``W = V[:, :D]^T``, ``b = -W mu``; ``whiten=True`` divides row k by
    ``sqrt(l_k)``. Computed in float64, each component signed so that its largest entry is positive; rows
    ``k >= rank`` (eigenvalues below ``C * eps * l_1`` count as zero) are zero, so ``D > min(N - 1, C)`` is allowed.
    Returned in the dtype and on the device of ``features``.

    Raises:
        TypeError: ``features`` is not a floating-point Tensor.
        ValueError: ``features`` is not ``(N >= 2, C >= 1)`` or not finite, or ``out_dim`` is not a positive int.
    """
    if check_embeddings("features", features).shape[0] < 2:
        raise ValueError(f"features must have at least 2 rows; got shape {tuple(features.shape)}")
    if isinstance(out_dim, bool) or not isinstance(out_dim, int) or out_dim < 1:
        raise ValueError(f"out_dim must be a positive int; got {out_dim!r}")
    x = features.detach().to(torch.float64)
    n, c = x.shape
    mean = x.mean(dim=0)
    centred = x - mean
    cov = centred.T @ centred / (n - 1)
    eigvals, eigvecs = torch.linalg.eigh(cov)  # ascending
    eigvals, eigvecs = eigvals.flip(0), eigvecs.flip(1)
    components = eigvecs.T  # (C, C), row k = k-th principal axis (a unit vector: its largest entry is not 0)
    components = components * torch.sign(components.gather(1, components.abs().argmax(dim=1, keepdim=True)))
    tol = c * torch.finfo(torch.float64).eps * float(eigvals[0].clamp(min=0.0))
    k = min(n - 1, c, int((eigvals > tol).sum()), out_dim)
    top = components[:k] / eigvals[:k].sqrt().unsqueeze(1) if whiten else components[:k]
    weight = torch.cat([top, top.new_zeros(out_dim - k, c)])
    bias = -(weight @ mean)
    return weight.to(features.dtype), bias.to(features.dtype)


class GeneralizedMeanPooling(nn.Module):
    """Generalized-mean (GeM) pooling (Radenović et al., TPAMI 2019, Eq. 1): ``gem(x) = (mean_i clamp(x_i, eps) ** p)
    ** (1 / p)`` over the spatial positions (or tokens); p = 1 is average pooling and p → ∞ max pooling.

    Args:
        p: Initial exponent (3.0 in the paper and in the SupRank ``resnet_ln_gem`` config).
        learnable: Whether ``p`` is a ``Parameter`` (trained with the head) or a fixed buffer.
        eps: Activations are clamped to ``[eps, ∞)`` before the power, as GeM is defined for non-negative inputs.
    """

    def __init__(self, p: float = 3.0, learnable: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        value = torch.tensor([check_positive("p", p)])
        self.eps = check_positive("eps", eps)
        if learnable:
            self.p = nn.Parameter(value)
        else:
            self.register_buffer("p", value)

    def forward(self, x: Tensor, dim: tuple[int, ...] = (-2, -1)) -> Tensor:
        """Pool ``x`` over ``dim`` (default: the two trailing spatial dimensions of a ``(B, C, H, W)`` map)."""
        p = self.p.to(dtype=x.dtype)
        return x.clamp(min=self.eps).pow(p).mean(dim=dim).pow(1.0 / p)

    def extra_repr(self) -> str:
        return f"p={float(self.p.detach()):.4f}, eps={self.eps}"


def _check_layer_names(backbone_kwargs: dict[str, Any]) -> None:
    """``act_layer`` / ``norm_layer`` given by name must be timm layer names (timm raises a bare ``KeyError``)."""
    from timm.layers import get_act_layer, get_norm_layer

    for key, resolve in (("act_layer", get_act_layer), ("norm_layer", get_norm_layer)):
        value = backbone_kwargs.get(key)
        if not isinstance(value, str) or value == "":
            continue
        try:
            resolve(value)
        except (KeyError, ValueError, AssertionError) as e:
            raise ValueError(
                f"backbone_kwargs[{key!r}] must name a timm {key.replace('_', ' ')} (e.g. 'gelu', 'relu' / "
                f"'layernorm', 'batchnorm'); got {value[:64]!r} ({type(e).__name__}: {str(e)[:100]})"
            ) from e


class Pooling(nn.Module):
    """Global ``pooling`` (``"avg"``, ``"gem"`` with a learnable exponent starting at ``gem_p``, ``"max"``) of a timm
    feature output: ``(B, C, H, W)`` maps (or NHWC: timm's ``output_fmt``) or ``(B, T, C)`` tokens, whose first
    ``num_prefix_tokens`` (class / register tokens) are dropped, so that every pooling means the same for CNNs and ViTs.
    """

    def __init__(
        self,
        pooling: PoolingType = "avg",
        gem_p: float = 3.0,
        output_fmt: str = "NCHW",
        num_prefix_tokens: int = 0,
    ) -> None:
        super().__init__()
        self.pooling = check_choice("pooling", pooling, get_args(PoolingType))
        self.output_fmt = check_choice("output_fmt", output_fmt, ("NCHW", "NHWC"))
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.gem = GeneralizedMeanPooling(gem_p) if pooling == "gem" else None

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` / ``(B, H, W, C)`` / ``(B, T, C)`` → ``(B, C)``."""
        if x.dim() == 4:
            dim = (-2, -1) if self.output_fmt == "NCHW" else (1, 2)
        elif x.dim() == 3:
            if self.num_prefix_tokens and x.shape[1] > self.num_prefix_tokens:
                x = x[:, self.num_prefix_tokens :]
            dim = (1,)
        elif x.dim() == 2:
            return x  # already pooled (e.g. a backbone that pools internally)
        else:
            raise ValueError(f"backbone features must have 2, 3 or 4 dimensions; got shape {tuple(x.shape)}")
        if self.pooling == "avg":
            return x.mean(dim=dim)
        if self.pooling == "max":
            return x.amax(dim=dim)
        return self.gem(x, dim=dim)

    def extra_repr(self) -> str:
        return f"pooling={self.pooling!r}, output_fmt={self.output_fmt!r}, num_prefix_tokens={self.num_prefix_tokens}"


class RetrievalModel(HubMixin, nn.Module):
    """The retrieval network of the module docstring (TPAMI Sec. VII-A); output dot products are cosine similarities.

    Args:
        backbone: Any timm model name, optionally with a pretrained tag (``"resnet50.a1_in1k"``).
        pretrained: Load timm's pretrained weights when the model is *created* (may download; never on restoring).
        pooling: ``"avg"``, ``"gem"`` (learnable p, initialised to ``gem_p``) or ``"max"``.
        embedding_size: Output dimension D of the projection; ``None`` keeps the backbone width without projection.
        layer_norm: Apply ``LayerNorm(C, elementwise_affine=False)`` to the pooled features before the projection.
        num_classes: If > 0, a linear classification head on the pooled features (``forward_logits``), e.g. for HEAT.
        backbone_kwargs: Extra keyword arguments for ``timm.create_model`` (e.g. ``{"img_size": 64}`` for a ViT).
        gem_p: Initial GeM exponent (only with ``pooling="gem"``).
        image_size, mean, std: Resolution and normalisation overriding the backbone's (in :attr:`data_config`).
        crop_pct: Evaluation crop fraction overriding the backbone's (``Resize(size / crop_pct)``, crop ``size``).
        crop_mode: Evaluation crop mode overriding the backbone's: ``"center"``, ``"squash"`` or ``"border"``
            (resize the long side, pad); ``crop_*`` are saved in ``config.json`` only when set.
        projection_init: ``"random"`` (``nn.Linear``'s init) or ``"pca"`` (needs ``embedding_size``; the
            :class:`~pml_suprank.training.Trainer` calls :meth:`init_projection_from_pca` at the start of a fresh run).

    Shapes: ``forward`` ``(B, 3, H, W)`` → ``(B, D)`` unit rows; ``forward_logits`` → ``(B, num_classes)``.
    ``save_pretrained``, ``from_pretrained`` (eval mode, ``hub_metadata`` and the OOD guard restored), ``push_to_hub``.

    Example:
        >>> model = RetrievalModel("resnet18", embedding_size=128, image_size=64)
        >>> model(torch.randn(2, 3, 64, 64)).shape
        torch.Size([2, 128])
    """

    def __init__(
        self,
        backbone: str = "resnet50",
        pretrained: bool = False,
        pooling: PoolingType = "avg",
        embedding_size: int | None = 512,
        layer_norm: bool = True,
        num_classes: int = 0,
        backbone_kwargs: dict[str, Any] | None = None,
        gem_p: float = 3.0,
        image_size: int | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        projection_init: ProjectionInit = "random",
        crop_pct: float | None = None,
        crop_mode: CropMode | None = None,
    ) -> None:
        super().__init__()
        timm = _timm()
        check_backbone_name(backbone)
        check_bool("pretrained", pretrained)
        check_choice("pooling", pooling, get_args(PoolingType))  # before the backbone (a download) is built
        embedding_size = check_positive_int("embedding_size", embedding_size, allow_none=True)
        num_classes = check_positive_int("num_classes", num_classes, minimum=0)
        if backbone_kwargs is not None and not isinstance(backbone_kwargs, dict):
            raise TypeError(f"backbone_kwargs must be a dict or None; got {type(backbone_kwargs).__name__}")
        backbone_kwargs = dict(backbone_kwargs or {})
        for reserved in ("num_classes", "global_pool", "pretrained"):
            if reserved in backbone_kwargs:
                raise ValueError(
                    f"backbone_kwargs must not contain {reserved!r} (RetrievalModel sets it); got {backbone_kwargs}"
                )
        _check_layer_names(backbone_kwargs)
        if not isinstance(layer_norm, bool):  # bool("false") is True: a string must not switch LayerNorm on
            raise TypeError(f"layer_norm must be a bool; got {type(layer_norm).__name__} {layer_norm!r}")
        image_size = check_positive_int("image_size", image_size, allow_none=True)
        for name, value in (("mean", mean), ("std", std)):
            if value is not None and (len(value) != 3 or not all(isinstance(v, (int, float)) for v in value)):
                raise ValueError(f"{name} must be None or three numbers (one per RGB channel); got {value!r}")
        if std is not None and any(v <= 0 for v in std):
            raise ValueError(f"std must be > 0 in every channel; got {std!r}")
        check_choice("projection_init", projection_init, get_args(ProjectionInit))
        if crop_pct is not None and (
            isinstance(crop_pct, bool) or not isinstance(crop_pct, (int, float)) or not 0 < crop_pct <= 1
        ):
            raise ValueError(f"crop_pct must be None or a number in (0, 1]; got {crop_pct!r}")
        check_choice("crop_mode", crop_mode, (*get_args(CropMode), None))
        if projection_init == "pca" and embedding_size is None:
            raise ValueError("projection_init='pca' needs a projection: give embedding_size (an int); got None")

        self.config: dict[str, Any] = {
            "backbone": backbone,
            "pretrained": pretrained,
            "pooling": pooling,
            "embedding_size": embedding_size,
            "layer_norm": bool(layer_norm),
            "num_classes": num_classes,
            "backbone_kwargs": backbone_kwargs,
            "gem_p": float(gem_p),
            "image_size": image_size,
            "mean": list(mean) if mean is not None else None,
            "std": list(std) if std is not None else None,
        }
        optional = {"projection_init": None if projection_init == "random" else projection_init,
                    "crop_pct": None if crop_pct is None else float(crop_pct), "crop_mode": crop_mode}  # fmt: skip
        self.config.update({k: v for k, v in optional.items() if v is not None})  # defaults left out of config.json
        self.projection_init: str = projection_init
        # free-form metadata saved in config.json (training loss, label names, dataset, metrics, ...)
        self.hub_metadata: dict[str, Any] = {}

        try:
            self.backbone = timm.create_model(backbone, pretrained=pretrained, num_classes=0, **backbone_kwargs)
        except RuntimeError as e:  # timm's "Unknown model" and failed downloads
            raise ValueError(f"could not build timm backbone {backbone!r}: {e}") from e
        except OSError as e:  # the Hub / URL download of the weights: offline, no cache entry, unreachable
            if not pretrained:
                raise
            raise ValueError(
                f"could not get the pretrained weights of timm backbone {backbone!r} ({type(e).__name__}: {e}); "
                "offline, either train from random weights (--pretrained false; RetrievalModel(pretrained=False)), "
                "or download the weights once where the Hub is reachable (into the Hugging Face cache, HF_HOME) and "
                "set HF_HUB_OFFLINE=1, or give a local checkpoint file "
                "(backbone_kwargs={'pretrained_cfg_overlay': {'file': '/path/to/weights.safetensors'}})"
            ) from None
        self.in_chans = int(backbone_kwargs.get("in_chans", 3))
        self.num_features = num_features = int(self.backbone.num_features)
        self.pool = Pooling(
            pooling,
            gem_p=gem_p,
            output_fmt=str(getattr(self.backbone, "output_fmt", "NCHW")),
            num_prefix_tokens=int(getattr(self.backbone, "num_prefix_tokens", 0) or 0),
        )
        self.norm = nn.LayerNorm(num_features, elementwise_affine=False) if layer_norm else nn.Identity()
        self.embedding_size = int(embedding_size) if embedding_size is not None else num_features
        self.projection = nn.Linear(num_features, embedding_size) if embedding_size is not None else nn.Identity()
        self.num_classes = num_classes
        self.classifier = nn.Linear(num_features, num_classes) if num_classes > 0 else None
        #: the OOD guard saved with the model (``final/ood/``, :mod:`pml_suprank.ood.guard`), set by from_pretrained
        self.ood_guard = None
        #: SHA-256 of the ``model.safetensors`` the model was loaded from (``None`` for a model built in memory)
        self.weights_sha256 = None

    # ------------------------------------------------------------------ forward passes
    def forward_features(self, x: Tensor) -> Tensor:
        """Backbone features before pooling: ``(B, C, h, w)`` for CNNs, ``(B, T, C)`` tokens for ViTs."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor image batch (B, C, H, W); got {type(x).__name__}")
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"x must be an image batch of shape (B, C={self.in_chans}, H, W); got {tuple(x.shape)}")
        weight = next(self.backbone.parameters(), None)
        autocast = torch.is_autocast_enabled(x.device.type) and x.dtype != torch.float64  # it casts the others
        if not x.is_floating_point() or (weight is not None and x.dtype != weight.dtype and not autocast):
            raise TypeError(f"x must be a {weight.dtype if weight is not None else 'floating-point'} image batch "
                            "(the model's dtype; images as floats normalised with the model's mean / std, as its "
                            f"transforms give them); got dtype {x.dtype}")  # fmt: skip
        return self.backbone.forward_features(x)

    def forward_pooled(self, x: Tensor) -> Tensor:
        """Pooled backbone features ``(B, C)`` (before LayerNorm and projection)."""
        return self.pool(self.forward_features(x))

    def forward_projection_input(self, x: Tensor) -> Tensor:
        """The input of the projection, ``(B, C)``: pooled backbone features after the LayerNorm (if any)."""
        return self.norm(self.forward_pooled(x))

    def embed_pooled(self, pooled: Tensor) -> Tensor:
        """Head on pooled features: LayerNorm → projection → L2 normalisation, ``(B, C)`` → ``(B, D)``."""
        return F.normalize(self.projection(self.norm(pooled)), p=2, dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        """L2-normalised embeddings ``(B, D)`` of an image batch ``(B, 3, H, W)``."""
        return self.embed_pooled(self.forward_pooled(x))

    def forward_logits(self, x: Tensor) -> Tensor:
        """Class logits ``(B, num_classes)`` from the classification head (requires ``num_classes > 0``)."""
        return self._classify(self.forward_pooled(x))

    def forward_with_logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Embeddings ``(B, D)`` and logits ``(B, num_classes)`` from one backbone pass."""
        pooled = self.forward_pooled(x)
        return self.embed_pooled(pooled), self._classify(pooled)

    def _classify(self, pooled: Tensor) -> Tensor:
        if self.classifier is None:
            raise ValueError("this RetrievalModel has no classification head; build it with num_classes > 0")
        return self.classifier(pooled)

    @torch.no_grad()
    def init_projection_from_pca(self, features: Tensor, *, whiten: bool = False) -> RetrievalModel:
        """Set the projection, in place, to :func:`pca_projection` of ``features`` ``(N >= 2, num_features)``:
        projection inputs (:meth:`forward_projection_input`) of training images; returns ``self``. ``ValueError``: no
        projection (``embedding_size=None``), or ``features`` of another shape or not finite."""
        if not isinstance(self.projection, nn.Linear):
            raise ValueError("init_projection_from_pca needs a projection; this model has embedding_size=None")
        if isinstance(features, Tensor) and features.shape[-1:] != (self.num_features,):
            raise ValueError(
                f"features must have shape (N, {self.num_features}) (the projection input); "
                f"got shape {tuple(features.shape)}"
            )
        weight, bias = pca_projection(features, self.embedding_size, whiten=whiten)
        self.projection.weight.copy_(weight.to(self.projection.weight))
        self.projection.bias.copy_(bias.to(self.projection.bias))
        return self

    # ------------------------------------------------------------------ search (pml_suprank.search)
    def build_index(self, dataset_or_loader: Any, *, backend: str = "torch", **kwargs: Any) -> Any:
        """Embed a gallery and index it; the index is returned and kept as ``self.retrieval_index`` for
        :meth:`search` (not saved with the model). See :func:`pml_suprank.search.from_model.build_index`."""
        from .search.from_model import build_index

        self.retrieval_index = build_index(self, dataset_or_loader, backend=backend, **kwargs)
        return self.retrieval_index

    def search(self, images: Any, k: int = 10, *, index: Any = None, batch_size: int = 64) -> tuple[Tensor, Tensor]:
        """Top-``k`` gallery items of images (tensors, PIL images or paths): ``(scores (B, k), indices (B, k))``
        from ``index`` or the one :meth:`build_index` built. See :func:`pml_suprank.search.from_model.search_images`."""
        from .search.from_model import search_images

        index = index if index is not None else getattr(self, "retrieval_index", None)
        return search_images(self, index, images, k, batch_size=batch_size)

    # ------------------------------------------------------------------ helpers for recipes
    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters split as in the reference configs: ``backbone`` (the timm trunk) and ``head``
        (GeM exponent, projection and classifier), for per-group learning rates."""
        backbone = [p for p in self.backbone.parameters() if p.requires_grad]
        ids = {id(p) for p in backbone}
        head = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
        return {"backbone": backbone, "head": head}

    def freeze_batch_norm(self) -> RetrievalModel:
        """Put every BatchNorm layer of the backbone in eval mode and stop its affine gradients (call it after
        ``model.train()``; the reference ResNet-50 recipes train with frozen BatchNorm statistics)."""
        for module in self.backbone.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
                for p in module.parameters():
                    p.requires_grad_(False)
        return self

    @property
    def data_config(self) -> dict[str, Any]:
        """timm data config (``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``),
        with ``image_size`` / ``mean`` / ``std`` / ``crop_pct`` / ``crop_mode`` overrides applied; the input of
        :func:`pml_suprank.data.build_transforms`."""
        cfg, c = dict(_timm().data.resolve_model_data_config(self.backbone)), self.config
        if c["image_size"] is not None:
            cfg["input_size"] = (3, c["image_size"], c["image_size"])
        cfg.update({k: tuple(c[k]) for k in ("mean", "std") if c[k] is not None})
        return {**cfg, **{k: c[k] for k in ("crop_pct", "crop_mode") if c.get(k) is not None}}

    def get_config(self) -> dict[str, Any]:
        """The constructor kwargs (JSON-able), with ``pretrained=False`` so that restoring never downloads."""
        config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.config.items()}
        config["pretrained"] = False
        return config

    def extra_repr(self) -> str:
        return f"backbone={self.config['backbone']!r}, embedding_size={self.embedding_size}"

    # ------------------------------------------------------------------ saving: the guard travels with the model
    def _save_pretrained(self, save_directory: Path) -> None:
        """The weights, plus the model's OOD guard (``ood/``, bound to the new file) when the weights are those it was
        loaded with; otherwise (the model was changed since) the guard is left out with a warning."""
        super()._save_pretrained(save_directory)
        guard = self.ood_guard
        if guard is None:
            return
        from .ood.guard import state_digest, weights_sha256

        if guard.model_sha256 == self.weights_sha256 and state_digest(self) == self.__dict__.get("_weights_digest"):
            guard.for_weights(weights_sha256(save_directory)).save(save_directory)
        else:
            logger.warning(
                "the OOD guard was fitted on weights with sha256 %s, not on the weights being saved: it is not saved "
                "with them (refit it with fit_heat --model)",
                guard.model_sha256,
            )

    # ------------------------------------------------------------------ loading (pml_suprank.hub.HubMixin hooks)
    #: the OOD guard's files (pml_suprank.ood.guard.GUARD_FILES), fetched with the model from one Hub snapshot
    _hub_companion_files = ("ood/guard.json", "ood/config.json", "ood/model.safetensors")

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | Path, **kwargs: Any) -> RetrievalModel:
        """:meth:`HubMixin.from_pretrained <pml_suprank.hub.HubMixin.from_pretrained>`, plus ``model.ood_guard``: the
        :class:`~pml_suprank.ood.guard.OODGuard` of the folder's ``ood/`` (``None`` without one; one fitted on other
        weights is refused) and ``model.weights_sha256``, the SHA-256 of the loaded ``model.safetensors``."""
        from .ood.guard import attach_guard

        model = super().from_pretrained(path_or_repo_id, **kwargs)
        return attach_guard(model, model._hub_source)

    @classmethod
    def _hub_check_config(cls, config, source, *, overrides, trust_config: bool) -> None:
        if not trust_config:
            check_loaded_model_args(config["model_args"], source, skip=overrides)

    def _hub_load_state(self, state, config, *, source, strict: bool, map_location: str) -> None:
        check_loaded_values(state, source)
        load_module_state(self, state, config, source=source, strict=strict, map_location=map_location)
