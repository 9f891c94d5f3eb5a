"""FedHelp's loss terms (paper eqs. 1-7; appendix A eqs. 8-13 per pixel), as plain functions
of logits and targets.

Every function takes class scores on dim 1: ``(B, K)`` for classification or ``(B, K, H, W)``
for segmentation, where each term is computed per pixel and averaged over the pixels (the
paper's sums over pixels, scaled by their number). ``weight`` is a per-position weight map
(``(B,)`` or ``(B, H, W)``, the U-Net weight maps of the segmentation variant); ``None``
weighs every position 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _mean(values: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    return values.mean() if weight is None else (weight * values).mean()


def kl(
    target_logits: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """``KL(softmax(target) || softmax(logits))`` per position, averaged (weighted)."""
    log_p = F.log_softmax(target_logits, dim=1)
    divergence = (log_p.exp() * (log_p - F.log_softmax(logits, dim=1))).sum(1)
    return _mean(divergence, weight)


def api_mixture(scores: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``sum_m a_m F_m(x_p)`` with ``a = softmax(scores)`` per sample: scores (B, M), probs
    (B, M, K[, H, W]) -> (B, K[, H, W]); a sample's scores weigh all of its pixels."""
    weights = F.softmax(scores, dim=1)
    weights = weights.reshape(*weights.shape, *([1] * (probs.dim() - 2)))
    return (weights * probs).sum(1)


def surrogate_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mixture: torch.Tensor,
    lam: float,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 1 (eq. 8 per pixel): ``CE(surrogate(x_p), y_p) + lam * KL(mixture ||
    softmax(surrogate(x_p)))``, each weighted by ``weight``.

    Public samples (pixels) without a label in the APIs' classes (``-1``) contribute only
    the KL term; the CE is averaged over the labelled ones.
    """
    log_q = F.log_softmax(logits, dim=1)
    target = mixture.clamp_min(1e-12)
    divergence = _mean((mixture * (target.log() - log_q)).sum(1), weight)
    known = labels >= 0
    if not known.any():
        return lam * divergence
    ce = F.nll_loss(log_q, labels.clamp_min(0), reduction="none") * known
    if weight is not None:
        ce = ce * weight
    return ce.sum() / known.sum() + lam * divergence


def public_term(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mixture: torch.Tensor,
    lambda_r: float,
    lambda_l: float,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The small client's public-data part of eq. 3 (eq. 8 per pixel): ``lambda_l * R``
    with ``R = CE(surrogate(x_p), y_p) + lambda_r * KL(mixture || softmax(surrogate(x_p)))``
    (eq. 1). Paper defaults (section 4.1.2): ``lambda_r`` (lambda_R) 0.1, ``lambda_l`` 0.2."""
    return lambda_l * surrogate_loss(logits, labels, mixture, lambda_r, weight)


def forward_kd(large: torch.Tensor, proxy: torch.Tensor, lambda_f: float) -> torch.Tensor:
    """``lambda_F * KD_f`` (eq. 4, weighted as in eq. 7): ``KL(large || proxy)`` with the
    large model as the teacher. Its gradient trains the proxy only: the large model is
    detached (the paper: distilling the proxy into the large model "will introduce noise";
    the large model learns from the proxy only through :func:`ranking_loss`)."""
    return lambda_f * kl(large.detach(), proxy)


def weighted_ce(
    logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. 11: cross-entropy per position, weighted, averaged."""
    return _mean(F.cross_entropy(logits, labels, reduction="none"), weight)


def ranking_loss(large: torch.Tensor, proxy: torch.Tensor, top: int) -> torch.Tensor:
    """Eqs. 5-6 (eq. 13 per pixel), ``KD_b``: the large model's negative log-probability of
    each of the proxy's ``top`` highest classes Q, summed over Q, averaged over positions::

        -sum_{r in Q} log( exp(z_r) / (sum_{u in Q} exp(z_u) + sum_{v not in Q} exp(z_v)) )

    Minimising it raises the large model's probabilities of Q (the sign the paper states).
    """
    top_classes = proxy.detach().topk(min(top, proxy.shape[1]), dim=1).indices
    return -F.log_softmax(large, dim=1).gather(1, top_classes).sum(1).mean()
