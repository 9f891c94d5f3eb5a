"""FedBABU: train and share only the body; the head stays as initialised; fine-tune to
personalise.

Reference: J. Oh, S. Kim, S.-Y. Yun, "FedBABU: Towards Enhanced Representation for Federated
Image Classification", ICLR 2022.

The head (``model.head``) is initialised identically on every party (from the run's seed),
frozen, and never trained, uploaded or aggregated (it is private and equal everywhere, so
nothing needs sending). Local training and aggregation update only the body. At every
evaluation each client fine-tunes a copy of the received global model (body and head, the
paper's main setting, or the head only) on its training data for ``finetune_epochs`` and is
scored with it (view ``personal``); the pooled ``global`` scope is the global model with the
initial head.
"""

from __future__ import annotations

import torch

from fedkit_baselines.copies import ModelCopy
from fedkit_core.plugin import CLASSIFICATION, FedkitError, Option, derive_seed, hookimpl

fedkit_api = 2

#: the model extra holding the fine-tuned copy (eval only; private)
TUNED = "fedbabu_tuned"
VIEW = "personal"


@hookimpl
def fedkit_options():
    return [
        Option(
            "finetune_epochs",
            int,
            5,
            "epochs of fine-tuning on the client's training data before each evaluation "
            "(the paper's tau_f; 0 scores the global model itself)",
            min=0,
        ),
        Option(
            "finetune",
            str,
            "full",
            "what fine-tuning trains: full (body and head, the paper's main setting) or head",
            choices=("full", "head"),
        ),
        Option("finetune_lr", float, None, "fine-tuning learning rate (default: the run's lr)"),
    ]


@hookimpl
def fedkit_check(server):
    if server.task.kind != CLASSIFICATION:
        return f"fedbabu freezes a classification head; {server.task.name!r} is {server.task.kind}"
    return None


@hookimpl
def fedkit_extend_model(model, ctx):
    """The same random head on every party, frozen and kept off the wire."""
    if model.feature_dim is None:
        raise FedkitError(
            "fedbabu needs a model with a linear head on features (model.feature_dim)"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(ctx.config["seed"], "fedbabu.head"))
        for module in model.head.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    model.head.requires_grad_(False)
    model.mark_private("head")
    if ctx.client_id is not None:
        model.add_extra(TUNED, ModelCopy(model), private=True, input="image", eval_only=True)


@hookimpl
def fedkit_eval_views(client):
    """Fine-tune a copy of the received global model, then score the client with it."""
    opts = client.options()
    tuned = client.model.extras[TUNED]
    tuned.load_from(client.model)
    tuned.train()
    params = tuned.parameters() if opts["finetune"] == "full" else tuned.head.parameters()
    client.train(
        list(params),
        opts["finetune_epochs"],
        forward=tuned,
        lr=opts["finetune_lr"] or client.config["lr"],
        seed=derive_seed(client.config["seed"], "fedbabu.finetune", client.round, client.id),
    )
    return {VIEW: TUNED}


@hookimpl
def fedkit_client_view(client):
    return VIEW
