"""The arithmetic of Fed-MAS (Elbatel et al. 2023), free of fedkit objects so it can be checked
by hand: the prior distance (Eq. 1), per-class means (Eq. 2) and the rescue factor (Eq. 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def projector(in_dim: int, hidden: int, out_dim: int) -> nn.Module:
    """``MLP(h) = Linear -> BN1d -> ReLU -> Linear``: the local feature in the prior's space."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, out_dim)
    )


def prior_distance(projection: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``L_f = 2 - 2 <y, y'>`` per sample, with ``y``, ``y'`` L2-normalised (Eq. 1)."""
    y = F.normalize(projection.float(), dim=1)
    y_prior = F.normalize(target.float(), dim=1)
    return 2.0 - 2.0 * (y * y_prior).sum(dim=1)


def add_per_class(
    sums: torch.Tensor, counts: torch.Tensor, values: torch.Tensor, labels: torch.Tensor
) -> None:
    """Accumulate ``values`` into per-class ``sums`` and sample ``counts`` (in place)."""
    sums.index_add_(0, labels, values.detach().to(sums.dtype))
    counts.index_add_(0, labels, torch.ones_like(labels, dtype=counts.dtype))


#: rescue-factor forms: the paper's Eq. 3 (raw, the default) and the authors' code
#: (normalised vectors)
NORMALISED, RAW = "normalised", "raw"


def rescue_factor(
    w: torch.Tensor, w_hat: torch.Tensor, present: torch.Tensor, form: str = RAW
) -> float:
    """The rescue factor over the ``present`` classes.

    ``w``: per-class mean distance of the received global model before training;
    ``w_hat``: the same during local training. ``form="raw"`` is the paper's Eq. 3,
    ``RF = sum_k w_k w_hat_k``: it grows with how far the client is from the prior overall.
    ``form="normalised"`` (the authors' code) normalises both vectors to sum to one over the
    classes the client has first, ``RF = sum_k (w_k / sum w) (w_hat_k / sum w_hat)``, which
    keeps only how the distance is spread over classes; a vector that is zero everywhere (a
    perfect match, in theory) counts as uniform.
    """
    if not bool(present.any()):
        raise ValueError("the client has no class with samples")
    if form == RAW:
        return float((w[present].double() * w_hat[present].double()).sum())
    if form != NORMALISED:
        raise ValueError(f"unknown rescue-factor form {form!r}")
    p, q = _distribution(w[present]), _distribution(w_hat[present])
    return float((p * q).sum())


def _distribution(values: torch.Tensor) -> torch.Tensor:
    values = values.double()
    total = values.sum()
    if total <= 0:
        return torch.full_like(values, 1.0 / len(values))
    return values / total
