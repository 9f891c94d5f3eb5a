"""Copies of the received global weights, for methods that pull towards or compare with them
(FedProx's proximal term, MOON's global representation, q-FedAvg's update norm)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from fedkit_core.plugin import FedModel


def shared_parameters(model: FedModel) -> dict[str, torch.Tensor]:
    """Detached copies of the trainable parameters that are uploaded (private ones left out).

    Called in ``fedkit_round_start``, when the model holds the received global weights.
    """
    return {
        name: p.detach().clone()
        for name, p in model.named_parameters()
        if p.requires_grad and not model.is_private(name)
    }


def squared_distance(model: nn.Module, anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``sum ||w - anchor||^2`` over the anchor's entries; differentiable in the model."""
    params = dict(model.named_parameters())
    total = torch.zeros((), device=next(iter(params.values())).device)
    for name, value in anchor.items():
        total = total + ((params[name] - value) ** 2).sum()
    return total


def state_under(model: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """Detached copies of the state entries (parameters and buffers) under ``prefix``,
    named relative to it."""
    start = prefix + "."
    return {
        k[len(start) :]: v.detach().clone()
        for k, v in model.state_dict().items()
        if k.startswith(start)
    }


@contextmanager
def evaluating(*modules: nn.Module) -> Iterator[None]:
    """Put modules in eval mode (batch norm uses, and does not update, its running
    statistics) and restore every submodule's own mode afterwards."""
    modes = [(m, m.training) for module in modules for m in module.modules()]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
