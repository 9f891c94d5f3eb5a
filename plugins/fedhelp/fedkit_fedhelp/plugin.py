"""FedHelp's hooks: small and large clients, the small model as the only shared model.

Roles (:mod:`fedkit_fedhelp.roles`): ``fedhelp.large_clients`` (ids), ``fedhelp.num_large``
(the N largest, ranked by the server from the sizes FedAvg already receives; each client
learns only its own role) or ``fedhelp.large_min_size`` (each client from its own size).

Model (the ``model`` key is the small architecture, ResNet-20 in the paper; a U-Net with
``unet_channels`` for segmentation):

* every party: the whole small model, backbone and task ``head``, is the shared model,
  uploaded and averaged by FedAvg (paper section 3.5 and Algorithm 1: the small clients'
  models and the large clients' proxies are uploaded and aggregated, and every client starts
  each round from the global model).
* small client: the surrogate head ``extras.fedhelp_surrogate`` (the auxiliary model's
  public-label layer on the shared backbone; a 1x1 convolution on the U-Net's per-pixel
  scores for segmentation) and the per-sample contribution-score logits
  ``extras.fedhelp_scores`` (P x M) are private: they never leave the client.
* large client: the small model is the proxy; the large model ``extras.fedhelp_large``
  (``fedhelp.large_model``, built by the core's model builder with
  ``fedhelp.large_pretrained``: a built-in, timm or user model; a U-Net with
  ``fedhelp.large_unet_channels`` for segmentation) is private and served.

Losses per batch (paper eqs. 1-7; appendix A, eqs. 8-13, per pixel for segmentation):

* small (eq. 3): the task loss on the small model + ``lambda_l * R`` on a public batch, with
  (eq. 1) ``R = CE(surrogate(x_p), y_p) + lambda_r * KL(sum_m a_m F_m(x_p) ||
  softmax(surrogate(x_p)))``, ``a = softmax(scores[p])``.
* large (eq. 7, each term's gradient to the model it teaches): the proxy's task loss +
  ``lambda_f * KL(large || proxy)`` (KD_f, large detached: it trains the proxy only); the
  large model's task loss + ``lambda_b * KD_b`` (the ranking loss over the proxy's top-|Q|
  classes, proxy detached).
* segmentation: the task loss is the per-pixel CE weighted by the U-Net weight map of the
  mask (eq. 11, ``fedkit_core.losses.weight_maps``), and so is R (eq. 8, with the public
  masks' maps); KD_f and KD_b are plain per-pixel means (eqs. 12-13).

Optimiser: the contribution scores form their own parameter group (``fedkit_param_groups``)
with the learning rate ``fedhelp.score_lr``: each score row is a per-sample parameter whose
gradient is scaled by ``lambda_l * lambda_r / batch_size``, far too small for the network's
rate to move it.

Evaluation: the built-in ``global`` view (the received, averaged small model) is scored on
every client and pooled; view ``served`` scores the clients with what each serves (small:
the global small model it holds at the end of the round; large: its large model).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from fedkit_priors import build_knowledge, fit_images, load_knowledge, load_public, save_knowledge
from torch import nn

from fedkit_core.plugin import (
    INDIVIDUAL,
    SEGMENTATION,
    Channel,
    FedkitError,
    Option,
    build_model,
    hookimpl,
    weight_maps,
)
from fedkit_fedhelp import losses, roles
from fedkit_fedhelp.bnstats import running_stats_kept
from fedkit_fedhelp.roles import LARGE, is_large

SURROGATE = "fedhelp_surrogate"
SCORES = "fedhelp_scores"
SERVED = "served"
#: ``fedhelp.score_lr`` left empty, SGD: the rate that moves a score row, at each visit, by
#: this much times its per-sample gradient of ``KL`` (momentum included)
SCORE_STEP = 1.0
#: ``fedhelp.score_lr`` left empty, Adam/AdamW (whose steps do not scale with the gradient)
ADAM_SCORE_LR = 0.1


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
            "large_pretrained",
            bool,
            False,
            "build the large model with its pretrained weights (the core model builder's "
            "`pretrained`, as the `model` and `pretrained` keys do for the small model)",
        ),
        Option(
            "large_unet_channels",
            "list[int]",
            [32, 64, 128, 256],
            "channels of the large U-Net (segmentation)",
        ),
        Option("lambda_r", float, 0.1, "lambda_R: weight of the API KL inside R (eq. 1)", min=0.0),
        Option("lambda_l", float, 0.2, "lambda_l: weight of R in the small loss (eq. 3)", min=0.0),
        Option(
            "score_lr",
            float,
            None,
            "learning rate of the contribution-score logits (their own optimiser group; "
            "follows the lr schedule); empty: batch_size * (1 - momentum) / (lambda_l * "
            "lambda_r) with SGD, 0.1 with Adam/AdamW",
            min=0.0,
        ),
        Option("lambda_f", float, 1.0, "lambda_F: weight of KD_f on the proxy (eq. 7)", min=0.0),
        Option(
            "lambda_b", float, 0.2, "lambda_B: weight of KD_b on the large model (eq. 7)", min=0.0
        ),
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
    pretrained = opts["large_pretrained"]
    if ctx.task.kind == SEGMENTATION:
        name = "unet" if name == "auto" else name
        channels = tuple(opts["large_unet_channels"])
        return build_model(ctx.task, name, pretrained=pretrained, unet_channels=channels)
    return build_model(ctx.task, "resnet110" if name == "auto" else name, pretrained=pretrained)


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
def fedkit_param_groups(client):
    """The contribution scores' own group: rate ``score_lr`` (scaled with the round's rate
    when the run has an lr schedule), no weight decay (it would pull them to uniform)."""
    if SCORES not in client.model.extras:
        return None
    base = client.config["lr"]
    if base <= 0:
        raise FedkitError(f"fedhelp.score_lr follows the lr schedule; lr is {base}")
    params = list(client.model.extras[SCORES].parameters())
    return [{"params": params, "lr_scale": score_lr(client) / base, "weight_decay": 0.0}]


def score_lr(client) -> float:
    """``fedhelp.score_lr``, or by default: with SGD, the rate at which one visit of a
    public sample moves its score row by ``SCORE_STEP`` times its per-sample gradient of the
    KL (a row's gradient is scaled by ``lambda_l * lambda_r / batch_size``; momentum ``mu``
    multiplies a step by ``1 / (1 - mu)``); with Adam/AdamW, whose steps do not scale with
    the gradient, :data:`ADAM_SCORE_LR`."""
    opts, cfg = client.options(), client.config
    if opts["score_lr"] is not None:
        return opts["score_lr"]
    if cfg["optimizer"] != "sgd":
        return ADAM_SCORE_LR
    weight = opts["lambda_l"] * opts["lambda_r"]
    if weight <= 0:  # no gradient reaches the scores
        return cfg["lr"]
    return SCORE_STEP * cfg["batch_size"] * (1.0 - min(cfg["momentum"], 0.99)) / weight


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
    """``lambda_l * R`` (eqs. 1, 3) on one public batch drawn with the client's round
    generator; the batch leaves the backbone's BatchNorm running statistics as they were
    (:mod:`fedkit_fedhelp.bnstats`)."""
    opts, model, priors = client.options(), client.model, client.priors
    public = priors["fedhelp.public"]
    index = torch.randint(len(public), (client.config["batch_size"],), generator=client.rng)
    x = client.data.normalizer(public[index].to(client.device))
    with running_stats_kept(model.backbone):
        logits = model.extras[SURROGATE](model.backbone(x))
    probs = priors["fedhelp.probs"][index].to(client.device).float()
    labels = priors["fedhelp.labels"][index].to(client.device).long()
    weight = _weights(client, labels) if client.task.kind == SEGMENTATION else None
    mixture = losses.api_mixture(model.extras[SCORES].logits[index.to(client.device)], probs)
    term = losses.public_term(logits, labels, mixture, opts["lambda_r"], opts["lambda_l"], weight)
    return {"fedhelp.public": term}


def _large_terms(client, batch, outputs) -> dict[str, torch.Tensor]:
    """Eq. 7 beside the proxy's task loss (the built-in ``task`` term): ``lambda_f KD_f``
    (trains the proxy only), the large model's task loss and ``lambda_b KD_b`` (train the
    large model only)."""
    opts = client.options()
    proxy, large = outputs["logits"], outputs[LARGE]
    top = opts["top_q"] or (3 if client.task.num_classes > 2 else 1)
    return {
        "fedhelp.kd_f": losses.forward_kd(large, proxy, opts["lambda_f"]),
        "fedhelp.large_task": client.task_loss(batch, {"logits": large}),
        "fedhelp.kd_b": opts["lambda_b"] * losses.ranking_loss(large, proxy, top),
    }


@hookimpl
def fedkit_eval_views(client):
    """``served``: the large model on large clients, the global small model on small ones
    (the built-in ``global`` view stays: the averaged small model on every client)."""
    return {SERVED: LARGE if is_large(client) else "logits"}


@hookimpl
def fedkit_client_view(client):
    return SERVED
