"""Client-level DP (DP-FedAvg, McMahan et al. 2018) with fixed or adaptive clipping
(Andrew et al. 2021), as pure functions of tensors.

Each client's update ``delta_k = x_k - g`` (its floating-point shared entries; integer
counters such as batch norm's ``num_batches_tracked`` keep the global value) is clipped to L2
norm ``C`` on the client. The server adds Gaussian noise of std ``sigma * C`` to the sum of
the clipped updates and divides by a public denominator: the expected number of clients
(Poisson sampling: ``q * N``) or the fixed sample size. Adaptive clipping also sums, with
noise of std ``sigma_b``, one bit per client (``||delta_k|| <= C``) and moves ``C``
geometrically towards the ``target_quantile`` of the norms; the update's noise multiplier is
then ``(sigma^-2 - (2 sigma_b)^-2)^-1/2`` so that both releases together cost what a single
Gaussian mechanism of multiplier ``sigma`` costs (Andrew et al., Theorem 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from fedkit_core.contract.messages import Arrays
from fedkit_core.errors import FedkitError


def floating(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The entries DP covers: the floating-point ones, in order."""
    return [k for k, v in state.items() if v.dtype.is_floating_point]


def update_norm(delta: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of an update over all its entries (in float64)."""
    total = sum(float(v.double().pow(2).sum()) for v in delta.values())
    return math.sqrt(total)


def clip_update(
    received: Mapping[str, torch.Tensor], trained: Mapping[str, torch.Tensor], clip: float
) -> tuple[Arrays, bool]:
    """``trained`` with its update from ``received`` clipped to norm ``clip`` (integer
    entries reset to ``received``'s), and whether the update was within the norm."""
    names = floating(received)
    delta = {k: trained[k].double() - received[k].double() for k in names}
    norm = update_norm(delta)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    out = {k: v.clone() for k, v in received.items()}
    for k in names:
        out[k] = (received[k].double() + scale * delta[k]).to(received[k].dtype)
    return out, norm <= clip


def update_noise_multiplier(sigma: float, count_sigma: float | None) -> float:
    """The noise multiplier of the updates: ``sigma`` with fixed clipping; with adaptive
    clipping, what is left of ``sigma`` for them once the count's noise ``count_sigma`` is
    paid (Andrew et al. 2021, Theorem 1)."""
    if count_sigma is None or sigma == 0:
        return sigma
    if count_sigma <= sigma / 2:
        raise FedkitError(
            f"adaptive clipping needs dp.count_noise above half the noise multiplier "
            f"({sigma / 2:.4g}); got {count_sigma:.4g}"
        )
    return (sigma**-2 - (2 * count_sigma) ** -2) ** -0.5


def noisy_mean(
    global_state: Mapping[str, torch.Tensor],
    clipped: Sequence[Mapping[str, torch.Tensor]],
    noise_std: float,
    denominator: float,
    generator: torch.Generator,
) -> Arrays:
    """``g + (sum_k (x_k - g) + N(0, noise_std^2)) / denominator`` on the floating entries
    (in float64, noise drawn from ``generator`` entry by entry in order); integer entries
    keep ``g``'s value."""
    total = {}
    for k in floating(global_state):
        g = global_state[k].double()
        total[k] = torch.zeros_like(g)
        for state in clipped:
            total[k] += state[k].double() - g
    return noisy_mean_of_sum(global_state, total, noise_std, denominator, generator)


def noisy_mean_of_sum(
    global_state: Mapping[str, torch.Tensor],
    total: Mapping[str, torch.Tensor],
    noise_std: float,
    denominator: float,
    generator: torch.Generator,
) -> Arrays:
    """:func:`noisy_mean` from the sum of the updates ``total`` (what secure aggregation
    gives the server). Batch norm's variances (``*running_var``) are clamped at 0 after the
    noise: post-processing, so free of privacy cost, and without it a variance the noise
    made negative turns every activation after that layer into NaN."""
    out = {k: v.clone() for k, v in global_state.items()}
    for k in floating(global_state):
        g = global_state[k].double()
        noise = torch.randn(g.shape, generator=generator, dtype=torch.float64)
        summed = total[k].double().reshape(g.shape)
        mean = g + (summed + noise_std * noise) / denominator
        if k.endswith("running_var"):
            mean = mean.clamp(min=0.0)
        out[k] = mean.to(global_state[k].dtype)
    return out


def adapt_clip(
    clip: float,
    unclipped: float,
    count_std: float,
    denominator: float,
    quantile: float,
    lr: float,
    generator: torch.Generator,
) -> tuple[float, float]:
    """The next clipping norm from the number of ``unclipped`` updates: the noisy fraction
    ``b = (unclipped + N(0, count_std^2)) / denominator``, then ``C exp(-lr (b - quantile))``
    (Andrew et al. 2021, Algorithm 1). Returns the norm and ``b``."""
    noise = float(torch.randn((), generator=generator, dtype=torch.float64))
    fraction = (unclipped + count_std * noise) / denominator
    return clip * math.exp(-lr * (fraction - quantile)), fraction
