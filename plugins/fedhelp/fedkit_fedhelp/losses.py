"""FedHelp's loss terms (paper eqs. 1-7), as plain functions of logits and targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kl(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(target) || softmax(logits))``, mean over the batch."""
    return F.kl_div(
        F.log_softmax(logits, dim=1),
        F.log_softmax(target_logits, dim=1),
        log_target=True,
        reduction="batchmean",
    )


def api_mixture(scores: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``sum_m a_m F_m(x_p)`` with ``a = softmax(scores)`` per sample: (B, M), (B, M, K) -> (B, K)."""
    weights = F.softmax(scores, dim=1)
    return (weights.unsqueeze(-1) * probs).sum(1)


def surrogate_loss(
    logits: torch.Tensor, labels: torch.Tensor, mixture: torch.Tensor, lam: float
) -> torch.Tensor:
    """Eq. 1: ``CE(surrogate(x_p), y_p) + lam * KL(mixture || softmax(surrogate(x_p)))``.

    Public samples without a label in the APIs' classes (``-1``) contribute only the KL term.
    """
    log_q = F.log_softmax(logits, dim=1)
    target = mixture.clamp_min(1e-12)
    divergence = (mixture * (target.log() - log_q)).sum(1).mean()
    known = labels >= 0
    ce = F.nll_loss(log_q[known], labels[known]) if known.any() else logits.sum() * 0.0
    return ce + lam * divergence


def ranking_loss(large: torch.Tensor, proxy: torch.Tensor, top: int) -> torch.Tensor:
    """Eqs. 5-6, ``KD_b``: the large model's negative log-probability of each of the proxy's
    ``top`` highest classes Q, summed over Q, mean over the batch::

        -sum_{r in Q} log( exp(z_r) / (sum_{u in Q} exp(z_u) + sum_{v not in Q} exp(z_v)) )

    Minimising it raises the large model's probabilities of Q (the sign the paper states).
    """
    top_classes = proxy.detach().topk(min(top, proxy.shape[1]), dim=1).indices
    return -F.log_softmax(large, dim=1).gather(1, top_classes).sum(1).mean()
