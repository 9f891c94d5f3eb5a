"""Aggregation helpers shared by the built-in FedAvg and by method plugins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedkit_core.contract.messages import Arrays


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> Arrays:
    """``sum_k w_k * state_k`` per entry, with ``w`` normalised to sum to one.

    Integer entries (e.g. batch-norm ``num_batches_tracked``) are averaged in floating point
    and rounded back to their dtype.
    """
    if not states:
        raise ValueError("nothing to aggregate")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(
            f"aggregation weights must be non-negative with a positive sum, got {w.tolist()}"
        )
    w = w / w.sum()
    return {key: average_entry([s[key] for s in states], w) for key in states[0]}


def average_entry(values: Sequence[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """One entry's weighted mean; ``weights`` are already normalised.

    Equal values (an entry no client changed: a frozen layer, see ``freeze``) come back
    exactly, not with the last bits the float32 sum of ``w_k * value`` would change.
    """
    first = values[0]
    if all(torch.equal(v, first) for v in values[1:]):
        return first.detach().to("cpu", copy=True)
    acc = torch.zeros(
        first.shape, dtype=torch.float64 if first.dtype == torch.float64 else torch.float32
    )
    for value, weight in zip(values, weights.tolist()):
        acc.add_(value.to(acc.dtype), alpha=weight)
    if first.dtype.is_floating_point:
        return acc.to(first.dtype)
    return acc.round().to(first.dtype)
