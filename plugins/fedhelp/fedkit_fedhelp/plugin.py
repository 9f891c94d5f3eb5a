"""FedHelp's hooks: small and large clients, the small backbone as the only shared model.

Roles (:mod:`fedkit_fedhelp.roles`): ``fedhelp.large_clients`` (ids), ``fedhelp.num_large``
(the N largest, ranked by the server from the sizes FedAvg already receives; each client
learns only its own role) or ``fedhelp.large_min_size`` (each client from its own size).

Model (the ``model`` key is the small architecture, ResNet-20 in the paper; a U-Net with
``unet_channels`` for segmentation):

* every party: the small backbone is the shared, aggregated model (FedAvg); the task head
  ``head`` is private on every client (and absent from the global state), because the
  paper's uploaded models (small clients' surrogates, large clients' proxies) only share
  their feature extractor: their classification layers have different label spaces. (The
  U-Net's head is the identity: the whole small U-Net is shared.)
* small client: ``head`` is the private task head it serves; the surrogate head
  ``extras.fedhelp_surrogate`` (public label space; a 1x1 convolution on the U-Net's
  per-pixel scores for segmentation) and the per-sample contribution-score logits
  ``extras.fedhelp_scores`` (P x M) are private too.
* large client: backbone + ``head`` is the proxy; the large model ``extras.fedhelp_large``
  (``fedhelp.large_model``: a built-in, timm or user model; a U-Net with
  ``fedhelp.large_unet_channels`` for segmentation) is private and served.

Losses per batch (paper eqs. 1-7; appendix A, eqs. 8-13, per pixel for segmentation):

* small: ``lambda_r * [CE(surrogate(x_p), y_p) + lambda * KL(sum_m a_m F_m(x_p) ||
  softmax(surrogate(x_p)))]`` on a public batch, ``a = softmax(scores[p])``.
* large: proxy ``KL(large || proxy)``; large model ``task loss + lambda_f * KL(large || proxy)
  + lambda_b * KD_b`` (the ranking loss over the proxy's top-|Q| classes).
* segmentation: the task loss is the per-pixel CE weighted by the U-Net weight map of the
  mask (eq. 11, ``fedkit_core.losses.weight_maps``), and so is R (eq. 8, with the public
  masks' maps); KD_f and KD_b are plain per-pixel means (eqs. 12-13).

Evaluation: view ``served`` (small: private head; large: large model) scores the clients;
view ``small`` is every client's small-architecture model. There is no common model, so the
pooled ``global`` scope is empty; ``views.served.global`` pools what each client serves.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core.plugin import (
    INDIVIDUAL,
    SEGMENTATION,
    Channel,
    FedkitError,
    Option,
    build_knowledge,
    build_model,
    fit_images,
    hookimpl,
    load_knowledge,
    load_public,
    save_knowledge,
    weight_maps,
)
from fedkit_fedhelp import losses, roles
from fedkit_fedhelp.roles import LARGE, is_large

SURROGATE = "fedhelp_surrogate"
SCORES = "fedhelp_scores"
SERVED, SMALL = "served", "small"


class Scores(nn.Module):
    """Learnable contribution-score logits, one row of M per public sample."""

    def __init__(self, samples: int, apis: int):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(samples, apis))


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
            "num_large",
            int,
            0,
            "instead of large_clients: the N clients with the most training samples are large "
            "(ranked by the server from the sizes of their first updates)",
            min=0,
        ),
        Option(
            "large_min_size",
            int,
            0,
            "instead of large_clients: a client with at least this many training samples is "
            "large (each client decides from its own size)",
            min=0,
        ),
        Option(
            "large_model",
            str,
            "auto",
            "the large clients' private model (auto: resnet110, or a U-Net for segmentation)",
        ),
        Option(
            "large_unet_channels",
            "list[int]",
            [32, 64, 128, 256],
            "channels of the large U-Net (segmentation)",
        ),
        Option("lambda_r", float, 0.1, "weight of the public-data term R (lambda_R)", min=0.0),
        Option("lambda_kl", float, 0.2, "weight of the API KL inside R (lambda)", min=0.0),
        Option("lambda_f", float, 1.0, "forward distillation weight (lambda_F)", min=0.0),
        Option("lambda_b", float, 0.2, "backward ranking distillation weight (lambda_B)", min=0.0),
        Option("top_q", int, 0, "|Q| of KD_b; 0: 3 multi-class, 1 binary", min=0),
        Option("w0", float, 10.0, "segmentation: weight of the maps' border term", min=0.0),
        Option("sigma", float, 5.0, "segmentation: width of the maps' border term", min=1e-6),
    ]


@hookimpl
def fedkit_check(server):
    opts = server.options()
    problems = roles.check(opts)
    if not opts["knowledge"]:
        problems.append("fedhelp needs fedhelp.knowledge=FILE (see `fedkit knowledge build`)")
    return problems or None


@hookimpl
def fedkit_server_priors(server):
    """Check the roles' settings; build the knowledge file once when it is missing."""
    roles.check_ids(server)
    opts = server.options()
    path = opts["knowledge"]
    if not Path(path).is_file() and opts["public"] and opts["apis"]:
        save_knowledge(build_knowledge(load_public(opts["public"]), opts["apis"]), path)
    return None


@hookimpl
def fedkit_client_priors(client):
    """Small clients (and clients whose role is not known yet): the public images (task
    size and channels), the APIs' answers and the public labels (masks)."""
    if roles.known_at_setup(client):
        return None
    knowledge = load_knowledge(client.options()["knowledge"])
    segmentation = client.task.kind == SEGMENTATION
    if knowledge.segmentation != segmentation:
        raise FedkitError(
            f"the knowledge file {client.options()['knowledge']} is for "
            f"{'segmentation' if knowledge.segmentation else 'classification'}; the task is "
            f"{client.task.kind}"
        )
    size = client.task.image_shape
    priors = {
        "fedhelp.public": fit_images(knowledge.images, size, client.task.in_channels),
        "fedhelp.probs": torch.from_numpy(knowledge.probs),
        "fedhelp.labels": torch.from_numpy(knowledge.labels),
    }
    if segmentation and tuple(knowledge.labels.shape[1:]) != tuple(size):
        priors["fedhelp.probs"] = _resize_maps(priors["fedhelp.probs"], size)
        masks = priors["fedhelp.labels"][:, None].float()
        priors["fedhelp.labels"] = F.interpolate(masks, size=tuple(size), mode="nearest")[:, 0].to(
            torch.int16
        )
    return priors


def _resize_maps(probs: torch.Tensor, size) -> torch.Tensor:
    """Per-pixel probabilities (P, M, K, H, W) resized (bilinear) to ``size``, in chunks."""
    m, k = probs.shape[1:3]
    out = [
        F.interpolate(chunk.float().flatten(0, 1), size=tuple(size), mode="bilinear")
        .view(len(chunk), m, k, *size)
        .half()
        for chunk in probs.split(64)
    ]
    return torch.cat(out)


@hookimpl
def fedkit_extend_model(model, ctx):
    model.mark_private("head")
    if ctx.client_id is None:
        return
    role = roles.known_at_setup(ctx)
    if role is not False:  # large, or possibly large later (num_large)
        model.add_extra(
            LARGE, roles.Gated(_large_model(ctx), bool(role)), private=True, input="image"
        )
    if role is True:
        return
    samples, apis, classes = ctx.priors["fedhelp.probs"].shape[:3]
    model.add_extra(SURROGATE, _surrogate(model, ctx, classes), private=True, input="none")
    model.add_extra(SCORES, Scores(samples, apis), private=True, input="none")


def _large_model(ctx) -> nn.Module:
    opts = ctx.options()
    name = opts["large_model"]
    if ctx.task.kind == SEGMENTATION:
        name = "unet" if name == "auto" else name
        return build_model(ctx.task, name, unet_channels=tuple(opts["large_unet_channels"]))
    return build_model(ctx.task, "resnet110" if name == "auto" else name)


def _surrogate(model, ctx, classes: int) -> nn.Module:
    """The public-label head: Linear on the features, or a 1x1 convolution on the U-Net's
    per-pixel scores (identity at start when the label spaces have the same size)."""
    if ctx.task.kind != SEGMENTATION:
        if model.feature_dim is None:
            raise FedkitError(
                "fedhelp adds a surrogate head on the features; the model has no feature_dim"
            )
        return nn.Linear(model.feature_dim, classes)
    conv = nn.Conv2d(ctx.task.num_classes, classes, 1)
    if classes == ctx.task.num_classes:
        with torch.no_grad():
            conv.weight.copy_(torch.eye(classes).view(classes, classes, 1, 1))
            conv.bias.zero_()
    return conv


@hookimpl
def fedkit_round_start(client):
    roles.receive(client)


@hookimpl
def fedkit_configure_fit(server, client_id):
    return roles.role_payload(server, client_id)


@hookimpl
def fedkit_channels(server):
    """With ``num_large`` the server ranks the clients by the sizes their updates report."""
    if not server.options()["num_large"]:
        return None
    return [
        Channel(
            "fedhelp.sizes",
            "each client's training-set size (num_examples), ranked by "
            "the server to pick the large clients",
            kind=INDIVIDUAL,
        )
    ]


@hookimpl
def fedkit_aggregate(server, updates, ask):
    """FedAvg (the built-in, by returning None); with ``num_large`` the server keeps the
    sizes the updates report to rank them."""
    roles.record_sizes(server, updates)
    return None


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    """Segmentation: the per-pixel CE weighted by the masks' U-Net weight maps (eq. 11)."""
    if client.task.kind != SEGMENTATION:
        return None
    return losses.weighted_ce(outputs["logits"], batch.y, _weights(client, batch.y))


def _weights(client, masks: torch.Tensor) -> torch.Tensor:
    opts = client.options()
    return weight_maps(masks, opts["w0"], opts["sigma"])


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
    probs = priors["fedhelp.probs"][index].to(client.device).float()
    labels = priors["fedhelp.labels"][index].to(client.device).long()
    weight = _weights(client, labels) if client.task.kind == SEGMENTATION else None
    mixture = losses.api_mixture(model.extras[SCORES].logits[index.to(client.device)], probs)
    r = losses.surrogate_loss(logits, labels, mixture, opts["lambda_kl"], weight)
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
