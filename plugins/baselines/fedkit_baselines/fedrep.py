"""FedRep: a shared representation, a personal head per client.

Reference: L. Collins, H. Hassani, A. Mokhtari, S. Shakkottai, "Exploiting Shared
Representations for Personalized Federated Learning", ICML 2021.

The head (``model.head``) is private on every party: never uploaded, aggregated or in the
global state; each client keeps its own across rounds. Each round a client first trains its
head for ``head_epochs`` epochs with the received body fixed, then the body for
``local_epochs`` epochs with its head fixed; only the body goes up and is averaged (the
built-in FedAvg, or any aggregation plugin). Clients are scored with their own head on the
global body (view ``personal``); there is no global model, so the pooled ``global`` scope
is empty.
"""

from __future__ import annotations

from fedkit_core.plugin import CLASSIFICATION, FedkitError, Option, hookimpl

fedkit_api = 2

VIEW = "personal"


@hookimpl
def fedkit_options():
    return [
        Option(
            "head_epochs",
            int,
            10,
            "local epochs training the head (body fixed) before the local_epochs training "
            "the body (head fixed); the paper uses 10",
            min=0,
        )
    ]


@hookimpl
def fedkit_check(server):
    if server.task.kind != CLASSIFICATION:
        return (
            f"fedrep personalises a classification head; {server.task.name!r} is {server.task.kind}"
        )
    return None


@hookimpl
def fedkit_extend_model(model, ctx):
    """The head stays on its party (the server's model has none in its global state)."""
    if model.feature_dim is None:
        raise FedkitError("fedrep needs a model with a linear head on features (model.feature_dim)")
    model.mark_private("head")


@hookimpl
def fedkit_round_start(client):
    """The head epochs: the head trains alone on the received body's (detached) features,
    then it is frozen for the body epochs of the core's training loop."""
    model = client.model
    head = model.head
    model.train()
    head.requires_grad_(True)
    client.train(
        list(head.parameters()),
        client.options()["head_epochs"],
        forward=lambda x: head(model.backbone(x).detach()),
    )
    head.requires_grad_(False)


@hookimpl
def fedkit_eval_views(client):
    return {"global": None, VIEW: "logits"}


@hookimpl
def fedkit_client_view(client):
    return VIEW
