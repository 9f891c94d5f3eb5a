"""APFL: each client mixes a personal model with the global one, and learns the mixture.

Deng, Kamani, Mahdavi. "Adaptive Personalized Federated Learning." arXiv:2003.13461, 2020,
Algorithm 1 (adaptive alpha, Section 3.3).

The global model ``w`` trains and is aggregated as in FedAvg. Each client also keeps a
personal model ``v`` (a private copy of the backbone and head, initialised from the first
global model it receives, never uploaded) and a mixing weight ``alpha`` in [0, 1]. On every
local batch the mixed model ``alpha v + (1 - alpha) w`` (parameters mixed, ``w`` detached, the
personal copy's own batch-norm statistics) is scored with the task loss: its gradient moves
``v`` by ``alpha`` times the mixed model's gradient and ``alpha`` by
``<v - w, gradient>``, Algorithm 1's two personal updates, in the same optimiser step as
``w``'s own (``alpha_lr`` scales alpha's learning rate). ``alpha`` is projected back into
[0, 1] at the start of each round and clamped where it is used. Clients are scored with the
mixture of their personal model and the received global model (view ``personal``); the
pooled ``global`` scope is the global model. ``learn_alpha=false`` keeps ``alpha`` fixed.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from fedkit_baselines.copies import ModelCopy
from fedkit_core.plugin import FedModel, Option, hookimpl

fedkit_api = 2

#: the model extra holding the personal model and alpha; state entries ``extras.apfl_mixed.*``
MIXED = "apfl_mixed"
VIEW = "personal"


class Mixture(nn.Module):
    """``alpha v + (1 - alpha) w`` as a model: ``v`` its own copy of the backbone and head,
    ``w`` the owning model's (read, never trained through this module)."""

    def __init__(self, model: FedModel, alpha: float, learn_alpha: bool):
        super().__init__()
        self.personal = ModelCopy(model)
        self.alpha = nn.Parameter(torch.tensor(float(alpha)), requires_grad=learn_alpha)
        # the global parts, not registered as submodules (they belong to the owning model)
        self.__dict__["owner"] = model

    def mixed_parameters(self) -> dict[str, torch.Tensor]:
        alpha = self.alpha.clamp(0.0, 1.0)
        owner = dict(self.owner.named_parameters())
        return {
            name: alpha * v + (1 - alpha) * owner[name].detach()
            for name, v in self.personal.named_parameters()
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.personal, self.mixed_parameters(), (x,))


@hookimpl
def fedkit_options():
    return [
        Option(
            "alpha",
            float,
            0.5,
            "initial mixing weight alpha of the personal model",
            min=0.0,
            max=1.0,
        ),
        Option(
            "learn_alpha", bool, True, "learn alpha (the paper's adaptive APFL) or keep it fixed"
        ),
        Option(
            "alpha_lr", float, 1.0, "alpha's learning rate, as a multiple of the run's", min=0.0
        ),
    ]


@hookimpl
def fedkit_extend_model(model, ctx):
    """Each client gets a private mixture; the server's model has none."""
    if ctx.client_id is not None:
        opts = ctx.options()
        mixture = Mixture(model, opts["alpha"], opts["learn_alpha"])
        model.add_extra(MIXED, mixture, private=True, input="image")


@hookimpl
def fedkit_round_start(client):
    """Initialise ``v`` once from the global model; project ``alpha`` into [0, 1]."""
    mixture = client.model.extras[MIXED]
    if not client.state.get("initialised"):
        mixture.personal.load_from(client.model)
        client.state["initialised"] = True
    with torch.no_grad():
        mixture.alpha.clamp_(0.0, 1.0)


@hookimpl
def fedkit_param_groups(client):
    mixture = client.model.extras[MIXED]
    if not mixture.alpha.requires_grad:
        return None
    return [{"params": [mixture.alpha], "lr_scale": client.options()["alpha_lr"]}]


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    return {"apfl.personal": client.task_loss(batch, {"logits": outputs[MIXED]})}


@hookimpl
def fedkit_client_report(client):
    return {"apfl.alpha": float(client.model.extras[MIXED].alpha.detach().clamp(0.0, 1.0))}


@hookimpl
def fedkit_eval_views(client):
    return {VIEW: MIXED}


@hookimpl
def fedkit_client_view(client):
    return VIEW
