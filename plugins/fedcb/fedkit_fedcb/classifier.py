"""The arithmetic of FedCB (Zhu et al., MICCAI 2024), free of fedkit objects so it can be
checked by hand: the class statistics of text embeddings (paper eq. 2, diagonal only) and
the classifier built on them (eqs. 4-5)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def class_statistics(
    embeddings: torch.Tensor, variance: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mu, sigma)``, each (K, D), from text embeddings (K classes, M prompts, D).

    Each embedding is L2-normalised first; ``mu_k`` is their mean (not re-normalised) and
    ``sigma_k`` the diagonal of their unbiased covariance (divided by M - 1). With
    ``variance=False`` sigma is zero (the paper's "embedding average" ablation).
    """
    fewest = 2 if variance else 1
    if embeddings.dim() != 3 or embeddings.shape[1] < fewest:
        raise ValueError(
            f"embeddings must be (classes, prompts >= {fewest}, dim), got {tuple(embeddings.shape)}"
        )
    e = F.normalize(embeddings.double(), dim=-1)
    mu = e.mean(dim=1).float()
    if not variance:
        return mu, torch.zeros_like(mu)
    return mu, e.var(dim=1, unbiased=True).float()


def class_geometry(mu: torch.Tensor) -> dict[str, float]:
    """Mean, smallest and largest cosine between the frozen classifier's class vectors
    (``mu``, K x D, K >= 2), over the K (K - 1) ordered pairs: near 1, nearly parallel class
    vectors that a unit feature can hardly tell apart; near 0, nearly orthogonal ones."""
    unit = F.normalize(mu.double(), dim=-1)
    off = (unit @ unit.T)[~torch.eye(len(mu), dtype=torch.bool)]
    return {"mean_cos": float(off.mean()), "min_cos": float(off.min()), "max_cos": float(off.max())}


def random_means(num_classes: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``num_classes`` random unit vectors: the frozen random classifier of the paper's pilot."""
    return F.normalize(torch.randn(num_classes, dim, generator=generator), dim=1)


class FedCBHead(nn.Module):
    """Trainable ``Linear(d, D)`` -> L2 normalisation -> the frozen classifier ``(mu, sigma)``.

    ``mu`` and ``sigma`` are non-persistent buffers: no gradient, and not in the state dict,
    so they are never uploaded, aggregated or checkpointed (every party gets them from the
    server priors). In training mode the logits are
    ``T (h . mu_k) + T^2 / 2 sum_d h_d^2 sigma_k,d``; in eval mode
    ``h . mu_k + T / 2 sum_d h_d^2 sigma_k,d`` (eq. 5).
    """

    def __init__(self, in_dim: int, mu: torch.Tensor, sigma: torch.Tensor, temperature: float):
        super().__init__()
        if mu.shape != sigma.shape or mu.dim() != 2:
            raise ValueError(f"mu {tuple(mu.shape)} and sigma {tuple(sigma.shape)} must be (K, D)")
        self.proj = nn.Linear(in_dim, mu.shape[1])
        self.temperature = float(temperature)
        self.register_buffer("mu", mu.detach().float().clone(), persistent=False)
        self.register_buffer("sigma", sigma.detach().float().clone(), persistent=False)

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        """``h = Linear(features) / ||Linear(features)||``."""
        return F.normalize(self.proj(features), dim=1)

    def logits(self, h: torch.Tensor, training: bool) -> torch.Tensor:
        t = self.temperature
        dot, var = h @ self.mu.T, (h * h) @ self.sigma.T
        if training:
            return t * dot + 0.5 * t * t * var
        return dot + 0.5 * t * var

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.logits(self.embed(features), self.training)

    def variance_penalty(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``T^2 / 2 sum_d h_d^2 sigma_y,d`` per sample: the rest of the loss's upper bound."""
        return 0.5 * self.temperature**2 * ((h * h) * self.sigma[labels]).sum(dim=1)

    def extra_repr(self) -> str:
        return f"classes={self.mu.shape[0]}, dim={self.mu.shape[1]}, T={self.temperature}"
