"""The score matrix of the rank losses: cosine / dot-product similarities with one explicit backward.

PML's ``CosineSimilarity()(embeddings, ref_emb)`` normalises the batch twice when it is its own reference set, and
autograd replays every step in backward (about 30 operators for one ``(B, N)`` matrix). :func:`similarity_scores`
computes the same matrix with one normalisation per distinct input and an explicit gradient:

* forward: ``x̂ = x / max(‖x‖₂, ε)`` (``F.normalize``'s definition, ``ε = 1e-12``) and ``S = x̂ r̂ᵀ``
  (``r̂ = x̂`` when the reference set is the batch);
* backward, with ``G = ∂L/∂S`` ``(B, N)``: ``∂L/∂x̂ = G r̂`` (``(G + Gᵀ) x̂`` for the batch itself) and, through the
  normalisation, ``∂L/∂x = (∂L/∂x̂ − [‖x‖ > ε] · x̂ ⟨x̂, ∂L/∂x̂⟩) / max(‖x‖, ε)``.

Only PML's own ``CosineSimilarity`` / ``DotProductSimilarity`` (power 1, p = 2, statistics off) take this path;
any other distance object is called as PML would call it. Values equal PML's up to rounding; no host synchronisation.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._precision import float32_backward

__all__ = ["NORMALIZE_EPS", "normalized_logits", "similarity_scores"]

NORMALIZE_EPS = 1e-12  # F.normalize's default, which PML's distances use


def _normalize(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x̂ (N, D), max(‖x‖, ε) (N, 1))``."""
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(NORMALIZE_EPS)
    return x / norm, norm


def _normalize_backward(grad_hat: Tensor, x_hat: Tensor, norm: Tensor | None) -> Tensor:
    """``∂L/∂x`` from ``∂L/∂x̂`` through ``x̂ = x / max(‖x‖, ε)``; rows with ``‖x‖ <= ε`` are a plain division;
    ``norm`` None (no normalisation, ``x̂ = x``): ``∂L/∂x̂`` itself."""
    if norm is None:
        return grad_hat
    radial = torch.where(norm > NORMALIZE_EPS, (x_hat * grad_hat).sum(1, keepdim=True), 0.0)
    return torch.addcmul(grad_hat, x_hat, radial, value=-1.0) / norm


class _Similarity(torch.autograd.Function):
    """``S = x̂ r̂ᵀ`` (or ``x x̂ᵀ`` without normalisation) with the explicit backward of the module docstring."""

    @staticmethod
    def forward(ctx, embeddings, ref_emb, normalize: bool):
        x_hat, norm = _normalize(embeddings) if normalize else (embeddings, None)
        if ref_emb is None:
            r_hat, r_norm = x_hat, None
        else:
            r_hat, r_norm = _normalize(ref_emb) if normalize else (ref_emb, None)
        ctx.same = ref_emb is None
        ctx.save_for_backward(x_hat, norm, r_hat, r_norm)
        return x_hat @ r_hat.mT

    @staticmethod
    @once_differentiable
    @float32_backward
    def backward(ctx, grad):
        x_hat, norm, r_hat, r_norm = ctx.saved_tensors
        if ctx.same:  # norm is None without normalisation
            return _normalize_backward((grad + grad.mT) @ x_hat, x_hat, norm), None, None
        grad_x = _normalize_backward(grad @ r_hat, x_hat, norm) if ctx.needs_input_grad[0] else None
        grad_r = _normalize_backward(grad.mT @ x_hat, r_hat, r_norm) if ctx.needs_input_grad[1] else None
        return grad_x, grad_r, None


def _is_plain(distance) -> bool:
    """PML's own cosine / dot-product similarity with the settings the closed form assumes."""
    return (
        type(distance) in (CosineSimilarity, DotProductSimilarity)
        and distance.power == 1
        and (not distance.normalize_embeddings or distance.p == 2)
        and not distance.collect_stats
    )


def similarity_scores(distance, embeddings: Tensor, ref_emb: Tensor | None = None) -> Tensor:
    """``(B, N)`` similarities ``S[b, j] = ⟨x̂_b, r̂_j⟩`` = ``distance(embeddings (B, D), ref_emb (N, D))`` (normalised
    when ``distance.normalize_embeddings``), differentiable w.r.t. both; ``ref_emb=None`` (or ``embeddings`` itself)
    is the batch as its own reference set."""
    same = ref_emb is None or ref_emb is embeddings
    if not _is_plain(distance):
        return distance(embeddings, None if same else ref_emb)
    return _Similarity.apply(embeddings, None if same else ref_emb, bool(distance.normalize_embeddings))


class _NormalizedLogits(torch.autograd.Function):
    """``x p̂ᵀ / T`` with ``p̂`` the L2-normalised rows of ``p`` (ClusterLoss's proxy logits), explicit backward."""

    @staticmethod
    def forward(ctx, embeddings, proxies, temperature: float):
        p_hat, norm = _normalize(proxies)
        ctx.temperature = temperature
        ctx.save_for_backward(embeddings, p_hat, norm)
        return embeddings @ p_hat.mT / temperature

    @staticmethod
    @once_differentiable
    @float32_backward
    def backward(ctx, grad):
        embeddings, p_hat, norm = ctx.saved_tensors
        grad = grad / ctx.temperature
        grad_x = grad @ p_hat if ctx.needs_input_grad[0] else None
        grad_p = _normalize_backward(grad.mT @ embeddings, p_hat, norm) if ctx.needs_input_grad[1] else None
        return grad_x, grad_p, None


def normalized_logits(embeddings: Tensor, proxies: Tensor, temperature: float) -> Tensor:
    """``(B, C)`` logits ``x_b · p̂_c / T`` of ``embeddings`` ``(B, D)`` (not normalised here) and ``proxies``
    ``(C, D)``, ``p̂_c = p_c / max(‖p_c‖₂, ε)`` (``F.normalize``), ``T > 0``: the proxy scores of
    :class:`~pml_suprank.losses.ClusterLoss` (L_DG*, SupRank Eq. 8), one explicit backward for both arguments."""
    return _NormalizedLogits.apply(embeddings, proxies, temperature)
