"""MOON: model-contrastive learning between the local, global and previous local models.

Li, He, Song. "Model-Contrastive Federated Learning." CVPR 2021 (code: QinbinLi/MOON).

The network is the paper's base encoder -> projection head -> output layer: the built-in
linear head is replaced by a two-layer projection MLP (``d -> d -> projection_dim``) and a
linear output layer on the projection ``z`` (all shared and averaged). Each client adds

    mu * -log( exp(sim(z, z_glob)/T) / (exp(sim(z, z_glob)/T) + exp(sim(z, z_prev)/T)) )

to its cross-entropy, with ``sim`` the cosine similarity, ``z_glob`` the projection of the
same batch by the received global model and ``z_prev`` by the client's previous local model
(both frozen, in eval mode). The previous local model (its encoder and projection) is kept
in the client's own state, never sent; a client training for the first time uses the global
model, as the authors' code does. Classification only; aggregation unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedkit_baselines.anchors import evaluating, state_under
from fedkit_core.plugin import CLASSIFICATION, FedkitError, Option, hookimpl

fedkit_api = 2

#: the state entries that make a projection: encoder and projection MLP
ENCODER, PROJECTION = "backbone", "head.projection"


@hookimpl
def fedkit_options():
    return [
        Option("mu", float, 1.0, "weight of the model-contrastive term", min=0.0),
        Option("temperature", float, 0.5, "temperature T of the contrastive term", min=1e-6),
        Option("projection_dim", int, 256, "output size of the projection head", min=1),
    ]


@hookimpl
def fedkit_check(server):
    if server.task.kind != CLASSIFICATION:
        return f"moon needs a classification task; {server.task.name!r} is {server.task.kind}"
    return None


class ProjectedClassifier(nn.Module):
    """MOON's projection head (``Linear, ReLU, Linear``) followed by the output layer."""

    def __init__(self, in_features: int, projection_dim: int, num_classes: int):
        super().__init__()
        self.projection = nn.Sequential(
            nn.Linear(in_features, in_features),
            nn.ReLU(),
            nn.Linear(in_features, projection_dim),
        )
        self.output = nn.Linear(projection_dim, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.output(self.projection(features))


@hookimpl
def fedkit_extend_model(model, ctx):
    """Put the projection head under the classifier (server and clients alike)."""
    if type(model.head) is not nn.Linear or model.feature_dim is None:
        raise FedkitError(
            "moon puts a projection head under the built-in linear classifier, but the head "
            f"is a {type(model.head).__name__} (another plugin replaced it); run them separately"
        )
    opts = ctx.options()
    model.head = ProjectedClassifier(
        model.feature_dim, opts["projection_dim"], ctx.task.num_classes
    )


def encoder_state(model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """Copies of the encoder and projection entries (what ``project`` needs)."""
    return {part: state_under(model, part) for part in (ENCODER, PROJECTION)}


def project(model: nn.Module, state: dict[str, dict[str, torch.Tensor]], x: torch.Tensor):
    """The projection ``z`` of ``x`` by ``model``'s architecture with the weights ``state``,
    frozen (no gradient, eval mode); ``model``'s own weights are untouched."""
    with torch.no_grad(), evaluating(model):
        h = functional_call(model.backbone, state[ENCODER], (x,))
        return functional_call(model.head.projection, state[PROJECTION], (h,))


def contrastive(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The batch mean of ``-log(e^(s_g/T) / (e^(s_g/T) + e^(s_p/T)))``, ``s`` cosine
    similarities of ``z`` to the global and previous projections."""
    sims = torch.stack(
        [F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1
    )
    return F.cross_entropy(
        sims / temperature, torch.zeros(len(z), dtype=torch.long, device=z.device)
    )


@hookimpl
def fedkit_round_start(client):
    """Keep the received global encoder and the previous local one for this round."""
    client.scratch["global"] = encoder_state(client.model)
    previous = client.state.get("previous")
    client.scratch["previous"] = (
        {
            part: {k: v.to(client.device) for k, v in entries.items()}
            for part, entries in previous.items()
        }
        if previous is not None
        else client.scratch["global"]
    )


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    opts = client.options()
    model = client.model
    z = model.head.projection(outputs["features"])
    z_glob = project(model, client.scratch["global"], batch.x)
    z_prev = project(model, client.scratch["previous"], batch.x)
    return {"moon.contrastive": opts["mu"] * contrastive(z, z_glob, z_prev, opts["temperature"])}


@hookimpl
def fedkit_client_report(client):
    """Keep the locally trained encoder as next round's previous model (on the client only)."""
    client.state["previous"] = {
        part: {k: v.cpu() for k, v in entries.items()}
        for part, entries in encoder_state(client.model).items()
    }
    return None
