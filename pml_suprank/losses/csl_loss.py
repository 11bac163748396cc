"""CSL: the hierarchical proxy baseline of the HAPPIER / SupRank experiments, as the reference code computes it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.losses.mixins import WeightRegularizerMixin
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
from torch import Tensor

from .._precision import float32_forward
from .._validation import check_positive, check_positive_int
from ..relevance import Hierarchy, as_hierarchical_labels, as_hierarchy, check_tree
from ._inputs import check_embedding_size, check_indices_tuple, fine_labels, prepare_inputs, require_hierarchy
from .compile_guard import GuardedCompileMixin
from .registry import register_loss

__all__ = ["CSLLoss"]


@register_loss(
    "CSL", hierarchical=True, options=(),
    paper=("Dynamic Metric Learning: Towards a Scalable Metric Space to Accommodate Multiple Semantic Scales "
           "(Sun et al., CVPR 2021)", "https://arxiv.org/abs/2103.11781"),
)  # fmt: skip
class CSLLoss(GuardedCompileMixin, WeightRegularizerMixin, BaseMetricLossFunction):
    """Hierarchical proxy loss "CSL" (Sun et al., CVPR 2021) as in the SupRank reference code (HAPPIER baseline,
    ECCV 2022, Tab. 1-2). One proxy per fine class, ``P = normalize(W)``, scores ``S = scale · E Pᵀ`` (embeddings as
    given). For each level ``c`` (column of the labels):

    ``ℓ_c(b) = softplus( logsumexp_{p: lab_p[c] ≠ lab_b[c]} S[b, p] − S[b, own proxy] + scale · m_c )``

    and the loss is ``Σ_c mean_b ℓ_c(b)`` (per-element ``Σ_c ℓ_c(b)`` under the PML reducer, ``MeanReducer``).

    :attr:`proxy_labels` ``(num_classes, L)``: each fine class's labels at every level, from ``hierarchy=`` or
    registered from 2-D label batches (:meth:`register_labels`); unknown ancestors differ from every query.

    Args:
        num_classes: number of fine classes (proxies); fine labels must lie in ``[0, num_classes)``.
        embedding_size: embedding dimension ``D``.
        margins: one margin per level, finest first (reference default ``(0.25, 0.35, 0.45)``; SOP/iNat-base
            ``(0.25, 0.45)``). Its length fixes the number of levels ``L``.
        scale: the scale ``s`` (32).
        hierarchy: optional ``(num_fine, L)`` table / :class:`~pml_suprank.relevance.Hierarchy` for 1-D fine labels.
        **kwargs: PML options (``reducer``, ``weight_regularizer``, ``weight_init_func``, ...).

    Shapes: ``embeddings (B, embedding_size)``, ``labels (B, L)`` (or ``(B,)`` with ``hierarchy``); returns a scalar.
    No ``ref_emb`` (proxy loss); an ``indices_tuple`` weights the queries like PML's proxy losses.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margins: Sequence[float] = (0.25, 0.35, 0.45),
        scale: float = 32.0,
        hierarchy: Hierarchy | Tensor | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_classes = num_classes = check_positive_int("num_classes", num_classes)
        self.embedding_size = embedding_size = check_positive_int("embedding_size", embedding_size)
        if isinstance(margins, (str, bytes)) or not isinstance(margins, Sequence) or len(margins) == 0:
            raise ValueError(f"margins must be a non-empty sequence of floats, one per level; got {margins!r}")
        self.margins = [float(m) for m in margins]
        self.scale = check_positive("scale", scale)
        self.num_levels = len(self.margins)
        self.hierarchy = hierarchy = as_hierarchy(hierarchy)
        table = torch.full((num_classes, self.num_levels), -1, dtype=torch.long)
        if hierarchy is not None:
            if hierarchy.num_levels != self.num_levels:
                raise ValueError(
                    f"margins has {self.num_levels} entries but the hierarchy has {hierarchy.num_levels} levels; "
                    "give one margin per level"
                )
            if hierarchy.table.shape[0] > num_classes:
                raise ValueError(
                    f"the hierarchy has {hierarchy.table.shape[0]} fine labels but num_classes={num_classes}"
                )
            table[: hierarchy.table.shape[0]] = hierarchy.table.cpu()
        self.register_buffer("proxy_labels", table)
        self.proxies = torch.nn.Parameter(torch.empty(num_classes, embedding_size))
        self.weight_init_func(self.proxies)
        self.add_to_recordable_attributes(list_of_names=["num_classes", "scale"], is_stat=False)

    def get_default_weight_init_func(self):
        # the reference initialises the proxies uniformly in ±1/sqrt(D) (nn.Linear style)
        return c_f.TorchInitWrapper(torch.nn.init.kaiming_uniform_, a=5**0.5)

    def cast_types(self, dtype, device):
        self.proxies.data = c_f.to_device(self.proxies.data, device=device, dtype=dtype)

    @torch.no_grad()
    def register_labels(self, labels: Tensor) -> None:
        """Record the ancestors of the fine classes in ``labels`` (``(N, L)``, or ``(N,)`` with a hierarchy);
        ``ValueError`` for a class seen with other ancestors than those registered."""
        labels = self._levels_of(labels, "labels")
        rows = torch.unique(labels, dim=0)
        table = self.proxy_labels.to(labels.device)
        known = table[rows[:, 0]]
        clash = (known[:, 0] >= 0) & (known != rows).any(1)
        if bool(clash.any()):
            k = int(torch.nonzero(clash)[0, 0])
            raise ValueError(
                f"fine label {int(rows[k, 0])} has ancestors {rows[k].tolist()} but {known[k].tolist()} were "
                "registered before; the labels are not one tree"
            )
        table = table.index_copy(0, rows[:, 0], rows)
        self.proxy_labels = table.to(self.proxy_labels.device)

    def _levels_of(self, labels: Tensor, name: str) -> Tensor:
        require_hierarchy("CSLLoss", labels, self.hierarchy, name=name)
        labels = as_hierarchical_labels(labels, self.hierarchy, name=name, check=self.hierarchy is None)
        if labels.shape[1] != self.num_levels:
            raise ValueError(
                f"{name} have {labels.shape[1]} levels but margins has {self.num_levels} entries (one per level); "
                f"got {name}.shape={tuple(labels.shape)}"
            )
        if bool((labels < 0).any()):
            raise ValueError(f"{name} must be non-negative; got minimum {int(labels.min())}")
        if bool((labels[:, 0] >= self.num_classes).any()):
            raise ValueError(f"{name} contain fine label {int(labels[:, 0].max())} >= num_classes={self.num_classes}")
        return labels

    @float32_forward
    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """Compute the loss (PML call signature; ``labels`` may be 2-D)."""
        self.reset_stats()
        if ref_emb is not None or ref_labels is not None:
            raise ValueError("CSLLoss is a proxy loss: ref_emb / ref_labels are not supported; got a reference set")
        embeddings, labels, _, _, _ = prepare_inputs("CSLLoss", embeddings, labels, None, None, allow_2d_labels=True)
        check_embedding_size(embeddings, self.embedding_size)
        check_indices_tuple(indices_tuple, embeddings.shape[0], embeddings.shape[0])
        loss_dict = self.compute_loss(embeddings, labels, indices_tuple, None, None)
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return self.reducer(loss_dict, embeddings, fine_labels(labels))

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        dtype, device = embeddings.dtype, embeddings.device
        self.cast_types(dtype, device)
        levels = self._levels_of(labels, "labels")
        if self.hierarchy is None:
            check_tree(levels)
            self.register_labels(levels)
        fine = levels[:, 0]
        table = self.proxy_labels.to(device)
        scores = self.scale * (embeddings @ F.normalize(self.proxies, dim=-1).t())  # (B, C)
        own = scores.gather(1, fine[:, None]).squeeze(1)
        neg_inf = torch.tensor(float("-inf"), dtype=dtype, device=device)
        losses = torch.zeros_like(own)
        for c, margin in enumerate(self.margins):
            different = table[None, :, c] != levels[:, c, None]  # (B, C)
            has = different.any(1)
            # rows without any different proxy contribute 0 (softplus(-inf)); keep their logsumexp finite for autograd
            masked = torch.where(different, scores, torch.where(has[:, None], neg_inf, 0.0))
            lse = torch.logsumexp(masked, dim=1)
            term = F.softplus(lse - own + self.scale * margin)
            losses = losses + torch.where(has, term, torch.zeros_like(term))
        if indices_tuple is not None:
            losses = losses * lmu.convert_to_weights(indices_tuple, fine, dtype=dtype)
        indices = c_f.torch_arange_from_size(embeddings)
        loss_dict = {"loss": {"losses": losses, "indices": indices, "reduction_type": "element"}}
        self.add_weight_regularization_to_loss_dict(loss_dict, self.proxies)
        return loss_dict
