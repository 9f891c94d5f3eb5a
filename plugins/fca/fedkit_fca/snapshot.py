"""A frozen copy of a client's locally trained model, for the authors' specialisation protocol.

The authors' code scores specialisation with each client's model right after local training,
before aggregation, through its federated head. fedkit's evaluation runs on the received
global model, so FCA keeps that local model as a private, frozen model extra: captured after
every local training (``fedkit_client_report``), evaluated on the image like any extra, never
trained, uploaded or aggregated.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class LocalSnapshot(nn.Module):
    """Backbone and federated head as the client last trained them (frozen)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.backbone = copy.deepcopy(model.backbone).requires_grad_(False)
        self.head = copy.deepcopy(model.head).requires_grad_(False)

    @torch.no_grad()
    def capture(self, model: nn.Module) -> None:
        """Copy the model's current backbone and federated head into the snapshot."""
        self.backbone.load_state_dict(model.backbone.state_dict())
        self.head.load_state_dict(model.head.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """The local model's logits; nothing while training (the snapshot is not trained,
        and skipping it keeps a training step as cheap as without the snapshot)."""
        if self.training:
            return None
        return self.head(self.backbone(x))
