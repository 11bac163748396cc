"""Post-hoc OOD baselines with the ``Detector`` API: MSP, MaxLogit, Energy, ODIN, Mahalanobis / SSD+, KNN, ViM, DICE,
ReAct. Every score is an outlier score (higher = more OOD), i.e. the negative of OpenOOD's ``conf``.

Definitions follow OpenOOD v1.5 and pytorch-ood 0.4.0, which agree once hyper-parameters are aligned
(``spec/heat_reference.md`` §14; golden vectors ``heat_golden.json``). Where HEAT's reference code deviates from the
official method (its ViM), the official definition is implemented and the deviation is noted in the class docstring.

Detectors that need the classifier head (ViM, DICE, ReAct) take ``weight`` ``(C, D)`` and ``bias`` ``(C,)`` or an
``nn.Linear`` ``head``; ODIN takes the network mapping inputs to logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_positive, check_probability
from .base import Detector, check_features
from .metrics import quantile_linear
from .priors import ClassConditionalGaussian, energy_logits

__all__ = ["MSP", "MaxLogit", "Energy", "ODIN", "Mahalanobis", "KNN", "ViM", "DICE", "ReAct"]


def _check_logits(logits: Any) -> Tensor:
    if logits is None:
        raise ValueError("logits are required by this detector (an (N, C) tensor); got None")
    return check_features("logits", logits)


def _head_params(weight: Tensor | None, bias: Tensor | None, head: nn.Module | None) -> tuple[Tensor, Tensor | None]:
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


class _HeadDetector(Detector):
    """Detectors holding fc ``weight`` / ``bias`` as state (saved with the fitted tensors)."""

    def __init__(self, weight=None, bias=None, head=None, *, _allow_missing: bool = False) -> None:
        super().__init__()
        if weight is None and head is None and _allow_missing:
            self.weight, self.bias = None, None  # restored by load_state_dict
        else:
            self.weight, self.bias = _head_params(weight, bias, head)

    def _logits(self, z: Tensor, weight: Tensor | None = None) -> Tensor:
        w = (self.weight if weight is None else weight).to(device=z.device, dtype=z.dtype)
        b = None if self.bias is None else self.bias.to(device=z.device, dtype=z.dtype)
        return F.linear(z, w, b)

    def _check_z(self, features: Any) -> Tensor:
        if self.weight is None:
            raise ValueError(f"{type(self).__name__} has no classifier weight: pass weight=/bias= or head=")
        return check_features("features", features, dim=self.weight.shape[1])

    def _restore(self, state, meta) -> None:
        self.load_state_dict(state)
        self._fitted = bool(meta.get("fitted", True))


class MSP(Detector):
    """Maximum softmax probability (Hendrycks & Gimpel 2017): score ``−max_c softmax(logits)_c``. Needs ``logits``."""

    requires_fit = False

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return -torch.softmax(_check_logits(logits), dim=-1).max(dim=-1).values


class MaxLogit(Detector):
    """Maximum logit (Hendrycks et al. 2022): score ``−max_c logits_c``. Needs ``logits``."""

    requires_fit = False

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return -_check_logits(logits).max(dim=-1).values


class Energy(Detector):
    """Energy score (Liu et al. 2020, Eq. 7): ``−T·logsumexp(logits/T)``; HEAT's EL prior for ``T = 1``.

    Args:
        temperature: ``T > 0`` (1 in the paper, OpenOOD and pytorch-ood).
    """

    requires_fit = False

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = check_positive("temperature", temperature)

    def config(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        return energy_logits(_check_logits(logits), self.temperature)


class ODIN(Detector):
    """ODIN (Liang et al. 2018): temperature scaling plus input perturbation, score ``−max softmax(f(x̃)/T)``.

    ``x̃ = x − ε·sign(∇ₓ CE(f(x)/T, argmax f(x)))`` with the sign gradient divided per channel by ``norm_std`` when
    given (OpenOOD divides by the dataset std; pytorch-ood 0.4.0 and HEAT do not by default). Matches pytorch-ood
    0.4.0 and HEAT exactly (golden). The network is not saved by ``save_pretrained``: pass ``model=`` to
    ``from_pretrained``.

    Args:
        model: Callable mapping a batch of inputs ``(N, ...)`` to logits ``(N, C)`` (e.g. a timm model in eval mode).
        temperature: Softmax temperature ``T`` (1000 in the paper).
        eps: Perturbation magnitude ``ε`` (0.0014).
        norm_std: Optional per-channel input std used to rescale the sign gradient.

    ``score(inputs=x)`` needs the raw inputs (gradients flow through ``model``); ``features`` / ``logits`` are unused.
    """

    requires_fit = False

    def __init__(
        self,
        model: Callable[[Tensor], Tensor] | None = None,
        temperature: float = 1000.0,
        eps: float = 0.0014,
        norm_std: tuple[float, ...] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.temperature = check_positive("temperature", temperature)
        self.eps = check_positive("eps", eps, strict=False)
        if norm_std is not None:
            norm_std = tuple(check_positive("norm_std", float(s)) for s in norm_std)
        self.norm_std = norm_std

    def config(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "eps": self.eps, "norm_std": self.norm_std}

    def _score(self, features=None, logits=None, inputs: Tensor | None = None, **kwargs) -> Tensor:
        if self.model is None:
            raise ValueError("ODIN needs model= (a callable from inputs to logits)")
        if not isinstance(inputs, Tensor) or not inputs.is_floating_point():
            raise ValueError(f"ODIN.score needs inputs= a floating tensor of network inputs; got {type(inputs)}")
        with torch.enable_grad():
            x = inputs.detach().clone().requires_grad_(True)
            scaled = self.model(x) / self.temperature
            loss = F.cross_entropy(scaled, scaled.argmax(dim=-1))
            (grad,) = torch.autograd.grad(loss, x)
        step = grad.sign()
        if self.norm_std is not None:
            if inputs.dim() < 2 or inputs.shape[1] != len(self.norm_std):
                raise ValueError(
                    f"norm_std has {len(self.norm_std)} entries but inputs have shape {tuple(inputs.shape)}"
                )
            std = torch.tensor(self.norm_std, device=x.device, dtype=x.dtype).reshape(1, -1, *([1] * (x.dim() - 2)))
            step = step / std
        x_hat = x.detach() - self.eps * step
        return -torch.softmax(self.model(x_hat) / self.temperature, dim=-1).max(dim=-1).values


class Mahalanobis(Detector):
    """Mahalanobis distance with class means and one shared covariance (Lee et al. 2018); SSD+ when ``normalize``.

    Score ``min_c (z−μ_c)ᵀΣ⁻¹(z−μ_c)`` with the MLE covariance of class-centred features. With ``normalize=False``
    this is OpenOOD's MDS (``−conf``) and HEAT's ``maha`` scorer; with ``normalize=True`` (features L2-normalised)
    it is SSD+ (Sehwag et al. 2021), the "GMM" row of thesis Table 5.1 / "SSD+" of Table 5.5. pytorch-ood's
    ``Mahalanobis`` gives ``0.5·score/N`` (its covariance is not divided by N): the same ranking.

    Args:
        normalize: L2-normalise features (SSD+).
        reg: Relative ridge on the covariance (see :class:`~pml_suprank.ood.priors.ClassConditionalGaussian`).
    """

    _state_names = ("means", "class_weights", "cholesky", "classes")

    def __init__(self, normalize: bool = False, reg: float = 1e-6) -> None:
        super().__init__()
        self.normalize, self.reg = bool(normalize), float(reg)
        self.gaussian = ClassConditionalGaussian(normalize=normalize, reg=reg)

    def config(self) -> dict[str, Any]:
        return {"normalize": self.normalize, "reg": self.reg}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        features = check_features("features", features)
        self.gaussian.fit(features, labels)

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = check_features("features", features, dim=self.gaussian.dim)
        return self.gaussian.min_mahalanobis(z)

    def state_dict(self) -> dict[str, Tensor]:
        return self.gaussian.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> Mahalanobis:
        self.gaussian.load_state_dict(state)
        self._fitted = True
        return self

    def to(self, device=None, dtype=None) -> Mahalanobis:
        self.gaussian.load_state_dict({k: v.to(device) for k, v in self.gaussian.state_dict().items()})
        return self


class KNN(Detector):
    """Deep nearest neighbours (Sun et al. 2022): squared L2 distance to the ``k``-th nearest training feature.

    Features are L2-normalised (``normalize=True``, as the paper, OpenOOD and HEAT). The score equals HEAT's
    ``KNNScorer`` and ``−`` OpenOOD's ``conf`` (squared distance); pytorch-ood returns the unsquared distance (same
    ranking). Exact search by chunked matrix products (no faiss needed).

    Args:
        k: Neighbour rank (50 for CIFAR-10, 200 for CIFAR-100, 1000 for ImageNet in HEAT's evaluation).
        normalize: L2-normalise train and test features.
        chunk_size: Test rows per chunk (memory ``chunk_size × N_train``).
    """

    _state_names = ("bank",)

    def __init__(self, k: int = 50, normalize: bool = True, chunk_size: int = 1024) -> None:
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer; got {k!r}")
        self.k, self.normalize, self.chunk_size = k, bool(normalize), int(check_positive("chunk_size", chunk_size))
        self.bank: Tensor | None = None

    def config(self) -> dict[str, Any]:
        return {"k": self.k, "normalize": self.normalize, "chunk_size": self.chunk_size}

    def _prep(self, z: Tensor) -> Tensor:
        return F.normalize(z, dim=-1, eps=1e-12) if self.normalize else z

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = check_features("features", features)
        if z.shape[0] < self.k:
            raise ValueError(f"KNN needs at least k={self.k} training features; got {z.shape[0]}")
        self.bank = self._prep(z.detach())

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = check_features("features", features, dim=self.bank.shape[1])
        bank = self.bank.to(device=z.device, dtype=z.dtype)
        bank_sq = (bank * bank).sum(-1)
        outs = []
        for part in self._prep(z).split(self.chunk_size):
            dist = (part * part).sum(-1, keepdim=True) + bank_sq - 2.0 * part @ bank.T
            outs.append(dist.topk(self.k, dim=-1, largest=False).values[:, -1].clamp_min(0.0))
        return torch.cat(outs)


class ViM(_HeadDetector):
    """Virtual-logit matching (Wang et al. 2022, Eqs. 5-8), as OpenOOD v1.5 and pytorch-ood 0.4.0.

    ``u = −W⁺b``; ``P`` = uncentred covariance of ``z − u`` (divided by N); ``NS`` = its eigenvectors beyond the
    ``dim`` largest eigenvalues; ``α = mean_train max-logit / mean_train ‖(z−u)NS‖``. Score
    ``α‖(z−u)NS‖ − logsumexp(Wz + b)`` (= ``−conf``).

    Deviation from HEAT's reference: HEAT's ``VIMScorer`` uses a centred covariance and logits ``fc(z − u)``
    (spec §12; golden α 1.59 vs 6.51); the official definition is implemented here.

    Args:
        dim: Dimension of the principal subspace (``D − dim`` residual directions); 256 for CIFAR-10 in HEAT.
        weight, bias, head: The classifier head.
    """

    _state_names = ("weight", "bias", "u", "null_space", "alpha")

    def __init__(self, dim: int = 256, weight=None, bias=None, head=None) -> None:
        super().__init__(weight, bias, head, _allow_missing=True)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer; got {dim!r}")
        if self.weight is not None and dim >= self.weight.shape[1]:
            raise ValueError(f"dim must be smaller than the feature dimension {self.weight.shape[1]}; got {dim}")
        self.dim = dim

    def config(self) -> dict[str, Any]:
        return {"dim": self.dim}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = self._check_z(features).detach()
        w = self.weight.to(device=z.device, dtype=torch.float64)
        if self.bias is None:
            u = torch.zeros(w.shape[1], dtype=torch.float64, device=z.device)
        else:
            u = -torch.linalg.pinv(w) @ self.bias.to(device=z.device, dtype=torch.float64)
        centred = z.to(torch.float64) - u
        cov = centred.T @ centred / z.shape[0]
        eigvals, eigvecs = torch.linalg.eigh(cov)  # ascending
        order = torch.argsort(eigvals, descending=True)
        null_space = eigvecs[:, order[self.dim :]]
        vlogit = torch.linalg.vector_norm(centred @ null_space, dim=-1)
        max_logit = self._logits(z.to(torch.float64), w).max(dim=-1).values
        self.u, self.null_space = u, null_space
        self.alpha = (max_logit.mean() / vlogit.mean()).reshape(())

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = self._check_z(features)
        z64 = z.to(torch.float64)
        vlogit = torch.linalg.vector_norm((z64 - self.u.to(z.device)) @ self.null_space.to(z.device), dim=-1)
        energy = torch.logsumexp(self._logits(z64, self.weight.to(z.device, torch.float64)), dim=-1)
        return (self.alpha.to(z.device) * vlogit - energy).to(z.dtype)


class DICE(_HeadDetector):
    """DICE (Sun & Li 2022): sparsify the head by weight contribution, then the energy score.

    ``m`` = mean training feature; contribution ``m ⊙ W`` (C × D); weights whose contribution is not above the
    ``p``-quantile (linear interpolation over all C·D entries) are zeroed; score ``−logsumexp(z W̃ᵀ + b)``. Matches
    OpenOOD (``p`` in percent there) and pytorch-ood (fraction) exactly.

    Args:
        p: Sparsity, the **fraction** of weights dropped, in [0, 1) (HEAT: 0.9 on CIFAR-10, 0.7 on ImageNet).
        weight, bias, head: The classifier head.
    """

    _state_names = ("weight", "bias", "mask")

    def __init__(self, p: float = 0.9, weight=None, bias=None, head=None) -> None:
        super().__init__(weight, bias, head, _allow_missing=True)
        self.p = check_probability("p", p)
        if self.p >= 1.0:
            raise ValueError(f"p must lie in [0, 1) (fraction of weights dropped); got {p}")

    def config(self) -> dict[str, Any]:
        return {"p": self.p}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = self._check_z(features).detach()
        w = self.weight.to(device=z.device, dtype=z.dtype)
        contrib = z.mean(dim=0, keepdim=True) * w
        self.mask = contrib > quantile_linear(contrib, self.p)

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = self._check_z(features)
        masked = self.weight.to(device=z.device, dtype=z.dtype) * self.mask.to(z.device)
        return energy_logits(self._logits(z, masked))


class ReAct(_HeadDetector):
    """ReAct (Sun et al. 2021): clip activations at the ``percentile`` of ID activations, then the energy score.

    Threshold = linear-interpolated percentile of **all** training feature values (OpenOOD computes it on the ID
    validation split; fit on whichever set you want as ID reference). Score ``−logsumexp(fc(min(z, thr)))``.

    Args:
        percentile: In (0, 100]; 90 in OpenOOD, 95 in HEAT's code (``react_p = 0.95``).
        weight, bias, head: The classifier head.
    """

    _state_names = ("weight", "bias", "threshold")

    def __init__(self, percentile: float = 90.0, weight=None, bias=None, head=None) -> None:
        super().__init__(weight, bias, head, _allow_missing=True)
        percentile = check_positive("percentile", percentile)
        if percentile > 100.0:
            raise ValueError(f"percentile must lie in (0, 100]; got {percentile}")
        self.percentile = percentile

    def config(self) -> dict[str, Any]:
        return {"percentile": self.percentile}

    def _fit(self, features=None, logits=None, labels=None, **kwargs) -> None:
        z = self._check_z(features).detach()
        self.threshold = quantile_linear(z, self.percentile / 100.0).reshape(())

    def _score(self, features=None, logits=None, **kwargs) -> Tensor:
        z = self._check_z(features)
        return energy_logits(self._logits(z.clamp(max=self.threshold.to(z.device, z.dtype))))
