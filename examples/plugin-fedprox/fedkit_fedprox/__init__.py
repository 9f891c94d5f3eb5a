"""FedProx: a proximal term keeping each client's weights near the received global model."""

from __future__ import annotations

import torch

from fedkit_core.plugin import Option, hookimpl

__version__ = "0.2.0"
fedkit_api = 2


@hookimpl
def fedkit_options():
    return [
        Option("mu", float, 0.01, "weight of the proximal term mu/2 * ||w - w_global||^2", min=0.0)
    ]


@hookimpl
def fedkit_round_start(client):
    """Remember the received global weights for this round's proximal term (in the round's
    scratch: emptied when the next round starts, never checkpointed)."""
    client.scratch["global"] = {
        n: p.detach().clone() for n, p in client.model.named_parameters() if p.requires_grad
    }


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    mu = client.options()["mu"]
    anchor = client.scratch["global"]
    squared = sum(
        ((p - anchor[n]) ** 2).sum() for n, p in client.model.named_parameters() if n in anchor
    )
    return {"fedprox-example.proximal": 0.5 * mu * torch.as_tensor(squared)}
