"""Ditto: a personal model per client, pulled towards the global model.

Reference: T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning
Through Personalization", ICML 2021.

The global model trains and is aggregated as in FedAvg. Each client also keeps a personal
model ``v_k`` (a private copy of the backbone and head, initialised from the first global
model it receives, never uploaded) trained on the same local batches with
``task_loss(v_k) + lambda/2 * ||v_k - w^t||^2``, where ``w^t`` is the global model received
this round. The two models have disjoint parameters, so one optimiser step updates each as
its own objective asks. Clients are scored with their personal model (view ``personal``);
the pooled ``global`` scope is the global model.
"""

from __future__ import annotations

import torch

from fedkit_baselines.copies import ModelCopy
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2

#: the model extra holding the personal model; state entries ``extras.ditto_personal.*``
PERSONAL = "ditto_personal"
VIEW = "personal"


@hookimpl
def fedkit_options():
    return [
        Option(
            "lambda",
            float,
            0.1,
            "weight of the proximal term lambda/2 * ||v_k - w^t||^2 pulling the personal "
            "model towards the received global model (the paper tunes it per data set)",
            min=0.0,
        )
    ]


@hookimpl
def fedkit_extend_model(model, ctx):
    """Each client gets a private personal model; the server's model has none."""
    if ctx.client_id is not None:
        model.add_extra(PERSONAL, ModelCopy(model), private=True, input="image")


@hookimpl
def fedkit_round_start(client):
    """Initialise the personal model once from the global one; keep this round's anchor."""
    model = client.model
    personal = model.extras[PERSONAL]
    if not client.state.get("initialised"):
        personal.load_from(model)
        client.state["initialised"] = True
    received = dict(model.named_parameters())
    client.scratch["anchor"] = {
        name: received[name].detach().clone() for name, _ in personal.named_parameters()
    }


def proximal(personal: torch.nn.Module, anchor: dict[str, torch.Tensor]) -> torch.Tensor:
    """``||v - w||^2`` over the personal model's parameters."""
    return sum(((p - anchor[n]) ** 2).sum() for n, p in personal.named_parameters())


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    personal = client.model.extras[PERSONAL]
    lam = client.options()["lambda"]
    return {
        "ditto.personal": client.task_loss(batch, {"logits": outputs[PERSONAL]}),
        "ditto.proximal": 0.5 * lam * proximal(personal, client.scratch["anchor"]),
    }


@hookimpl
def fedkit_eval_views(client):
    return {VIEW: PERSONAL}


@hookimpl
def fedkit_client_view(client):
    return VIEW
