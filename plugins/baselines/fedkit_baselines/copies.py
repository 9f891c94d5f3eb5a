"""A client-side copy of the model's backbone and head, for the personalised methods.

Ditto keeps a personal model beside the global one, FedBABU fine-tunes a copy of the
received global model before evaluating it. The copy's state entries are named like the
model's (``backbone.*``, ``head.*``), so weights move between them by name.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedkit_core.plugin import FedModel


class ModelCopy(nn.Module):
    """``head(backbone(x))`` with its own weights, built as a deep copy of a model's parts."""

    def __init__(self, model: FedModel):
        super().__init__()
        self.backbone = copy.deepcopy(model.backbone)
        self.head = copy.deepcopy(model.head)
        for p in self.parameters():
            p.requires_grad_(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    @torch.no_grad()
    def load_from(self, model: FedModel) -> None:
        """Copy the model's current backbone and head weights (and buffers) into this copy."""
        source = model.state_dict()
        for name, value in self.state_dict().items():
            value.copy_(source[name])
