"""FedProx: a proximal term keeping each client's weights near the received global model."""

from __future__ import annotations

import torch

from fedkit_core import Option, hookimpl

__version__ = "0.1.0"
NAME = "fedprox"


@hookimpl
def fedkit_options():
    return [Option("mu", float, 0.01, "weight of the proximal term mu/2 * ||w - w_global||^2")]


@hookimpl
def fedkit_round_start(client):
    """Remember the received global weights for this round's proximal term."""
    params = {n: p.detach().clone() for n, p in client.model.named_parameters() if p.requires_grad}
    client.plugin_state(NAME)["global"] = params


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    mu = client.options(NAME)["mu"]
    anchor = client.plugin_state(NAME)["global"]
    squared = sum(
        ((p - anchor[n]) ** 2).sum() for n, p in client.model.named_parameters() if n in anchor
    )
    return {f"{NAME}.proximal": 0.5 * mu * torch.as_tensor(squared)}


@hookimpl
def fedkit_client_report(client):
    """Drop the round's copy of the global weights: it must not be checkpointed."""
    client.plugin_state(NAME).pop("global", None)
