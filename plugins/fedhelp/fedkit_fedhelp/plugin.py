"""FedHelp's hooks: small and large clients, the small backbone as the only shared model.

Roles: a client is *large* when its id is in ``fedhelp.large_clients``, or, with
``fedhelp.large_min_size``, when its own training set has at least that many samples (each
client decides from its own size alone; nobody learns another client's size). All others
are *small*.

Model (the ``model`` key is the small architecture, ResNet-20 in the paper):

* every party: the small backbone is the shared, aggregated model (FedAvg); the task head
  ``head`` is private on every client (and absent from the global state), because the
  paper's uploaded models (small clients' surrogates, large clients' proxies) only share
  their feature extractor: their classification layers have different label spaces.
* small client: ``head`` is the private task head it serves; the surrogate head
  ``extras.fedhelp_surrogate`` (public label space) and the per-sample contribution-score
  logits ``extras.fedhelp_scores`` (P x M) are private too.
* large client: backbone + ``head`` is the proxy; the large model ``extras.fedhelp_large``
  (``fedhelp.large_model``: a built-in, timm or user model) is private and served.

Losses per batch (paper eqs. 1-7), on top of the task loss of ``logits``:

* small: ``lambda_r * [CE(surrogate(x_p), y_p) + lambda * KL(sum_m a_m F_m(x_p) ||
  softmax(surrogate(x_p)))]`` on a public batch, ``a = softmax(scores[p])``.
* large: proxy ``KL(large || proxy)``; large model ``task loss + lambda_f * KL(large || proxy)
  + lambda_b * KD_b`` (the ranking loss over the proxy's top-|Q| classes).

Evaluation: view ``served`` (small: private head; large: large model) scores the clients;
view ``small`` is every client's small-architecture model. There is no common model, so the
pooled ``global`` scope is empty; ``views.served.global`` pools what each client serves.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedkit_core.plugin import (
    CLASSIFICATION,
    FedkitError,
    Option,
    build_knowledge,
    build_model,
    fit_images,
    hookimpl,
    load_knowledge,
    load_public,
    save_knowledge,
)
from fedkit_fedhelp import losses

SURROGATE = "fedhelp_surrogate"
SCORES = "fedhelp_scores"
LARGE = "fedhelp_large"
SERVED, SMALL = "served", "small"


class Scores(nn.Module):
    """Learnable contribution-score logits, one row of M per public sample."""

    def __init__(self, samples: int, apis: int):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(samples, apis))


class Logits(nn.Module):
    """A FedModel used as one network: image -> logits (the large private model)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["logits"]


@hookimpl
def fedkit_options():
    return [
        Option("knowledge", str, "", "knowledge file (.npz) from `fedkit knowledge build`"),
        Option(
            "public",
            str,
            "",
            "public data (task name or .npz) to build the knowledge file on first use",
        ),
        Option("apis", "list[str]", [], "API specs to build the knowledge file on first use"),
        Option("large_clients", "list[str]", [], "ids of the large clients"),
        Option(
            "large_min_size",
            int,
            0,
            "instead of large_clients: a client with at least this many training samples is "
            "large (each client decides from its own size)",
            min=0,
        ),
        Option("large_model", str, "resnet110", "the large clients' private model"),
        Option("lambda_r", float, 0.1, "weight of the public-data term R (lambda_R)", min=0.0),
        Option("lambda_kl", float, 0.2, "weight of the API KL inside R (lambda)", min=0.0),
        Option("lambda_f", float, 1.0, "forward distillation weight (lambda_F)", min=0.0),
        Option("lambda_b", float, 0.2, "backward ranking distillation weight (lambda_B)", min=0.0),
        Option("top_q", int, 0, "|Q| of KD_b; 0: 3 multi-class, 1 binary", min=0),
    ]


@hookimpl
def fedkit_check(server):
    opts = server.options()
    problems = []
    if server.task.kind != CLASSIFICATION:
        problems.append(
            f"fedhelp needs a classification task; {server.task.name!r} is {server.task.kind}"
        )
    if not opts["knowledge"]:
        problems.append("fedhelp needs fedhelp.knowledge=FILE (see `fedkit knowledge build`)")
    if bool(opts["large_clients"]) == bool(opts["large_min_size"]):
        problems.append(
            "fedhelp needs exactly one of fedhelp.large_clients or fedhelp.large_min_size"
        )
    return problems or None


def is_large(ctx) -> bool:
    """This client's role (its own id or size only)."""
    opts = ctx.options()
    if opts["large_clients"]:
        return ctx.id in opts["large_clients"]
    return ctx.info.num_train >= opts["large_min_size"]


@hookimpl
def fedkit_server_priors(server):
    """Check the large ids; build the knowledge file once when it is missing."""
    opts = server.options()
    unknown = sorted(set(opts["large_clients"]) - set(server.task.client_ids))
    if unknown:
        raise FedkitError(
            f"fedhelp.large_clients names unknown clients {unknown}; the clients are "
            f"{server.task.client_ids}"
        )
    path = opts["knowledge"]
    if not Path(path).is_file() and opts["public"] and opts["apis"]:
        save_knowledge(build_knowledge(load_public(opts["public"]), opts["apis"]), path)
    return None


@hookimpl
def fedkit_client_priors(client):
    """Small clients: the public images (task size and channels) and the APIs' answers."""
    if is_large(client):
        return None
    knowledge = load_knowledge(client.options()["knowledge"])
    images = fit_images(knowledge.images, client.task.image_shape, client.task.in_channels)
    return {
        "fedhelp.public": images,
        "fedhelp.probs": torch.from_numpy(knowledge.probs),
        "fedhelp.labels": torch.from_numpy(knowledge.labels),
    }


@hookimpl
def fedkit_extend_model(model, ctx):
    model.mark_private("head")
    if ctx.client_id is None:
        return
    if is_large(ctx):
        large = build_model(ctx.task, ctx.options()["large_model"])
        model.add_extra(LARGE, Logits(large), private=True, input="image")
        return
    if model.feature_dim is None:
        raise FedkitError(
            "fedhelp adds a surrogate head on the features; the model has no feature_dim"
        )
    samples, apis, classes = ctx.priors["fedhelp.probs"].shape
    model.add_extra(SURROGATE, nn.Linear(model.feature_dim, classes), private=True, input="none")
    model.add_extra(SCORES, Scores(samples, apis), private=True, input="none")


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    return _large_terms(client, batch, outputs) if is_large(client) else _small_terms(client)


def _small_terms(client) -> dict[str, torch.Tensor]:
    """``lambda_r * R`` on one public batch drawn with the client's round generator."""
    opts, model, priors = client.options(), client.model, client.priors
    public = priors["fedhelp.public"]
    index = torch.randint(len(public), (client.config["batch_size"],), generator=client.rng)
    x = client.data.normalizer(public[index].to(client.device))
    logits = model.extras[SURROGATE](model.backbone(x))
    probs = priors["fedhelp.probs"][index].to(client.device)
    labels = priors["fedhelp.labels"][index].to(client.device)
    mixture = losses.api_mixture(model.extras[SCORES].logits[index.to(client.device)], probs)
    r = losses.surrogate_loss(logits, labels, mixture, opts["lambda_kl"])
    return {"fedhelp.public": opts["lambda_r"] * r}


def _large_terms(client, batch, outputs) -> dict[str, torch.Tensor]:
    """Proxy: ``KL(large || proxy)``; large: its task loss, ``lambda_f KD_f``, ``lambda_b KD_b``."""
    opts = client.options()
    proxy, large = outputs["logits"], outputs[LARGE]
    top = opts["top_q"] or (3 if client.task.num_classes > 2 else 1)
    return {
        "fedhelp.proxy_kd": losses.kl(large.detach(), proxy),
        "fedhelp.large_task": client.task_loss(batch, {"logits": large}),
        "fedhelp.kd_f": opts["lambda_f"] * losses.kl(large, proxy.detach()),
        "fedhelp.kd_b": opts["lambda_b"] * losses.ranking_loss(large, proxy, top),
    }


@hookimpl
def fedkit_eval_views(client):
    """No common model (``global`` removed); ``served`` and every client's ``small`` model."""
    return {"global": None, SERVED: LARGE if is_large(client) else "logits", SMALL: "logits"}


@hookimpl
def fedkit_client_view(client):
    return SERVED
