"""Retrieval models: a timm backbone, a pooling layer, LayerNorm, a linear projection and L2 normalisation.

This is the architecture of the SupRank / ROADMAP / HAPPIER papers ("ResNet-50 + LN + 512-d projection",
Ramzi et al., TPAMI, Sec. VII-A; HAPPIER, ECCV 2022, Sec. 4 "Implementation details"), generalised to any timm backbone:

    x (B, 3, H, W) --backbone.forward_features--> map (B, C, h, w) or tokens (B, T, C)
      --pool (avg | GeM | max)--> (B, C) --LayerNorm (no affine)--> --Linear(C, D)--> --L2-normalise--> (B, D)

An optional linear classification head on the pooled ``(B, C)`` features serves HEAT and classification baselines.

``RetrievalModel`` inherits :class:`pml_suprank.hub.HubMixin`: ``save_pretrained`` writes ``config.json`` (the
constructor kwargs, the data config and training metadata), ``model.safetensors`` and a model card;
``from_pretrained`` always rebuilds the backbone with ``pretrained=False`` (the saved weights replace the ImageNet
ones, so loading never downloads them); ``push_to_hub`` uploads the folder.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validation import check_choice, check_positive
from .hub.mixin import HubMixin

logger = logging.getLogger(__name__)

__all__ = ["GeneralizedMeanPooling", "Pooling", "PoolingType", "RetrievalModel", "check_backbone_name"]

PoolingType = Literal["avg", "gem", "max"]

_HUB_PREFIXES = ("hf-hub:", "local-dir:")


def _timm():
    try:
        import timm
    except ImportError as e:  # pragma: no cover - timm is in the recipes extra
        raise ImportError("pml_suprank.models needs timm; install it with `pip install pml-suprank[recipes]`") from e
    return timm


def check_backbone_name(backbone: Any) -> str:
    """Return ``backbone`` if timm knows it, else raise ``ValueError``.

    Accepts an architecture name (``"resnet50"``), a name with a pretrained tag (``"resnet50.a1_in1k"``) and the
    ``hf-hub:`` / ``local-dir:`` prefixes of ``timm.create_model`` (checked by timm itself when the model is built).
    Note that timm resolves an ``hf-hub:`` name through the Hub even with ``pretrained=False`` (it needs the remote
    config), so a saved model with such a backbone restores offline only from a populated Hub cache; plain
    architecture names (with or without a pretrained tag) never touch the network when restoring.
    """
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


class GeneralizedMeanPooling(nn.Module):
    """Generalized-mean (GeM) pooling with a learnable exponent (Radenović et al., TPAMI 2019, Eq. 1).

    ``gem(x) = (mean_i clamp(x_i, eps) ** p) ** (1 / p)`` over the spatial positions (or tokens);
    p = 1 is average pooling and p → ∞ max pooling.

    Args:
        p: Initial exponent (3.0 in the paper and in the SupRank ``resnet_ln_gem`` config).
        learnable: Whether ``p`` is a ``Parameter`` (trained with the head) or a fixed buffer.
        eps: Activations are clamped to ``[eps, ∞)`` before the power, as GeM is defined for non-negative inputs.
    """

    def __init__(self, p: float = 3.0, learnable: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        check_positive("p", p)
        check_positive("eps", eps)
        self.eps = float(eps)
        value = torch.tensor([float(p)])
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


class Pooling(nn.Module):
    """Global pooling of a timm feature output: ``(B, C, H, W)`` maps (NCHW or NHWC) or ``(B, T, C)`` tokens.

    For token sequences the first ``num_prefix_tokens`` (class / register tokens) are dropped and the patch
    tokens are pooled, so every pooling type means the same thing for CNNs and ViTs.

    Args:
        pooling: ``"avg"``, ``"gem"`` (learnable p) or ``"max"``.
        gem_p: Initial GeM exponent.
        output_fmt: ``"NCHW"`` or ``"NHWC"`` for 4-D inputs (timm's ``model.output_fmt``).
        num_prefix_tokens: Number of leading non-patch tokens of a ViT-style backbone.
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
    """Embedding network for image retrieval: timm backbone + pooling + LayerNorm + projection + L2 normalisation.

    The SupRank/ROADMAP/HAPPIER architecture (Ramzi et al., TPAMI, Sec. VII-A: "a ResNet-50 backbone with average
    pooling, a normalization layer without affine parameters and a projection head that reduces the dimension from
    2048 to 512"), followed by L2 normalisation so that dot products are cosine similarities.

    Args:
        backbone: Any timm model name, optionally with a pretrained tag (``"resnet50.a1_in1k"``).
        pretrained: Load timm's pretrained weights when the model is *created* (may download). Restoring a saved
            model with :meth:`from_pretrained` always uses ``pretrained=False``.
        pooling: ``"avg"``, ``"gem"`` (learnable p, initialised to ``gem_p``) or ``"max"``.
        embedding_size: Output dimension D of the projection; ``None`` keeps the backbone width without projection.
        layer_norm: Apply ``LayerNorm(C, elementwise_affine=False)`` to the pooled features before the projection.
        num_classes: If > 0, a linear classification head on the pooled features (``forward_logits``), e.g. for HEAT.
        backbone_kwargs: Extra keyword arguments for ``timm.create_model`` (e.g. ``{"drop_path_rate": 0.1}``,
            ``{"img_size": 64}`` for a ViT).
        gem_p: Initial GeM exponent (only with ``pooling="gem"``).
        image_size: Training/test resolution when it differs from the backbone default (e.g. 64 for SyntheticShapes);
            reported in :attr:`data_config`.
        mean: Normalisation mean overriding the backbone's pretrained config.
        std: Normalisation std overriding the backbone's pretrained config.

    Shapes:
        ``forward``: ``(B, 3, H, W)`` → ``(B, D)`` with unit L2 norm rows.
        ``forward_logits``: ``(B, 3, H, W)`` → ``(B, num_classes)``.

    Persistence (from :class:`~pml_suprank.hub.HubMixin`):
        ``model.save_pretrained(folder, metadata=..., metrics=..., hub_config=..., plots=...)``,
        ``RetrievalModel.from_pretrained(folder_or_repo_id, map_location=..., strict=..., revision=..., cache_dir=...,
        local_files_only=..., token=...)`` (in eval mode, ``hub_metadata`` restored) and ``model.push_to_hub(repo_id)``.

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
    ) -> None:
        super().__init__()
        timm = _timm()
        check_backbone_name(backbone)
        if not isinstance(pretrained, bool):
            raise TypeError(f"pretrained must be a bool; got {type(pretrained).__name__} {pretrained!r}")
        check_choice("pooling", pooling, get_args(PoolingType))
        if embedding_size is not None and (
            isinstance(embedding_size, bool) or not isinstance(embedding_size, int) or embedding_size <= 0
        ):
            raise ValueError(f"embedding_size must be a positive int or None; got {embedding_size!r}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"num_classes must be an int >= 0; got {num_classes!r}")
        if backbone_kwargs is not None and not isinstance(backbone_kwargs, dict):
            raise TypeError(f"backbone_kwargs must be a dict or None; got {type(backbone_kwargs).__name__}")
        backbone_kwargs = dict(backbone_kwargs or {})
        for reserved in ("num_classes", "global_pool", "pretrained"):
            if reserved in backbone_kwargs:
                raise ValueError(
                    f"backbone_kwargs must not contain {reserved!r} (RetrievalModel sets it); got {backbone_kwargs}"
                )
        if image_size is not None and (
            isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0
        ):
            raise ValueError(f"image_size must be a positive int or None; got {image_size!r}")
        for name, value in (("mean", mean), ("std", std)):
            if value is not None and (len(value) != 3 or not all(isinstance(v, (int, float)) for v in value)):
                raise ValueError(f"{name} must be None or three numbers (one per RGB channel); got {value!r}")
        if std is not None and any(v <= 0 for v in std):
            raise ValueError(f"std must be > 0 in every channel; got {std!r}")

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
        # free-form metadata saved in config.json (training loss, label names, dataset, metrics, ...)
        self.hub_metadata: dict[str, Any] = {}

        try:
            self.backbone = timm.create_model(backbone, pretrained=pretrained, num_classes=0, **backbone_kwargs)
        except RuntimeError as e:  # timm's "Unknown model" and failed downloads
            raise ValueError(f"could not build timm backbone {backbone!r}: {e}") from e
        num_features = int(self.backbone.num_features)
        self.num_features = num_features
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

    # ------------------------------------------------------------------ forward passes
    def forward_features(self, x: Tensor) -> Tensor:
        """Backbone features before pooling: ``(B, C, h, w)`` for CNNs, ``(B, T, C)`` tokens for ViTs."""
        if x.dim() != 4:
            raise ValueError(f"x must be an image batch of shape (B, C, H, W); got shape {tuple(x.shape)}")
        return self.backbone.forward_features(x)

    def forward_pooled(self, x: Tensor) -> Tensor:
        """Pooled backbone features ``(B, C)`` (before LayerNorm and projection)."""
        return self.pool(self.forward_features(x))

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

    # ------------------------------------------------------------------ helpers for recipes
    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters split as in the reference configs: ``backbone`` (the timm trunk) and ``head``
        (GeM exponent, projection and classifier), for per-group learning rates."""
        backbone = [p for p in self.backbone.parameters() if p.requires_grad]
        ids = {id(p) for p in backbone}
        head = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
        return {"backbone": backbone, "head": head}

    def freeze_batch_norm(self) -> RetrievalModel:
        """Put every BatchNorm layer of the backbone in eval mode and stop its affine gradients.

        The reference ResNet-50 recipes train with frozen BatchNorm statistics (``freeze_batch_norm``); call this
        after ``model.train()``.
        """
        for module in self.backbone.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
                for p in module.parameters():
                    p.requires_grad_(False)
        return self

    @property
    def data_config(self) -> dict[str, Any]:
        """timm data config (``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``),
        with ``image_size`` / ``mean`` / ``std`` overrides applied."""
        timm = _timm()
        cfg = dict(timm.data.resolve_model_data_config(self.backbone))
        if self.config["image_size"] is not None:
            s = self.config["image_size"]
            cfg["input_size"] = (3, s, s)
        if self.config["mean"] is not None:
            cfg["mean"] = tuple(self.config["mean"])
        if self.config["std"] is not None:
            cfg["std"] = tuple(self.config["std"])
        return cfg

    def get_config(self) -> dict[str, Any]:
        """The constructor kwargs (JSON-able), with ``pretrained=False`` so that restoring never downloads."""
        config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.config.items()}
        config["pretrained"] = False
        return config

    def extra_repr(self) -> str:
        return f"backbone={self.config['backbone']!r}, embedding_size={self.embedding_size}"

    def named_head_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Named parameters outside the backbone (pooling, projection, classifier)."""
        for name, p in self.named_parameters():
            if not name.startswith("backbone."):
                yield name, p
